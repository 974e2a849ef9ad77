// The placement room: the probes (definitions), where each is placed in each target
// (sites, notes), building a target's DEFINEs, and the operations fanned out to every
// target that holds a probe or to every target at all: define, remove, enable, disable,
// filter, arm, optimization, kprobes/list, the blacklist, profiles.
//
// Locks (tracee/tracer_impl.h): mu guards the probes, slots, agent ids, the switches, and
// each target's sites and notes (the targets room shares it). A new site's event is
// allowed in the target's area (allow_event) and counts are read under read_mu, taken
// after mu.

#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <tuple>

#include "events/parse.h"
#include "events/sdt_args.h"
#include "tracee/proc_info.h"
#include "tracee/tracer_impl.h"

namespace probefs::tracee {

// The kernel's error_log entry for a probe the engine refused (trace_kprobe_create's
// handling of register_kprobe's result), positioned at the place (argument 1).
events::Diagnostic registration_diagnostic(const events::ProbeDefinition& def, int err) {
  events::Diagnostic d;
  switch (-err) {
    case EILSEQ:
      return events::make_diagnostic(def, events::ErrorCode::kBadInsnBndry, 1, 0);
    case ENOENT:
      return events::make_diagnostic(def, events::ErrorCode::kBadProbeAddr, 1, 0, ENOENT);
    case ENOMEM:
    case EEXIST:
      d.code = events::ErrorCode::kSilent;
      d.err = -err;
      d.command = def.command();
      return d;
    default:
      return events::make_diagnostic(def, events::ErrorCode::kFailRegProbe, 1, 0,
                                     err < 0 ? -err : EINVAL);
  }
}

namespace {

// kprobes/list of one target: the agent's lines (probecore's, the kernel's columns), each
// followed by its probe's note where it has one. The agent lists the probes of one
// address in the order they were defined there, which is the order of their agent ids;
// `notes` are (address, 'k' or 'r', agent id, note) of the target's probes.
std::string list_with_notes(const std::string& list,
                            std::vector<std::tuple<uintptr_t, char, uint32_t, std::string>> notes) {
  if (notes.empty()) return list;
  std::sort(notes.begin(), notes.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  std::map<std::pair<uintptr_t, char>, size_t> next;  // the next entry of each address
  for (size_t i = notes.size(); i-- > 0;) next[{std::get<0>(notes[i]), std::get<1>(notes[i])}] = i;
  std::string out;
  for (size_t at = 0; at < list.size();) {
    size_t nl = list.find('\n', at);
    if (nl == std::string::npos) nl = list.size();
    const std::string line = list.substr(at, nl - at);
    at = nl + 1;
    out += line;
    unsigned long addr = 0;
    char type = 0;
    if (sscanf(line.c_str(), "%lx  %c", &addr, &type) == 2) {
      auto it = next.find({addr, type});
      if (it != next.end() && it->second < notes.size() &&
          std::get<0>(notes[it->second]) == addr && std::get<1>(notes[it->second]) == type) {
        const std::string& note = std::get<3>(notes[it->second]);
        if (!note.empty()) out += " (" + note + ")";
        ++it->second;
      }
    }
    out += '\n';
  }
  return out;
}

// A blacklist range's name, as the kernel's %ps names its start: the symbol there, with
// " [module]" for a library (the kernel's modules); the object alone where no symbol
// covers it (a stripped library's local code); the address where nothing is known.
std::string blacklist_name(const ProcessSymbols& syms, uintptr_t start) {
  ResolvedSymbol rs;
  std::string module;
  if (syms.describe(start, &rs) == 0) {
    if (!rs.name.empty()) return rs.module.empty() ? rs.name : rs.name + " [" + rs.module + "]";
    module = rs.module;
  }
  for (const MappedObject& o : syms.objects())
    if (module.empty() && !o.executable && o.start <= start && start < o.end) module = o.module;
  if (!module.empty()) return "[" + module + "]";
  char hex[32];
  snprintf(hex, sizeof hex, "0x%lx", static_cast<unsigned long>(start));
  return hex;
}

// The fetch program of a definition on a USDT point at one of its places: $argN read
// from the note's operand N there. False, with the error of the first argument the note
// cannot give (past its last operand, or one no fetch can read: a %rip-relative symbol),
// at that argument.
bool compile_sdt_place(const events::ProbeDefinition& def, const ProbePlace& place,
                       const events::DataSymbolResolver& resolve, events::CompiledEvent* out,
                       events::Diagnostic* diag) {
  events::ProbeDefinition bound = def;
  std::vector<events::SdtOperand> operands;
  size_t unreadable = 0;
  const bool all = events::parse_sdt_args(place.sdt_args, &operands, &unreadable);
  size_t bad = 0;
  events::ErrorCode why = events::ErrorCode::kBadArgNum;
  if (!events::bind_sdt_args(&bound, operands, &bad, &why)) {
    if (!all && why == events::ErrorCode::kBadArgNum) why = events::ErrorCode::kSdtArgUnreadable;
    // At the argument's $argN, as the parser points at one it refuses.
    const size_t index = bad + 2;
    const size_t at = index < def.argv.size() ? def.argv[index].find("$arg") : std::string::npos;
    *diag = events::make_diagnostic(def, why, static_cast<int>(index),
                                    at == std::string::npos ? 0 : static_cast<int>(at));
    return false;
  }
  return events::compile(bound, resolve, out, diag);
}

}  // namespace

// The DEFINE messages of probe p in target t, one per place. kError fills *diag.
PlaceStatus Tracer::Impl::build_defines(Target& t, const Probe& p,
                                        std::vector<lk::Define>* out, events::Diagnostic* diag) {
  std::vector<ProbePlace> places;
  PlaceStatus st = place_probe(p.spec.def, p.file, t.maps, *t.syms, &places, diag);
  if (st != PlaceStatus::kPlaced) return st;
  const events::CompiledEvent* ev = &p.spec.compiled;
  events::CompiledEvent own;
  const ProcessSymbols* syms = t.syms.get();
  // `@SYM`: a variable or a function of this target, as the kernel finds kernel data.
  const events::DataSymbolResolver resolve = [syms](std::string_view sym, uint64_t* addr) {
    return syms->resolve_data(sym, addr) == 0;
  };
  if (p.per_target_compile && !p.spec.def.on_sdt()) {
    if (!events::compile(p.spec.def, resolve, &own, diag)) return PlaceStatus::kError;
    ev = &own;
  }
  for (const ProbePlace& place : places) {
    if (p.spec.def.on_sdt()) {
      // $argN is the note's operand N at this place: each place compiles its own.
      if (!compile_sdt_place(p.spec.def, place, resolve, &own, diag)) return PlaceStatus::kError;
      ev = &own;
    }
    PlaceLabel label{place.symbol, place.symbol_offset, place.note};
    events::SymbolInfo named;
    if (!label.name.empty() && t.symbolizer && t.symbolizer->lookup(place.addr, &named) &&
        named.name == label.name)
      label.name.clear();
    set_label(t, p, place.addr, label);
    lk::Define d;
    d.counter_slot = p.slot;
    d.event_id = p.spec.event_id;
    d.kind = p.spec.def.is_return ? lk::ProbeKind::kReturn : lk::ProbeKind::kEntry;
    d.enabled = p.spec.enabled;
    d.maxactive = static_cast<uint32_t>(p.spec.def.maxactive);
    d.address = place.addr;
    d.bounds.start = place.bounds.start;
    d.bounds.end = place.bounds.end;
    for (uintptr_t pad : place.bounds.landing_pads) d.bounds.landing_pads.push_back(pad);
    d.bounds.related = place.bounds.related;
    d.symbol = place.symbol;
    d.symbol_addr = place.symbol.empty() ? 0 : place.addr - place.symbol_offset;
    d.module = place.module;
    d.program = ev->program;
    if (p.spec.filter) d.filter = *p.spec.filter;
    d.ref_ctr = place.ref_ctr;
    out->push_back(std::move(d));
  }
  return PlaceStatus::kPlaced;
}

// Sends the defines; on the first failure removes what this call placed in t. 0 or the
// agent's negative errno.
int Tracer::Impl::send_defines(Target& t, ProbeId id, uint16_t event_id,
                               std::vector<lk::Define>& defs) {
  // Allowed before the first DEFINE goes: its probe may fire before the reply comes.
  if (!defs.empty()) allow_event(t, event_id);
  std::vector<Site> placed;
  for (lk::Define& d : defs) {
    d.probe_id = next_agent_id++;
    LinkResult r = t.link->define(d);
    if (!r.ok()) {
      for (const Site& s : placed) (void)t.link->remove(s.agent_id);
      return r.error;
    }
    placed.push_back({d.probe_id, d.address});
  }
  auto& v = t.sites[id];
  v.insert(v.end(), placed.begin(), placed.end());
  return 0;
}

// Starts the REMOVE of each of t's sites of probe `id` in `fan` (its caller collects)
// and forgets them. mu held.
void Tracer::Impl::remove_sites(FanOut& fan, Target& t, ProbeId id) {
  auto it = t.sites.find(id);
  if (it == t.sites.end()) return;
  for (const Site& s : it->second) {
    if (t.link && !t.link->closed())
      fan.start(t.link, lk::MsgType::kRemove, lk::ProbeRef{s.agent_id});
    t.hist_sent.erase(s.agent_id);
  }
  t.sites.erase(it);
  if (auto p = probes.find(id); p != probes.end()) forget_notes(t, id, p->second.spec.event_id);
}

// Drops the notes of probe `id` (of event `event_id`) in t. mu held.
void Tracer::Impl::forget_notes(Target& t, ProbeId id, uint16_t event_id) {
  for (auto n = t.notes.lower_bound({id, 0}); n != t.notes.end() && n->first.first == id;) {
    if (t.symbolizer) t.symbolizer->set_label(n->first.second, event_id, {});
    n = t.notes.erase(n);
  }
}

// Keeps the label of probe p's place at addr in t (none: an empty one), for kprobes/list
// and trace lines. mu held.
void Tracer::Impl::set_label(Target& t, const Probe& p, uintptr_t addr, const PlaceLabel& label) {
  if (label.empty()) t.notes.erase({p.id, addr});
  else t.notes[{p.id, addr}] = label;
  if (t.symbolizer) t.symbolizer->set_label(addr, p.spec.event_id, label);
}

// Places every probe not yet placed in t (a new target, or objects mapped since).
// Failures in one target leave the probe out of it (the definition stands elsewhere).
void Tracer::Impl::place_pending(Target& t, std::vector<lk::Define>* collect,
                                 std::vector<ProbeId>* collect_ids) {
  for (auto& [id, p] : probes) {
    if (t.sites.count(id)) continue;
    std::vector<lk::Define> defs;
    events::Diagnostic diag;
    const PlaceStatus st = build_defines(t, p, &defs, &diag);
    if (st == PlaceStatus::kError) note_not_placed(t, id, diag);
    if (st != PlaceStatus::kPlaced) continue;
    if (collect) {
      for (auto& d : defs) {
        d.probe_id = next_agent_id++;
        collect_ids->push_back(id);
        collect->push_back(std::move(d));
      }
    } else if (int err = send_defines(t, id, p.spec.event_id, defs); err != 0) {
      note_not_placed(t, id, registration_diagnostic(p.spec.def, err));
    }
  }
}

// place_pending for a target that waits for GO: every DEFINE goes out at once and the
// replies are collected after (one round trip, not one per place), `before` (the requests
// sent ahead of them: its error is returned, and then nothing is placed) first. A probe one
// of whose places failed leaves the target, as send_defines does it. mu held.
//
// A process that starts (launched, exec'd or attached; a fork child has its parent's) is
// first handed the branch tables of the objects its probes go into, and of libc, which
// the agent's guards go into (arch/branch_targets.h).
int Tracer::Impl::place_all_pending(Target& t, const std::function<int()>& before) {
  std::vector<lk::Define> defs;
  std::vector<ProbeId> ids;
  place_pending(t, &defs, &ids);
  std::vector<AgentLink::Ticket> tables;
  start_branch_tables(t, defs, &tables);
  // Allowed before the DEFINEs go: their probes may fire before the replies come.
  for (const lk::Define& d : defs) allow_event(t, d.event_id);
  std::vector<AgentLink::Ticket> tickets;
  tickets.reserve(defs.size());
  for (const lk::Define& d : defs) tickets.push_back(t.link->start(lk::MsgType::kDefine, d));
  // The requests sent before these (SETUP) answered first.
  const int err = before ? before() : 0;
  for (const AgentLink::Ticket& k : tables)
    (void)t.link->collect(k, std::chrono::steady_clock::time_point::max());
  if (defs.empty() || err != 0) {
    for (const AgentLink::Ticket& k : tickets)
      (void)t.link->collect(k, std::chrono::steady_clock::time_point::max());
    return err;
  }
  std::vector<bool> ok(defs.size());
  std::set<ProbeId> failed;
  for (size_t i = 0; i < defs.size(); ++i) {
    const LinkResult r = t.link->collect(tickets[i], std::chrono::steady_clock::time_point::max());
    ok[i] = r.ok();
    if (ok[i] || !failed.insert(ids[i]).second) continue;
    if (auto p = probes.find(ids[i]); p != probes.end() && !t.link->closed())
      note_not_placed(t, ids[i], registration_diagnostic(p->second.spec.def, r.error));
  }
  for (size_t i = 0; i < defs.size(); ++i) {
    if (!ok[i]) continue;
    if (failed.count(ids[i])) (void)t.link->remove(defs[i].probe_id);
    else t.sites[ids[i]].push_back({defs[i].probe_id, defs[i].address});
  }
  for (ProbeId id : failed)
    if (auto p = probes.find(id); p != probes.end()) forget_notes(t, id, p->second.spec.event_id);
  return 0;
}

void Tracer::Impl::start_branch_tables(Target& t, const std::vector<lk::Define>& defs,
                                       std::vector<AgentLink::Ticket>* tickets) {
  const lk::Hello& hello = t.link->hello();
  if (hello.abi_version < 3 || hello.reason == lk::HelloReason::kFork) return;
  auto is_libc = [](const std::string& path) {
    const size_t slash = path.rfind('/');
    return path.compare(slash == std::string::npos ? 0 : slash + 1, 7, "libc.so") == 0;
  };
  std::set<size_t> wanted;  // indexes into t.maps
  for (size_t i = 0; i < t.maps.size(); ++i) {
    const Mapping& m = t.maps[i];
    if (!m.exec || m.deleted) continue;
    bool used = is_libc(m.path);
    for (size_t d = 0; d < defs.size() && !used; ++d)
      used = m.start <= defs[d].address && defs[d].address < m.end;
    if (used) wanted.insert(i);
  }
  for (size_t i : wanted) {
    const Mapping& m = t.maps[i];
    const int fd = branch_tables.fd_for(t.pid, m);
    if (fd < 0) continue;  // the agent sweeps that mapping itself
    lk::Branches b;
    b.dev_major = major(m.dev);
    b.dev_minor = minor(m.dev);
    b.inode = m.inode;
    b.offset = m.offset;
    b.length = m.end - m.start;
    tickets->push_back(t.link->start_table(lk::MsgType::kBranches, b, fd));
    ::close(fd);
  }
}

// A fork child's code carries the probes its parent had at the fork, under the same
// ids. What the child really has is what it reports (PROFILE lists every probe it
// holds): those the daemon still knows stay, the others (removed from the parent since,
// or of a parent no longer traced) are removed; place_pending adds the ones defined
// since. mu held.
void Tracer::Impl::adopt_inherited_probes(Target& child, const Target* parent) {
  // What the child holds: its HELLO says (its parent's agent's probes when it forked);
  // a child with none listed, or too many to list, is asked.
  std::set<uint32_t> held;
  const std::vector<uint32_t>& said = child.link->hello().probe_ids;
  if (!said.empty()) {
    held.insert(said.begin(), said.end());
  } else {
    LinkResult r = child.link->profile();
    if (!r.ok()) return;
    for (const auto& e : r.profile) held.insert(e.probe_id);
  }
  held.erase(0);
  if (parent != nullptr) {
    for (const auto& [id, sites] : parent->sites) {
      if (!probes.count(id)) continue;
      for (const Site& s : sites) {
        if (!held.erase(s.agent_id)) continue;
        child.sites[id].push_back(s);
        // Its symbolizer, made with its symbols, takes these over (set_up).
        if (auto n = parent->notes.find({id, s.addr}); n != parent->notes.end())
          child.notes[n->first] = n->second;
      }
    }
  }
  // Probes removed from the parent while it forked. Only ids this daemon gave out are
  // asked about (the list is the child's word), all at once.
  std::vector<AgentLink::Ticket> removes;
  for (uint32_t stale : held)
    if (stale < next_agent_id)
      removes.push_back(child.link->start(lk::MsgType::kRemove, lk::ProbeRef{stale}));
  for (const AgentLink::Ticket& r : removes)
    (void)child.link->collect(r, std::chrono::steady_clock::time_point::max());
}

// After dlclose: the probes of objects no longer mapped are the engine's [GONE]; they
// are removed, so that the object's next load gets them again. mu held.
void Tracer::Impl::forget_unmapped_sites(Target& t) {
  auto mapped = [&](uintptr_t a) {
    for (const Mapping& m : t.maps)
      if (m.exec && m.start <= a && a < m.end) return true;
    return false;
  };
  for (auto it = t.sites.begin(); it != t.sites.end();) {
    auto& v = it->second;
    for (auto s = v.begin(); s != v.end();) {
      if (mapped(s->addr)) {
        ++s;
        continue;
      }
      (void)t.link->remove(s->agent_id);
      if (auto p = probes.find(it->first); p != probes.end()) set_label(t, p->second, s->addr, {});
      s = v.erase(s);
    }
    it = v.empty() ? t.sites.erase(it) : std::next(it);
  }
}

int Tracer::define_probe(const ProbeSpec& spec, ProbeId* id, events::Diagnostic* diag) {
  std::lock_guard lock(impl_->mu);
  Impl::Probe p;
  p.spec = spec;
  if ((spec.buffers & ~(lk::kInstanceBuffers | 1u)) != 0) return -EINVAL;
  // Records elsewhere than the top level's buffer alone: SET_HIST says so (sync_hists).
  if (spec.buffers != 1 || !spec.instance_filters.empty()) p.hist_generation = 1;
  if (spec.def.syntax == events::ProbeSyntax::kUprobe) {
    if (identify_file(spec.def.path, &p.file) != 0) {
      *diag = events::make_diagnostic(spec.def, events::ErrorCode::kFileNotFound, 1, 0);
      return -diag->err;
    }
  }
  for (const events::ProbeArg& a : spec.def.args)
    if (!a.symbol.empty()) p.per_target_compile = true;
  if (!impl_->free_slots.empty()) {
    p.slot = impl_->free_slots.back();
    impl_->free_slots.pop_back();
  } else if (impl_->next_slot < kProbeSlots) {
    p.slot = impl_->next_slot++;
  } else {
    diag->err = ENOSPC;
    diag->code = events::ErrorCode::kSilent;
    return -ENOSPC;
  }
  p.id = impl_->next_probe++;
  {
    std::lock_guard rl(impl_->read_mu);
    for (auto& r : impl_->rings) r->reader.reset_counters(p.slot);
  }

  // Where it goes, in every target, before anything is sent: a definition that does not
  // compile in one target, or a symbol no target has, costs no round trip at all.
  bool absent_everywhere = true;  // no target at all included
  std::vector<std::pair<Impl::Target*, std::vector<lk::Define>>> plan;
  int err = 0;
  for (auto& [pid, t] : impl_->targets) {
    if (!t->link || t->link->closed()) continue;
    std::vector<lk::Define> defs;
    events::Diagnostic d;
    PlaceStatus st = impl_->build_defines(*t, p, &defs, &d);
    if (st == PlaceStatus::kError) {
      *diag = d;
      err = -d.err;
      break;
    }
    if (st != PlaceStatus::kAbsent) absent_everywhere = false;
    if (st != PlaceStatus::kPlaced) continue;
    plan.emplace_back(t.get(), std::move(defs));
  }
  if (err == 0 && absent_everywhere && spec.def.syntax == events::ProbeSyntax::kKprobe &&
      spec.def.on_symbol() && spec.def.module.empty()) {
    // A symbol no target has: the kernel's failed registration of an unknown symbol.
    *diag = events::make_diagnostic(spec.def, events::ErrorCode::kBadProbeAddr, 1, 0, ENOENT);
    err = -ENOENT;
  }
  // Every target's DEFINEs at once, then every reply. The first refusal (in target
  // order) is the answer; then what the others placed is removed again. A target whose
  // link ended meanwhile (it exited or exec'd) refuses nothing.
  struct Placed {
    Impl::Target* t;
    Impl::Site site;
  };
  std::vector<Placed> placed;
  if (err == 0 && !plan.empty()) {
    FanOut fan;
    for (auto& [t, defs] : plan) {
      // Allowed before the first DEFINE goes: its probe may fire before the reply comes.
      if (!defs.empty()) impl_->allow_event(*t, p.spec.event_id);
      for (lk::Define& d : defs) {
        d.probe_id = impl_->next_agent_id++;
        placed.push_back({t, {d.probe_id, d.address}});
        fan.start(t->link, lk::MsgType::kDefine, std::move(d));
      }
    }
    const std::vector<LinkResult> rs = fan.collect();
    if (int e = FanOut::first_error(rs, true); e != 0) {
      *diag = registration_diagnostic(spec.def, e);
      err = e;
    }
    std::vector<Placed> ok;  // deferred ones too: a stopped target takes them later
    for (size_t i = 0; i < placed.size(); ++i)
      if (rs[i].ok()) ok.push_back(placed[i]);
    placed = std::move(ok);
  }
  if (err != 0) {
    FanOut undo;
    for (const Placed& x : placed)
      if (!x.t->link->closed())
        undo.start(x.t->link, lk::MsgType::kRemove, lk::ProbeRef{x.site.agent_id});
    (void)undo.collect();
    for (auto& [pid, t] : impl_->targets) impl_->forget_notes(*t, p.id, p.spec.event_id);
    impl_->free_slots.push_back(p.slot);
    return err;
  }
  for (const Placed& x : placed) x.t->sites[p.id].push_back(x.site);
  *id = p.id;
  impl_->probes.emplace(p.id, std::move(p));
  return 0;
}

int Tracer::remove_probe(ProbeId id) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->probes.find(id);
  if (it == impl_->probes.end()) return -ENOENT;
  FanOut fan;
  for (auto& [pid, t] : impl_->targets) impl_->remove_sites(fan, *t, id);
  (void)fan.collect();  // what a target could not remove dies with its link
  impl_->free_slots.push_back(it->second.slot);
  impl_->probes.erase(it);
  return 0;
}

namespace {

// Request `type`, with the body body_of(agent id) makes, to every site of probe `id` in
// every target, all at once (FanOut): the first failure, a link that closed meanwhile
// aside, or 0. mu held.
template <class BodyOf>
int for_each_site(Tracer::Impl& impl, ProbeId id, lk::MsgType type, BodyOf body_of) {
  FanOut fan;
  for (auto& [pid, t] : impl.targets) {
    auto s = t->sites.find(id);
    if (s == t->sites.end() || !t->link || t->link->closed()) continue;
    for (const auto& site : s->second) fan.start(t->link, type, body_of(site.agent_id));
  }
  return FanOut::first_error(fan.collect(), true);
}

// ENABLE or DISABLE in every target that holds the probe; remembered for targets to come.
int set_enabled(Tracer::Impl& impl, ProbeId id, bool on) {
  std::lock_guard lock(impl.mu);
  auto it = impl.probes.find(id);
  if (it == impl.probes.end()) return -ENOENT;
  it->second.spec.enabled = on;
  return for_each_site(impl, id, on ? lk::MsgType::kEnable : lk::MsgType::kDisable,
                       [](uint32_t a) { return lk::ProbeRef{a}; });
}

}  // namespace

int Tracer::enable_probe(ProbeId id) { return set_enabled(*impl_, id, true); }

int Tracer::disable_probe(ProbeId id) { return set_enabled(*impl_, id, false); }

int Tracer::set_filter(ProbeId id, std::shared_ptr<const events::CompiledFilter> f) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->probes.find(id);
  if (it == impl_->probes.end()) return -ENOENT;
  it->second.spec.filter = f;
  const events::CompiledFilter* raw = f.get();
  return for_each_site(*impl_, id, lk::MsgType::kSetFilter, [raw](uint32_t a) {
    lk::SetFilter s;
    s.probe_id = a;
    if (raw) s.filter = *raw;
    return s;
  });
}

