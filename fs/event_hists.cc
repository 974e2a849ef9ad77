// Hist triggers on dynamic events (fs/hist_trigger.h): adding, pausing, clearing and
// removing them through an event's trigger file, the lines they add to it, the event's
// hist file, and what the event's probes are told (Tracer::set_hists).
//
// An event with a hist trigger runs its probes whether or not it is enabled: the
// kernel's soft mode (its enable file reads "0*" while it is not). While nothing but
// histograms keeps it running, it is soft-disabled: its hits write no ring record.
#include <algorithm>
#include <cerrno>

#include "events/output.h"
#include "fs/dynamic_events_impl.h"

namespace probefs::fs {

namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n'; }

size_t done(std::string_view data) { return data.size(); }

}  // namespace

std::vector<events::HistProgram> DynamicEvents::Impl::hit_programs(const DynEvent& ev,
                                                                   int buffer) {
  std::vector<events::HistProgram> programs;
  for (const HistTrigger& t : ev.hists) {
    if (buffer >= 0 && t.buffer != static_cast<uint32_t>(buffer)) continue;
    events::HistProgram p = t.program;
    p.slot = t.data->slot;
    if (t.filter) p.filter = *t.filter;
    programs.push_back(std::move(p));
  }
  return programs;
}

void DynamicEvents::Impl::apply_hits(DynEvent& ev) {
  if (ev.marker) return;  // the daemon runs its own (marker_hit)
  std::vector<events::HistProgram> programs = hit_programs(ev, -1);
  if (ev.synthetic) {
    // Written by hist actions in the targets: its size, filter and histograms go with it.
    // Its soft state is the one of this moment (a trigger that switches it at a hit
    // reaches its records only at the next change here).
    tracee::Tracer::SynthSpec spec;
    spec.size = ev.compiled.program.fixed_size;
    spec.record = ev.registered && !soft_disabled(ev, 0);
    if (ev.filter) spec.filter = *ev.filter;
    spec.hists = std::move(programs);
    (void)tracer.set_synth(ev.id, std::move(spec));
    return;
  }
  std::vector<events::TriggerSpec> triggers;
  for (const Trigger& t : ev.triggers) {
    const bool targeted = t.kind == TriggerKind::kEnableEvent || t.kind == TriggerKind::kDisableEvent;
    if (targeted && !t.target) continue;  // its target went (drop_triggers)
    triggers.push_back(hit_trigger(t, targeted ? t.target->id : 0));
  }
  const uint32_t soft = soft_mask(ev);
  for (DynProbe* p : ev.probes) (void)tracer.set_hists(p->id, programs, triggers, soft);
}

bool DynamicEvents::Impl::slot_referenced(uint32_t slot, const HistTrigger* except) {
  for (const DynEvent* e : hist_events())
    for (const HistTrigger& t : e->hists) {
      if (&t == except) continue;
      for (uint32_t r = 0; r < t.program.nrefs; ++r)
        if (t.program.refs[r].slot == slot && t.data->slot != slot) return true;
    }
  return false;
}

bool DynamicEvents::Impl::synth_referenced(uint16_t event_id) {
  for (const DynEvent* e : hist_events())
    for (const HistTrigger& t : e->hists)
      if (t.program.action.synth_id == event_id) return true;
  return false;
}

