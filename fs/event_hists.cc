// Hist triggers on dynamic events (fs/hist_trigger.h): adding, pausing, clearing and
// removing them through an event's trigger file, the lines they add to it, the event's
// hist file, and what the event's probes are told (Tracer::set_hists).
//
// An event with a hist trigger runs its probes whether or not it is enabled: the
// kernel's soft mode (its enable file reads "0*" while it is not). While nothing but
// histograms keeps it running, its hits write no ring record.
#include <cerrno>

#include "fs/dynamic_events_impl.h"

namespace probefs::fs {

namespace {

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n'; }

size_t done(std::string_view data) { return data.size(); }

}  // namespace

void DynamicEvents::Impl::apply_hists(DynEvent& ev) {
  std::vector<events::HistProgram> programs;
  for (const HistTrigger& t : ev.hists) {
    events::HistProgram p = t.spec.program();
    p.slot = t.data->slot;
    if (t.filter) p.filter = *t.filter;
    programs.push_back(std::move(p));
  }
  // Only histograms keep it running: no records. Soft mode for enable_event targets keeps
  // recording (the gate decides what a reader sees; fs/event_triggers.h).
  const bool record = !(gate.soft_disabled(*ev.gate) && ev.soft_refs == 0);
  for (DynProbe* p : ev.probes) (void)tracer.set_hists(p->id, programs, record);
}

// The event's last hist trigger went: it leaves the soft mode they held it in.
void DynamicEvents::Impl::drop_hists(DynEvent& ev) {
  ev.hists.clear();
  apply_hists(ev);
  if (ev.soft_refs == 0 && gate.soft_disabled(*ev.gate)) {
    if (ev.registered) unregister_event(ev);
    gate.set_soft_disabled(*ev.gate, false);
  }
}

int64_t DynamicEvents::Impl::write_hist(DynEvent& ev, std::string_view data) {
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
    return t.spec.identity() == spec.identity();
  });
  if (spec.remove) {
    if (match == ev.hists.end()) return done(data);  // the kernel's answer too
    ev.hists.erase(match);
    if (ev.hists.empty()) drop_hists(ev);
    else apply_hists(ev);
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
      for (const auto& e : events)
        for (const HistTrigger& t : e->hists)
          if (t.data == shared) {
            owner = e.get();
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
  if (ev.hists.size() >= events::kHistMaxPerEvent) return -ENOSPC;
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
  ev.hists.push_back(std::move(t));
  // Soft mode: running, not recording, unless enabled (apply_hists first, so that the
  // first hits of a newly enabled probe already write nothing).
  if (!ev.registered) gate.set_soft_disabled(*ev.gate, true);
  apply_hists(ev);
  if (!ev.registered) {
    if (int err = register_event(ev); err != 0) {
      ev.hists.pop_back();
      if (ev.hists.empty()) drop_hists(ev);
      else apply_hists(ev);
      return err;
    }
  }
  return done(data);
}

// The gate's triggers (newest first), then the hist triggers in the order they came, as
// the kernel's list holds them.
std::string DynamicEvents::Impl::trigger_text(const DynEvent& ev) {
  std::string gate_text = gate.show(*ev.gate);
  if (ev.hists.empty()) return gate_text;
  if (gate_text == no_triggers_text()) gate_text.clear();
  for (const HistTrigger& t : ev.hists)
    gate_text += t.spec.text() + (t.data->paused ? " [paused]\n" : " [active]\n");
  return gate_text;
}

std::string DynamicEvents::Impl::hist_text(const DynEvent& ev) {
  std::string out;
  int n = 0;
  const std::vector<tracee::TargetInfo> targets = tracer.targets();
  HistSymbolizer sym = [&](uint64_t addr, bool with_offset, std::string* s) {
    for (const tracee::TargetInfo& ti : targets) {
      std::shared_ptr<tracee::TargetSymbolizer> ts = tracer.symbolizer(ti.pid);
      events::SymbolInfo info;
      if (!ts || !ts->lookup(addr, &info)) continue;
      *s = std::string(info.name);
      if (with_offset) {
        char tail[64];
        std::snprintf(tail, sizeof tail, "+0x%llx/0x%llx",
                      static_cast<unsigned long long>(info.offset),
                      static_cast<unsigned long long>(info.size));
        *s += tail;
      }
      return true;
    }
    return false;
  };
  for (const HistTrigger& t : ev.hists)
    out += format_hist(t.spec, t.data->paused, tracer.read_hist(t.data->slot), sym, n++);
  return out;
}

}  // namespace probefs::fs