ProbeProfile Tracer::profile(ProbeId id) {
  std::lock_guard lock(impl_->mu);
  ProbeProfile out;
  auto it = impl_->probes.find(id);
  if (it == impl_->probes.end()) return out;
  const Impl::Probe& p = it->second;
  out.hits = p.gone_hits;
  out.misses = p.gone_misses;
  for (auto& [pid, t] : impl_->targets) {
    auto s = t->sites.find(id);
    if (s == t->sites.end() || t->folded) continue;
    // Both counts from the target's area, as its agent writes them (no round trip: a
    // stopped or hung target answers at once). The misses of every site of the probe in
    // the target share its slot, as their hits do: the sum of their engines' nmissed.
    if (t->rings) {
      std::lock_guard rl(impl_->read_mu);
      out.hits += t->rings->reader.hits(p.slot);
      out.misses += t->rings->reader.misses(p.slot);
    }
  }
  return out;
}

// kprobes/list is served from each target's last LIST text, which is asked for again only
// when it may be out of date: the link's list_generation moved since (a request of ours
// that changes probes, a MAPPED, or the agent's LIST_CHANGED notice of a change its
// optimizer made on its own). The kernel's file is exact the moment a write to
// kprobe_events or enable returns, so a text known to be stale is never served for a
// target that runs: that target is asked (all such targets at once, under one deadline),
// and its answer is kept with the generation read before asking, so that a change that
// raced with the question leaves it stale. A stopped target cannot answer: it shows what
// it said last, as does one that does not answer in time. Reading the file when nothing
// changed asks no agent at all.
std::string Tracer::kprobes_list() {
  std::lock_guard lock(impl_->mu);
  struct Ask {
    Impl::Target* t;
    uint64_t generation;
  };
  std::vector<Ask> asks;
  FanOut fan;
  for (auto& [pid, t] : impl_->targets) {
    if (!t->link || t->link->closed()) continue;
    const uint64_t g = t->link->list_generation();
    if (t->list_known && t->list_generation == g) continue;
    // A stopped one would not answer now (its request would wait in the link, one more
    // at each read): it stays as it last answered, or absent if it never did.
    if (process_stopped(pid)) continue;
    asks.push_back({t.get(), g});
    fan.start(t->link, lk::MsgType::kList, {});
  }
  const std::vector<LinkResult> rs = fan.collect();
  for (size_t i = 0; i < asks.size(); ++i) {
    if (!rs[i].ok() || rs[i].deferred) continue;  // stopped or silent: as it last answered
    asks[i].t->last_list = rs[i].message;
    asks[i].t->list_generation = asks[i].generation;
    asks[i].t->list_known = true;
  }
  std::string out;
  for (auto& [pid, t] : impl_->targets) {
    if (!t->link || t->link->closed() || !t->list_known) continue;
    // The notes of this target's probes, matched to the agent's lines by address, kind
    // and order: probes of one address can carry different notes (memcpy and memmove
    // resolve to one implementation).
    std::vector<std::tuple<uintptr_t, char, uint32_t, std::string>> notes;
    if (!t->notes.empty()) {
      for (const auto& [id, sites] : t->sites) {
        auto p = impl_->probes.find(id);
        if (p == impl_->probes.end()) continue;
        const char type = p->second.spec.def.is_return ? 'r' : 'k';
        for (const Impl::Site& s : sites) {
          auto n = t->notes.find({id, s.addr});
          notes.emplace_back(s.addr, type, s.agent_id,
                             n != t->notes.end() ? n->second.note : std::string());
        }
      }
    }
    out += list_with_notes(t->last_list, std::move(notes));
  }
  return out;
}