int DynamicEvents::Impl::compile_hist(const DynEvent& ev, const HistSpec& spec,
                                      const std::string& command, events::HistProgram* out,
                                      events::Diagnostic* d) {
  auto fail = [&](events::ErrorCode code, std::string_view at) {
    const size_t pos = at.empty() ? std::string::npos : command.find(at);
    *d = hist_diagnostic(code, command, pos == std::string::npos ? 0 : static_cast<int>(pos),
                         ev.group, ev.name);
    return -d->err;
  };
  events::HistProgram p = spec.program();
  const events::HistGeometry own = spec.geometry();
  // $VAR: a variable of this histogram defined before (kVar), else one of another
  // event's histogram of the same key layout (a reference, read once).
  auto resolve = [&](const HistField& f, size_t defined, events::HistOperand* o) -> int {
    *o = hist_operand(f);
    if (f.var.empty()) return 0;
    const std::string& name = f.var;
    if (name.find('.') == std::string::npos)
      for (size_t v = 0; v < defined; ++v)
        if (spec.vars[v].name == name) {
          o->source = events::HistSource::kVar;
          o->offset = static_cast<uint32_t>(v);
          return 0;
        }
    // SYSTEM.EVENT.VAR names one event's; a bare name must be unique among the others.
    std::string system, event, var = name;
    if (const size_t dot = name.rfind('.'); dot != std::string::npos) {
      var = name.substr(dot + 1);
      const std::string se = name.substr(0, dot);
      const size_t d1 = se.find('.');
      if (d1 == std::string::npos) return fail(events::ErrorCode::kHistVarNotFound, "$" + name);
      system = se.substr(0, d1);
      event = se.substr(d1 + 1);
    }
    const HistTrigger* found = nullptr;
    uint32_t index = 0;
    int matches = 0;
    // A bare name is another event's, or this one's other histograms' when this event is
    // the one an onmatch() names (the kernel's find_match_var); a qualified name that
    // event's.
    bool self_matched = false;
    for (const HistHandlerDef& m : spec.actions)
      if (m.handler == HistHandler::kMatch && m.system == ev.group && m.event == ev.name)
        self_matched = true;
    for (const DynEvent* e : hist_events()) {
      if (system.empty() ? (e == &ev && !self_matched) : (e->group != system || e->name != event))
        continue;
      for (const HistTrigger& t : e->hists)
        for (size_t v = 0; v < t.spec.vars.size(); ++v)
          if (t.spec.vars[v].name == var) {
            ++matches;
            found = &t;
            index = static_cast<uint32_t>(v);
          }
    }
    if (matches == 0) return fail(events::ErrorCode::kHistVarNotFound, "$" + name);
    if (matches > 1) return fail(events::ErrorCode::kHistVarNotUnique, "$" + name);
    const events::HistGeometry g = found->spec.geometry();
    if (g.key_bytes != own.key_bytes) return fail(events::ErrorCode::kHistCreateFail, "$" + name);
    uint32_t r = 0;
    while (r < p.nrefs && !(p.refs[r].slot == found->data->slot && p.refs[r].var == index)) ++r;
    if (r == p.nrefs) {
      if (p.nrefs == events::kHistMaxVarRefs) return fail(events::ErrorCode::kHistTooManyVars, "$" + name);
      p.refs[r].slot = found->data->slot;
      p.refs[r].var = index;
      p.refs[r].geometry = g;
      ++p.nrefs;
    }
    o->source = events::HistSource::kVarRef;
    o->offset = r;
    return 0;
  };
  // A variable's name is the event's: no two histograms of one event define it.
  for (const HistVarDef& def : spec.vars)
    for (const HistTrigger& t : ev.hists)
      for (const HistVarDef& o : t.spec.vars)
        if (o.name == def.name) return fail(events::ErrorCode::kHistDuplicateVar, def.name);
  p.nvars = static_cast<uint32_t>(spec.vars.size());
  for (size_t v = 0; v < spec.vars.size(); ++v) {
    const HistVarDef& def = spec.vars[v];
    if (int rc = resolve(def.a, v, &p.vars[v].a); rc != 0) return rc;
    if (def.op) {
      if (int rc = resolve(def.b, v, &p.vars[v].b); rc != 0) return rc;
      p.vars[v].op = def.op == '+'   ? events::HistOp::kAdd
                     : def.op == '-' ? events::HistOp::kSub
                     : def.op == '*' ? events::HistOp::kMul
                                     : events::HistOp::kDiv;
    }
  }
  for (const HistHandlerDef& m : spec.actions) {
    if (m.save) continue;  // program() has the saved fields
    if (m.handler == HistHandler::kMatch && !find_hist_event(m.system, m.event))
      return fail(events::ErrorCode::kHistInvalidSubsysEvent, m.system + "." + m.event);
    const DynEvent* se = find_event(events::kSynthSystem, m.synth);
    if (!se || !se->synthetic) return fail(events::ErrorCode::kHistSynthEventNotFound, m.synth);
    if (m.params.size() != se->synth.fields.size())
      return fail(events::ErrorCode::kHistSynthCountMismatch, "");
    p.action.synth_id = se->id;
    p.action.nparams = static_cast<uint32_t>(m.params.size());
    for (size_t i = 0; i < m.params.size(); ++i) {
      const events::SynthField& sf = se->synth.fields[i];
      if (sf.is_string || sf.is_stack) return fail(events::ErrorCode::kHistSynthTypeMismatch, m.params[i]);
      // PARAM: $VAR, FIELD, or either qualified by SYSTEM.EVENT. (as the kernel's
      // trace_action_create splits it): a qualified variable is that event's, this one's
      // included; a qualified field must be this event's.
      HistField f;
      std::string_view param = m.params[i], system, event;
      if (const size_t d1 = param.find('.'); d1 != std::string_view::npos) {
        const size_t d2 = param.find('.', d1 + 1);
        if (d2 == std::string_view::npos) return fail(events::ErrorCode::kSilent, "");
        system = param.substr(0, d1);
        event = param.substr(d1 + 1, d2 - d1 - 1);
        param = param.substr(d2 + 1);
      }
      if (!param.empty() && param[0] == '$') {
        f.var = system.empty() ? std::string(param.substr(1))
                               : std::string(system) + "." + std::string(event) + "." +
                                     std::string(param.substr(1));
        f.name = m.params[i];
      } else if ((!system.empty() && (system != ev.group || event != ev.name)) ||
                 !hist_find_field(ev.compiled, param, &f) || f.is_string) {
        return fail(events::ErrorCode::kHistParamNotFound, param);
      }
      if (int rc = resolve(f, spec.vars.size(), &p.action.params[i]); rc != 0) return rc;
      p.action.param_offset[i] = sf.offset;
      p.action.param_size[i] = static_cast<uint8_t>(sf.size);
    }
  }
  *out = std::move(p);
  return 0;
}

// A hist trigger of `buffer` went: with the last, the event leaves the soft mode they held
// it in there, unless other triggers hold it. (The bit is clear outside soft mode: set
// here means it was soft-disabled.)
void DynamicEvents::Impl::hists_gone(DynEvent& ev, uint32_t buffer) {
  if (!ev.marker && !soft_mode(ev, buffer)) {
    if (tracer.soft_disabled(ev.id, buffer)) turn_off(ev, buffer);
    tracer.set_soft_disabled(ev.id, false, buffer);
  }
  apply_hits(ev);
}

int64_t DynamicEvents::Impl::write_hist(DynEvent& ev, std::string_view data, uint32_t buffer) {
  HistSpec spec;
  events::Diagnostic d;
  std::lock_guard l(mu);
  if (ev.removed) return -ENODEV;
  if (int rc = parse_hist(data, ev.compiled, ev.group, ev.name, &spec, &d); rc != 0) {
    if (d.logged()) error_log.add(d);
    return rc;
  }
  std::shared_ptr<const events::CompiledFilter> filter;
  if (spec.has_filter)
    if (int err = compile_trigger_filter(ev, spec.filter, &filter); err != 0) return err;
  const std::string command = "hist:" + std::string([&] {
    std::string_view s = data;
    while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
    const size_t at = s.find_first_of(": \t");
    s = at == std::string_view::npos ? std::string_view{} : s.substr(at + 1);
    while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
    return s;
  }());
  auto match = std::find_if(ev.hists.begin(), ev.hists.end(), [&](const HistTrigger& t) {
    return t.buffer == buffer && t.spec.identity() == spec.identity();
  });
  if (spec.remove) {
    if (match == ev.hists.end()) return done(data);  // the kernel's answer too
    // Another histogram reads its variables: it stays until that one goes.
    if (match->data.use_count() == 1 && slot_referenced(match->data->slot, &*match))
      return -EBUSY;
    ev.hists.erase(match);
    hists_gone(ev, buffer);
    update_marker_armed();
    return done(data);
  }
  if (match != ev.hists.end()) {
    if (!spec.pause && !spec.cont && !spec.clear) {
      error_log.add(hist_diagnostic(events::ErrorCode::kHistTriggerExists, command, 0, ev.group,
                                    ev.name));
      return -EEXIST;
    }
    HistData& hd = *match->data;
    if (spec.pause) hd.paused = true;
    else if (spec.cont) hd.paused = false;
    if (spec.pause || spec.cont) tracer.pause_hist(hd.slot, hd.paused);
    if (spec.clear) tracer.clear_hist(hd.slot);
    return done(data);
  }
  // A named histogram: the one of that name, if its keys, values and sort agree.
  std::shared_ptr<HistData> shared;
  if (!spec.name.empty()) {
    auto it = named_hists.find(spec.name);
    if (it != named_hists.end()) shared = it->second.lock();
    if (shared) {
      const DynEvent* owner = nullptr;
      const HistTrigger* other = nullptr;
      for (DynEvent* e : hist_events())
        for (const HistTrigger& t : e->hists)
          if (t.data == shared) {
            owner = e;
            other = &t;
          }
      auto body = [](const HistSpec& s) {
        std::string id = s.identity();
        const size_t f = s.has_filter ? id.rfind(" if " + s.filter) : std::string::npos;
        return f == std::string::npos ? id : id.substr(0, f);
      };
      if (owner == nullptr || body(other->spec) != body(spec) ||
          other->spec.geometry().signature() != spec.geometry().signature()) {
        error_log.add(hist_diagnostic(events::ErrorCode::kHistNamedMismatch, command,
                                      static_cast<int>(command.find("name=" + spec.name)),
                                      ev.group, ev.name));
        return -EINVAL;
      }
    }
  }
  if (spec.cont || spec.clear) {
    error_log.add(hist_diagnostic(events::ErrorCode::kHistTriggerEnoentClear, command, 0,
                                  ev.group, ev.name));
    return -ENOENT;
  }
  if (std::count_if(ev.hists.begin(), ev.hists.end(), [&](const HistTrigger& t) {
        return t.buffer == buffer;
      }) >= events::kHistMaxPerEvent)
    return -ENOSPC;
  events::HistProgram program;
  if (int rc = compile_hist(ev, spec, command, &program, &d); rc != 0) {
    if (d.logged()) error_log.add(d);
    return rc;
  }
  if (!shared) {
    uint32_t slot = 0;
    if (int rc = tracer.create_hist(spec.geometry(), &slot); rc != 0) return rc;
    shared = std::make_shared<HistData>();
    shared->tracer = &tracer;
    shared->slot = slot;
    shared->name = spec.name;
    shared->paused = spec.pause;
    if (spec.pause) tracer.pause_hist(slot, true);
    if (!spec.name.empty()) named_hists[spec.name] = shared;
  }
  HistTrigger t;
  t.spec = std::move(spec);
  t.data = std::move(shared);
  t.filter = std::move(filter);
  t.program = std::move(program);
  t.buffer = buffer;
  ev.hists.push_back(std::move(t));
  if (ev.marker) {
    update_marker_armed();
    return done(data);
  }
  // Soft mode: running, not recording, unless enabled (apply_hists first, so that the
  // first hits of a newly enabled probe already write nothing).
  const bool was_on = enabled_in(ev, buffer);
  if (!was_on) tracer.set_soft_disabled(ev.id, true, buffer);
  apply_hits(ev);
  if (!was_on) {
    if (int err = turn_on(ev, buffer); err != 0) {
      ev.hists.pop_back();
      hists_gone(ev, buffer);
      return err;
    }
  }
  return done(data);
}