// An agent's blacklist is fixed when its engine starts (the engine's own text and arch's
// ranges), so each target is asked once, the first time the file is read while it runs
// (every such target at once, under one deadline), and its answer kept with the target;
// an exec'd image is a new target, asked again.
std::string Tracer::kprobes_blacklist() {
  std::lock_guard lock(impl_->mu);
  std::vector<Impl::Target*> asked;
  FanOut fan;
  for (auto& [pid, t] : impl_->targets) {
    if (!t->link || t->link->closed() || !t->syms || t->blacklist_known) continue;
    if (process_stopped(pid)) continue;  // it would not answer now: asked another time
    asked.push_back(t.get());
    fan.start(t->link, lk::MsgType::kBlacklist, {});
  }
  const std::vector<LinkResult> rs = fan.collect();
  for (size_t i = 0; i < asked.size(); ++i) {
    if (!rs[i].ok() || rs[i].deferred) continue;
    asked[i]->last_blacklist = rs[i].message;
    asked[i]->blacklist_known = true;
  }
  std::string out;
  std::set<std::string> seen;  // a fork child has its parent's addresses: listed once
  for (auto& [pid, t] : impl_->targets) {
    if (!t->link || t->link->closed() || !t->syms || !t->blacklist_known) continue;
    const std::string& text = t->last_blacklist;
    size_t at = 0;
    while (at < text.size()) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      const std::string l = text.substr(at, nl - at);
      at = nl + 1;
      unsigned long start = 0, end = 0;
      if (sscanf(l.c_str(), "0x%lx-0x%lx", &start, &end) != 2 || start >= end) continue;
      char range[64];
      snprintf(range, sizeof range, "0x%016lx-0x%016lx\t", start, end);
      std::string line = range + blacklist_name(*t->syms, start) + "\n";
      if (seen.insert(line).second) out += line;
    }
  }
  return out;
}

int Tracer::set_all_armed(bool armed) {
  std::lock_guard lock(impl_->mu);
  impl_->armed = armed;
  FanOut fan;
  for (auto& [pid, t] : impl_->targets)
    if (t->link && !t->link->closed())
      fan.start(t->link, armed ? lk::MsgType::kArmAll : lk::MsgType::kDisarmAll, {});
  return FanOut::first_error(fan.collect(), false);
}

bool Tracer::all_armed() const {
  std::lock_guard lock(impl_->mu);
  return impl_->armed;
}

int Tracer::set_optimization(bool on) {
  std::lock_guard lock(impl_->mu);
  impl_->optimization = on;
  FanOut fan;
  for (auto& [pid, t] : impl_->targets)
    if (t->link && !t->link->closed())
      fan.start(t->link, lk::MsgType::kOptimization, lk::Optimization{on});
  return FanOut::first_error(fan.collect(), false);
}

}  // namespace probefs::tracee