// The other triggers (newest first), then the hist triggers in the order they came, as
// the kernel's list holds them.
std::string DynamicEvents::Impl::trigger_text(const DynEvent& ev, uint32_t buffer) {
  std::string text;
  for (const Trigger& t : ev.triggers)
    if (t.buffer == buffer) text += trigger_line(t, tracer.trigger_count(t.count_slot));
  for (const HistTrigger& t : ev.hists)
    if (t.buffer == buffer)
      text += t.spec.text() + (t.data->paused ? " [paused]\n" : " [active]\n");
  if (text.empty()) return std::string(no_triggers_text(ev.marker));
  return text;
}

std::string DynamicEvents::Impl::hist_text(const DynEvent& ev, uint32_t buffer) {
  std::string out;
  int n = 0;
  // The targets' and, for entries a departed one left, the ones kept after it.
  const std::vector<std::shared_ptr<tracee::TargetSymbolizer>> all = tracer.symbolizers();
  HistSymbolizer sym = [&](uint64_t addr, bool with_offset, std::string* s) {
    for (const std::shared_ptr<tracee::TargetSymbolizer>& ts : all) {
      events::SymbolInfo info;
      if (!ts || !ts->lookup(addr, &info)) continue;
      s->clear();
      info.note = {};
      if (with_offset) events::format_symbol(*s, info);  // %pS, the object as a module
      else *s = std::string(info.name);
      return true;
    }
    return false;
  };
  for (const HistTrigger& t : ev.hists)
    if (t.buffer == buffer)
      out += format_hist(t.spec, t.data->paused, tracer.read_hist(t.data->slot), sym, n++);
  return out;
}

}  // namespace probefs::fs
