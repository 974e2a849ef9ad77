// The targets room: the processes under trace and their lifecycle. Launch, attach and
// detach; the service thread, which takes new links (fork children, exec'd images,
// `probefs exec`), MAPPED notices and closed links, sweeps targets whose link ended and
// reaps our children; the notices it delivers; `targets` and wait_exit.
//
// Locks (tracee/tracer_impl.h): mu guards the targets table and everything in it; a
// target's set-up and the probes placed in it run under mu (the placement room shares
// it). targets_mu guards what the readers of this room need and nothing that waits for an
// agent: the targets as listed, the refused, the exits, the notices, our children; so
// `targets`, wait_exit, the notices and the reaping of our children never wait for a
// set-up or a request. Areas are made and counts read under read_mu. Order: mu,
// targets_mu, read_mu.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tracee/inject.h"
#include "tracee/launch.h"
#include "tracee/proc_info.h"
#include "tracee/tracer_impl.h"
#include "tracee/untraceable.h"

namespace probefs::tracee {

using std::chrono::milliseconds;

// Whether a target may join now (make_room_for_target); *why says otherwise. mu held.
bool Tracer::Impl::target_room(std::string* why) {
  if (make_room_for_target()) return true;
  if (why)
    *why = "the target limit (" + std::to_string(opts.max_targets) +
           " traced processes) is reached";
  return false;
}

// A process that was refused (TargetInfo::untraced), kept for `targets` while it runs
// and queued as a kRefused notice. Takes targets_mu.
void Tracer::Impl::note_refused(pid_t pid, pid_t parent, TargetOrigin origin,
                                const std::string& reason, const std::string& why,
                                bool untraceable) {
  std::lock_guard tl(targets_mu);
  // Said once: a process noted again (exec'd anew) replaces its entry.
  std::erase_if(refused, [&](const TargetInfo& r) { return r.pid == pid; });
  TargetInfo i;
  i.pid = pid;
  i.parent = parent;
  i.origin = origin;
  i.untraced = reason;
  i.untraceable = untraceable;
  refused.push_back(std::move(i));
  while (refused.size() > kRefusedKept) refused.pop_front();
  TargetNotice n;
  n.kind = TargetNotice::Kind::kRefused;
  n.pid = pid;
  n.parent = parent;
  n.reason = why;
  n.untraceable = untraceable;
  notices.push_back(std::move(n));
}

bool Tracer::Impl::left_untraceable(pid_t pid, Target& t,
                                    std::chrono::steady_clock::time_point now) {
  const bool graced = now - t.unlinked_since > kExecGrace;
  Untraceable u;
  if (!t.image_judged) {
    u = untraceable_process(pid, opts.agent_path);
    if (u.state.empty() && u.settled) t.image_judged = true;
  }
  if (u.state.empty() && !graced) return false;  // its agent may still come
  if (u.state.empty()) {
    u.state = "no-agent";
    u.why = "pid " + std::to_string(pid) + " runs on and no agent joined in " +
            std::to_string(kExecGrace.count()) + " s (it could not reach the daemon)";
  }
  note_refused(pid, 0, t.origin, u.state, u.why, true);
  return true;
}

void Tracer::Impl::note_lapsed_execs() {
  for (pid_t pid : listener->lapsed_execs()) {
    if (!process_running(pid) || targets.count(pid)) continue;
    Untraceable u = untraceable_process(pid, opts.agent_path);
    if (u.state.empty()) {
      u.state = "no-agent";
      u.why = "pid " + std::to_string(pid) + " was started by probefs exec and no agent "
              "joined (it could not reach the daemon)";
    }
    note_refused(pid, 0, TargetOrigin::kLaunched, u.state, u.why, true);
  }
}

void Tracer::note_untraceable(pid_t pid, const std::string& state, const std::string& why) {
  impl_->note_refused(pid, 0, TargetOrigin::kLaunched, state, why, true);
}

// A probe that could not go into target t, said once (error_log, through a kNotPlaced
// notice): the definition stands, and applies where it can. mu held; takes targets_mu.
void Tracer::Impl::note_not_placed(Target& t, ProbeId id, const events::Diagnostic& diag) {
  if (!diag.logged() || !t.not_placed.insert(id).second) return;
  std::lock_guard tl(targets_mu);
  if (auto l = listed.find(t.pid); l != listed.end()) l->second.info.not_placed = t.not_placed.size();
  TargetNotice n;
  n.kind = TargetNotice::Kind::kNotPlaced;
  n.pid = t.pid;
  n.diag = diag;
  notices.push_back(std::move(n));
}

std::set<Tracer::Impl::Rings*> Tracer::Impl::live_rings() const {
  std::set<Rings*> live;
  if (own) live.insert(own.get());
  for (const auto& [pid, t] : targets)
    if (t->rings) live.insert(t->rings.get());
  return live;
}

// A fork child's symbols and mappings, its parent's (it ran no code of its own yet:
// it waits for GO), without reading /proc or opening a file. false: load them.
bool Tracer::Impl::inherit_symbols(Target& t, const Target& parent) {
  if (!parent.syms || parent.maps.empty()) return false;
  std::unique_ptr<ProcessSymbols> syms = ProcessSymbols::fork_of(*parent.syms, t.pid);
  if (!syms) return false;
  t.syms = std::move(syms);
  t.maps = parent.maps;
  t.symbolizer = std::make_shared<TargetNames>(t.syms);
  return true;
}

int Tracer::Impl::refresh_symbols(Target& t) {
  std::vector<Mapping> maps;
  if (int err = read_maps(t.pid, &maps); err != 0) return err;
  t.maps = std::move(maps);
  if (!t.syms) {
    int err = 0;
    t.syms = ProcessSymbols::load(t.pid, &err, &t.maps);  // /proc/PID/maps read once
    if (!t.syms) return err;
    t.symbolizer = std::make_shared<TargetNames>(t.syms);
    return 0;
  }
  return t.syms->reload(&t.maps);
}

// Makes t a working target: symbols, ring area, switches, every probe. mu held.
int Tracer::Impl::set_up(Target& t, std::string* error, const Target* parent,
                         std::shared_ptr<Rings> spare) {
  const bool inherited = parent != nullptr && inherit_symbols(t, *parent);
  if (int err = inherited ? 0 : refresh_symbols(t); err != 0) {
    if (error) *error = "cannot read the symbols of pid " + std::to_string(t.pid);
    if (spare) {
      std::lock_guard rl(read_mu);
      std::erase(spare_rings, spare);
    }
    return err;
  }
  for (const auto& [key, label] : t.notes) {  // a fork child's, from its parent
    if (auto p = probes.find(key.first); p != probes.end())
      t.symbolizer->set_label(key.second, p->second.spec.event_id, label);
  }
  int err = 0;
  if (spare && !make_room_for_target()) {
    std::lock_guard rl(read_mu);
    std::erase(spare_rings, spare);
    (void)target_room(error);
    return -ENOSPC;
  }
  t.rings = spare ? spare : new_rings(t.pid, &err);
  if (!t.rings) {
    if (err == -ENOSPC) (void)target_room(error);  // says which limit
    else if (error) *error = "cannot create the ring area: " + std::string(strerror(-err));
    return err;
  }
  allow_sites(t);  // a fork child's, inherited; before a spare's records are read
  uint32_t clk;
  {
    std::lock_guard rl(read_mu);
    t.rings->symbolizer = t.symbolizer;
    if (spare) adopt_spare_rings(spare, t.pid);
    clk = static_cast<uint32_t>(events::trace_clock_stamp(clock));
  }
  // SETUP, the switches, the branch tables and the DEFINEs leave one behind the other
  // (the agent takes them in order) and their replies are collected after: one round
  // trip for all.
  AgentLink::Ticket setup;
  if (!spare) {
    setup = t.link->start_setup(t.rings->area.fd(), t.rings->area.size(), clk);
    t.rings->area.close_fd();  // the agent holds its own now; the mapping stays
  }
  std::vector<AgentLink::Ticket> switches;
  // The control page goes first: no probe fires before the agent reads the mount's.
  // A fork child that took a spare holds its parent's mapping already.
  if (!spare) switches.push_back(t.link->start_table(lk::MsgType::kControl, {}, control.fd));
  if (!armed) switches.push_back(t.link->start(lk::MsgType::kDisarmAll, {}));
  if (!optimization) switches.push_back(t.link->start(lk::MsgType::kOptimization, lk::Optimization{false}));
  t.exe = inherited ? parent->exe : proc_exe(t.pid);
  const auto first = [&]() -> int {
    for (const AgentLink::Ticket& k : switches)
      (void)t.link->collect(k, std::chrono::steady_clock::time_point::max());
    if (spare) return 0;
    LinkResult r = t.link->collect(setup, std::chrono::steady_clock::time_point::max());
    if (!r.ok() && error) *error = "agent refused its ring area: " + r.message;
    return r.ok() ? 0 : (r.error != 0 ? r.error : -EIO);
  };
  const int placed = place_all_pending(t, first);
  if (placed == 0) sync_hists(t);
  return placed;
}

Tracer::Impl::Target* Tracer::Impl::target_of_link(const std::shared_ptr<AgentLink>& link) {
  for (auto& [pid, t] : targets)
    if (t->link == link) return t.get();
  return nullptr;
}

// Takes targets_mu.
void Tracer::Impl::record_exit(pid_t pid, int status) {
  std::lock_guard tl(targets_mu);
  exits[pid] = status;
  exit_cv.notify_all();
}

// pid is (or was) a target: wait_exit knows it. mu held; takes targets_mu.
void Tracer::Impl::remember(pid_t pid) {
  std::lock_guard tl(targets_mu);
  if (!ever.insert(pid).second) return;
  ever_order.push_back(pid);
  for (size_t tries = ever_order.size(); ever_order.size() > kExitsKept && tries > 0; --tries) {
    const pid_t old = ever_order.front();
    ever_order.pop_front();
    if (targets.count(old) || children.count(old)) {
      ever_order.push_back(old);  // still here: only the departed are forgotten
      continue;
    }
    ever.erase(old);
    exits.erase(old);
  }
}

// Notices go out from the service thread only, in the order they happened, with no
// lock held (a listener may call back in). Takes targets_mu.
void Tracer::Impl::queue_notice(TargetNotice::Kind kind, pid_t pid, pid_t parent, int status) {
  std::lock_guard tl(targets_mu);
  TargetNotice n;
  n.kind = kind;
  n.pid = pid;
  n.parent = parent;
  n.status = status;
  notices.push_back(n);
}

// t is set up: `targets` lists it, as it is now; not if it was reaped meanwhile (its exit
// is known: the exit of the pid's earlier process was forgotten when t joined). mu held;
// takes targets_mu.
void Tracer::Impl::list_target(const Target& t) {
  Listed l;
  l.info.pid = t.pid;
  l.info.parent = t.parent;
  l.info.origin = t.origin;
  l.info.exe = t.exe;
  l.info.not_placed = t.not_placed.size();
  l.link = t.link;
  std::lock_guard tl(targets_mu);
  if (exits.count(t.pid)) return;
  listed[t.pid] = std::move(l);
}

// pid left the targets table. Takes targets_mu.
void Tracer::Impl::unlist_target(pid_t pid) {
  std::lock_guard tl(targets_mu);
  listed.erase(pid);
}

void Tracer::Impl::deliver_notices() {
  std::deque<TargetNotice> out;
  std::function<void(const TargetNotice&)> fn;
  {
    std::lock_guard tl(targets_mu);
    out.swap(notices);
    fn = notice_listener;
  }
  if (fn)
    for (const TargetNotice& n : out) fn(n);
}

// The target's counts join its probes' totals, once, when it stops counting (exit,
// exec, detach). mu held.
void Tracer::Impl::fold_counts(Target& t) {
  if (t.folded) return;
  t.folded = true;
  std::lock_guard rl(read_mu);
  for (auto& [id, sites] : t.sites) {
    auto it = probes.find(id);
    if (it == probes.end() || !t.rings) continue;
    it->second.gone_hits += t.rings->reader.hits(it->second.slot);
    it->second.gone_misses += t.rings->reader.misses(it->second.slot);
  }
}

// A target leaves the table: its counts are folded and its exit recorded. mu held.
void Tracer::Impl::drop_target(pid_t pid, TargetNotice::Kind kind, int status) {
  auto it = targets.find(pid);
  if (it == targets.end()) return;
  fold_counts(*it->second);
  if (it->second->link) it->second->link->close();
  targets.erase(it);
  unlist_target(pid);  // before its exit is known: wait_exit's caller sees it gone
  record_exit(pid, status);
  queue_notice(kind, pid, 0, status);
}

// A fork child, an exec'd image, or a process prepared for `probefs exec`.
void Tracer::Impl::handle_connected(const std::shared_ptr<AgentLink>& link, bool prepared) {
  const lk::Hello& h = link->hello();
  auto l = lock_serving();
  auto t = std::make_unique<Target>();
  t->pid = link->pid();
  t->link = link;
  TargetNotice::Kind kind;
  Target* parent_target = nullptr;  // a fork child's, whose symbols it starts with
  std::shared_ptr<Rings> spare;     // the area a fork child took from its parent
  if (h.reason == lk::HelloReason::kFork) {
    t->parent = h.ppid;
    t->origin = TargetOrigin::kForked;
    auto parent = targets.find(h.ppid);
    parent_target = parent == targets.end() ? nullptr : parent->second.get();
    spare = take_spare(h.spare_id, h.ppid, parent_target);
    adopt_inherited_probes(*t, parent_target);
    if (parent_target != nullptr) t->unwind_sent = parent_target->unwind_sent;
    kind = TargetNotice::Kind::kForked;
  } else if (prepared && !targets.count(t->pid)) {
    // `probefs exec`: a launched target that is not our child (nobody here reaps it).
    t->origin = TargetOrigin::kLaunched;
    kind = TargetNotice::Kind::kJoined;
  } else {
    // An exec'd image of a target: a new program, none of the old probes.
    auto old = targets.find(t->pid);
    let_go_spares_of(t->pid);  // the old image's: the new one holds none
    if (old != targets.end()) {
      fold_counts(*old->second);
      t->origin = old->second->origin;
      t->parent = old->second->parent;
      if (old->second->link) old->second->link->close();
      targets.erase(old);
    }
    kind = TargetNotice::Kind::kExeced;
  }
  {
    // An earlier process's exit, forgotten; not this one's (a launched program that exec'd
    // and died since: reaped while this waited for mu, its set-up fails).
    std::lock_guard tl(targets_mu);
    if (process_running(t->pid)) exits.erase(t->pid);
  }
  remember(t->pid);
  const pid_t pid = t->pid;
  const pid_t parent = t->parent;
  Target& ref = *t;
  targets[pid] = std::move(t);
  std::string err;
  if (int e = set_up(ref, &err, parent_target, spare); e != 0) {
    const TargetOrigin origin = ref.origin;
    ref.link->close();  // its agent lets the program run on untraced
    targets.erase(pid);
    unlist_target(pid);  // an exec'd image's old one, listed until now
    if (e == -ENOSPC) note_refused(pid, parent, origin, "target-limit", err);
    return;
  }
  // Listed before it runs: whoever sees it run sees it listed.
  list_target(ref);  // an exec'd image's replaces its old one
  if (h.spare_id == 0) (void)ref.link->go();  // one that named a spare waits for nothing
  // A process that forks gets a spare area, so that its next child waits for nothing;
  // one whose child came without the spare it was handed (the SPARE crossed the fork, or
  // the child that took it died before it said HELLO) gets the next.
  if (parent_target != nullptr) {
    if (h.spare_id == 0) {
      for (uint32_t id : parent_target->spares) let_go_spare(id);
      parent_target->spares.clear();
    }
    // When nothing else waits: a new image's start before a spare of a process that
    // forked.
    ++parent_target->forks;
    spare_due.push_back(parent_target->pid);
    spares_due.store(true);
  }
  queue_notice(kind, pid, kind == TargetNotice::Kind::kForked ? parent : 0);
}

// ---------------------------------------------------------------------------------------
// Spare areas (SpareArea)

// The spare `id` of `owner`'s that a fork child named in its HELLO, out of the table;
// nullptr when there is none such (the child is then set up as one without: SETUP).
std::shared_ptr<Tracer::Impl::Rings> Tracer::Impl::take_spare(uint32_t id, pid_t owner,
                                                              Target* owner_target) {
  if (id == 0) return nullptr;
  auto it = spares.find(id);
  if (it == spares.end() || it->second.owner != owner) return nullptr;
  std::shared_ptr<Rings> r = std::move(it->second.rings);
  spares.erase(it);
  listener->withdraw_spare(id);
  if (owner_target != nullptr) {
    // The agent hands out its spares oldest first: those handed before this one went to
    // earlier children, which name them (within kSpareGrace) or died first.
    std::vector<uint32_t>& held = owner_target->spares;
    if (auto at = std::find(held.begin(), held.end(), id); at != held.end()) {
      for (auto e = held.begin(); e != at; ++e) let_go_spare(*e);
      held.erase(held.begin(), at + 1);
    }
  }
  return r;
}

// The spares of the processes that forked since the service thread was last idle.
// mu held.
void Tracer::Impl::hand_due_spares() {
  std::vector<pid_t> due;
  due.swap(spare_due);
  spares_due.store(false);
  std::sort(due.begin(), due.end());
  due.erase(std::unique(due.begin(), due.end()), due.end());
  for (pid_t pid : due)
    if (auto t = targets.find(pid); t != targets.end()) hand_spare(*t->second);
}

// Hands t spare areas (SPARE): one to a process that forked once, lk::kMaxHeldSpares to
// one that forks again (a shell running a script forks once per command; a server's
// workers, a loop, back to back). mu held; takes read_mu.
void Tracer::Impl::hand_spare(Target& t) {
  const size_t want = t.forks >= 2 ? lk::kMaxHeldSpares : 1;
  while (t.spares.size() < want && hand_one_spare(t)) {
  }
}

bool Tracer::Impl::hand_one_spare(Target& t) {
  if (!t.rings || !t.link || t.link->closed()) return false;
  int err = 0;
  std::shared_ptr<Rings> r = new_spare_rings(t.pid, &err);
  if (!r) return false;
  uint32_t clk;
  {
    std::lock_guard rl(read_mu);
    clk = static_cast<uint32_t>(events::trace_clock_stamp(clock));
  }
  if (next_spare_id == 0) next_spare_id = 1;
  const uint32_t id = next_spare_id++;
  lk::Spare sp;
  sp.setup.area_size = r->area.size();
  sp.setup.trace_clock = clk;
  sp.id = id;
  // Its histogram tables go first: the agent keeps them for the spare, which no child can
  // take before it came.
  std::vector<HistTableTicket> tables;
  if (t.link->hello().abi_version >= 5) give_hist_tables(*r, *t.link, id, &tables);
  listener->offer_spare(id, t.pid);  // before a child can name it
  const int rc = t.link->post_spare(sp, r->area.fd());
  r->area.close_fd();
  collect_hist_tables(*t.link, tables);  // one not taken is given again (sync_hists)
  if (rc != 0) {
    listener->withdraw_spare(id);
    std::lock_guard rl(read_mu);
    std::erase(spare_rings, r);
    return false;
  }
  spares[id] = SpareArea{t.pid, std::move(r), {}};
  t.spares.push_back(id);
  return true;
}

// Spare `id`, which its owner no longer holds for certain: it goes if no child names it
// within kSpareGrace. mu held.
void Tracer::Impl::let_go_spare(uint32_t id) {
  auto s = spares.find(id);
  if (s != spares.end() && s->second.let_go == std::chrono::steady_clock::time_point{})
    s->second.let_go = std::chrono::steady_clock::now();
}

// The spares held by pid's agent now, which no child of the process it is from now on
// can name (exec, exit, detach): they go after kSpareGrace. mu held.
void Tracer::Impl::let_go_spares_of(pid_t pid) {
  for (auto& [id, s] : spares)
    if (s.owner == pid) let_go_spare(id);
  if (auto t = targets.find(pid); t != targets.end()) t->second->spares.clear();
}

// Removes the spares `which` picks. mu held; takes read_mu.
void Tracer::Impl::drop_spares(const std::function<bool(const SpareArea&)>& which) {
  std::vector<std::shared_ptr<Rings>> gone;
  for (auto it = spares.begin(); it != spares.end();) {
    if (!which(it->second)) {
      ++it;
      continue;
    }
    if (auto t = targets.find(it->second.owner); t != targets.end())
      std::erase(t->second->spares, it->first);
    gone.push_back(std::move(it->second.rings));
    listener->withdraw_spare(it->first);
    it = spares.erase(it);
  }
  if (gone.empty()) return;
  std::lock_guard rl(read_mu);
  for (const auto& r : gone) std::erase(spare_rings, r);
}

// The service tick: spares whose owner is no target any more are let go, and those let go
// longer than kSpareGrace ago leave. mu held; takes read_mu.
void Tracer::Impl::sweep_spares() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [id, s] : spares) {
    auto t = targets.find(s.owner);
    if ((t == targets.end() || !t->second->link || t->second->link->closed()) &&
        s.let_go == std::chrono::steady_clock::time_point{})
      s.let_go = now;
  }
  drop_spares([&](const SpareArea& s) {
    return s.let_go != std::chrono::steady_clock::time_point{} && now - s.let_go > kSpareGrace;
  });
}

void Tracer::Impl::handle_mapped(const LinkEvent& ev) {
  auto l = lock_serving();
  Target* t = target_of_link(ev.link);
  std::vector<lk::Define> defs;
  std::vector<ProbeId> ids;
  const bool mapped = ev.mapped.kind == lk::MappedKind::kMapped;
  if (t != nullptr && refresh_symbols(*t) == 0 && mapped) place_pending(*t, &defs, &ids);
  // The new probes may fire as soon as the agent has them, before the answer's results.
  if (t != nullptr)
    for (const lk::Define& d : defs) allow_event(*t, d.event_id);
  std::vector<LinkResult> res = ev.link->answer_mapped(ev.seq, defs);
  if (t == nullptr) return;
  for (size_t i = 0; i < defs.size() && i < res.size(); ++i) {
    if (res[i].ok()) {
      t->sites[ids[i]].push_back({defs[i].probe_id, defs[i].address});
    } else if (auto p = probes.find(ids[i]); p != probes.end() && !ev.link->closed()) {
      note_not_placed(*t, ids[i], registration_diagnostic(p->second.spec.def, res[i].error));
    }
  }
  if (!mapped) forget_unmapped_sites(*t);
  if (!defs.empty()) sync_hists(*t);
  else if (mapped) sync_unwind(*t);
}

void Tracer::Impl::handle_closed(const std::shared_ptr<AgentLink>& link) {
  auto l = lock_serving();
  Target* t = target_of_link(link);
  if (t == nullptr) return;  // replaced by its exec'd image, or detached
  fold_counts(*t);
  // Exited, or exec'd (an attached program's new image has no agent; a launched one's
  // connects again): the service tick sorts it out (sweep_unlinked).
  t->unlinked_since = std::chrono::steady_clock::now();
}

// Targets whose link ended: gone once the process is (our own children when reaped),
// and left when the process runs on without an agent (an attached program that
// exec'd at once; a launched one whose new image did not connect within kExecGrace:
// a static or setuid program, or one that cleared its environment). mu held.
void Tracer::Impl::sweep_unlinked() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<pid_t, TargetNotice::Kind>> drop;
  for (auto& [pid, t] : targets) {
    if (!t->link || !t->link->closed()) continue;
    // The link ended before its kClosed event was handled: its grace starts now (a
    // fork child that execs at once would otherwise be left before its new image
    // could connect).
    if (t->unlinked_since == std::chrono::steady_clock::time_point{}) t->unlinked_since = now;
    bool child;
    {
      std::lock_guard tl(targets_mu);
      child = children.count(pid) != 0;
    }
    // A launched target or a fork child that runs on without its link exec'd a program
    // its agent did not enter: said as soon as that is known (untraceable.h).
    if (child) {
      if (process_running(pid) && left_untraceable(pid, *t, now))
        drop.emplace_back(pid, TargetNotice::Kind::kLeft);
      continue;  // reap_children reports its exit with its status
    }
    if (!process_running(pid))
      drop.emplace_back(pid, TargetNotice::Kind::kExited);
    else if (t->origin == TargetOrigin::kAttached || left_untraceable(pid, *t, now))
      drop.emplace_back(pid, TargetNotice::Kind::kLeft);
  }
  for (auto& [pid, kind] : drop) drop_target(pid, kind, -1);
}

// Our own children (launched targets), reaped whether they are targets still or not:
// their exits are known at once, and `targets` stops listing them; a target among them
// leaves the table, with its notice, when mu is free (drop_reaped). Takes targets_mu
// alone: the service thread reaps while it waits for mu.
void Tracer::Impl::reap_children() {
  std::lock_guard tl(targets_mu);
  for (auto it = children.begin(); it != children.end();) {
    int st = 0;
    const pid_t pid = *it;
    if (waitpid(pid, &st, WNOHANG) != pid) {
      ++it;
      continue;
    }
    it = children.erase(it);
    listed.erase(pid);
    exits[pid] = st;
    exit_cv.notify_all();
    reaped.emplace_back(pid, st);
  }
}

// The targets among the children reaped leave the table (drop_target: counts folded,
// kExited notice with the wait status). Every user of the table that looks a pid up
// calls it first: a reaped pid may be a new process's already. mu held; takes targets_mu.
void Tracer::Impl::drop_reaped() {
  std::vector<std::pair<pid_t, int>> done;
  {
    std::lock_guard tl(targets_mu);
    done.swap(reaped);
  }
  for (const auto& [pid, st] : done) drop_target(pid, TargetNotice::Kind::kExited, st);
}

// mu, for the service thread: while another thread holds it (a request waiting for an
// agent, a set-up), our children are reaped and the notices delivered, every 20 ms.
std::unique_lock<std::timed_mutex> Tracer::Impl::lock_serving() {
  std::unique_lock l(mu, std::defer_lock);
  while (!l.try_lock_for(milliseconds(20))) {
    reap_children();
    deliver_notices();
  }
  drop_reaped();
  return l;
}

void Tracer::Impl::service_loop() {
  auto last_tick = std::chrono::steady_clock::now();
  while (!stop.load()) {
    LinkEvent ev;
    const bool spares = spares_due.load();
    if (listener->next_event(&ev, spares ? milliseconds(0) : milliseconds(20))) {
      switch (ev.kind) {
        case LinkEvent::kConnected: handle_connected(ev.link, ev.prepared); break;
        case LinkEvent::kMapped: handle_mapped(ev); break;
        case LinkEvent::kClosed: handle_closed(ev.link); break;
      }
    } else if (spares) {
      auto l = lock_serving();
      hand_due_spares();
    }
    reap_children();
    {
      auto l = lock_serving();
      sweep_unlinked();
      note_lapsed_execs();
    }
    deliver_notices();
    auto now = std::chrono::steady_clock::now();
    if (now - last_tick > std::chrono::seconds(1)) {
      last_tick = now;
      auto l = lock_serving();
      sweep_spares();
      std::lock_guard rl(read_mu);
      conv.update();
      boot_conv.update();
      const std::set<Rings*> live = live_rings();
      for (auto& r : rings)
        if (r != own) reclaim_rings(*r, live.count(r.get()) != 0);
      free_drained_rings(live);
    }
  }
}

int Tracer::launch(const LaunchSpec& spec, pid_t* pid, std::string* error) {
  LaunchOptions lo;
  lo.argv = spec.argv;
  lo.agent_path = impl_->opts.agent_path;
  lo.env_add = spec.env;
  lo.stdin_fd = spec.stdin_fd;
  lo.stdout_fd = spec.stdout_fd;
  lo.stderr_fd = spec.stderr_fd;
  lo.nofile_soft = impl_->nofile_soft;
  {
    std::lock_guard lock(impl_->mu);
    impl_->drop_reaped();
    if (!impl_->target_room(error)) return -ENOSPC;  // before a program starts for nothing
  }
  Launched l;
  if (int err = tracee::launch(*impl_->listener, lo, &l, error); err != 0) return err;
  {
    std::lock_guard lock(impl_->mu);
    impl_->drop_reaped();  // a child reaped since may have had this pid
    {
      std::lock_guard tl(impl_->targets_mu);
      impl_->children.insert(l.pid);  // reaped from now on, its exit kept
      impl_->exits.erase(l.pid);
    }
    auto t = std::make_unique<Impl::Target>();
    t->pid = l.pid;
    t->origin = TargetOrigin::kLaunched;
    t->link = l.link;
    Impl::Target& ref = *t;
    impl_->targets[l.pid] = std::move(t);
    impl_->remember(l.pid);
    if (int err = impl_->set_up(ref, error); err != 0) {
      ref.link->close();
      kill(l.pid, SIGKILL);
      impl_->targets.erase(l.pid);  // reaped by the service thread
      return err;
    }
    impl_->list_target(ref);  // before it runs: whoever sees it run sees it listed
    LinkResult r = ref.link->go();
    if (!r.ok() && error) *error = "the agent did not start the program: " + r.message;
    impl_->queue_notice(TargetNotice::Kind::kJoined, l.pid);
  }
  *pid = l.pid;
  return 0;
}

int Tracer::attach(pid_t pid, std::string* error) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->drop_reaped();
    if (impl_->targets.count(pid)) {
      if (error) *error = "pid " + std::to_string(pid) + " is traced already";
      return -EEXIST;
    }
    if (!impl_->target_room(error)) return -ENOSPC;
  }
  AgentListener& listener = *impl_->listener;
  // The endpoint of the process's uid: the only one its agent can reach.
  std::string link_name;
  if (int e = listener.expect(pid, &link_name); e != 0) {
    listener.unexpect(pid);
    if (error) *error = e == -ESRCH ? "no such process" : "no link endpoint for its user";
    return e;
  }
  PtraceError perr;
  // A process that could not load the agent or reach the link is refused before it is
  // touched, with the namespace that stands in the way.
  if (int e = check_namespaces(pid, impl_->opts.agent_path, link_name, &perr); e != 0) {
    listener.unexpect(pid);
    if (error) *error = perr.message;
    return e;
  }
  PtraceOptions popts;
  auto session = PtraceSession::attach(pid, popts, &perr);
  if (!session) {
    listener.unexpect(pid);
    if (error) *error = perr.message;
    return perr.err ? perr.err : -EPERM;
  }
  InjectedLibrary agent;
  int err = inject_library(*session, impl_->opts.agent_path, &agent, &perr);
  uintptr_t entry = 0, name = 0;
  uint64_t rc = 0;
  if (err == 0) err = resolve_injected_symbol(session->symbols(), agent, lk::kAttachSymbol, &entry);
  if (err != 0 && perr.message.empty()) perr.message = "the agent has no attach entry point";
  if (err == 0) err = session->push_string(link_name, &name, &perr);
  // probefs_agent_attach returns an int: the low half of rax. -EBUSY while the agent still
  // lets go of a previous daemon (which it does within a second of that daemon's end).
  int agent_rc = 0;
  for (int attempt = 0; err == 0; ++attempt) {
    const uint64_t args[1] = {name};
    err = session->call(entry, args, &rc, &perr);
    agent_rc = static_cast<int32_t>(static_cast<uint32_t>(rc));
    if (err != 0 || agent_rc != -EBUSY || attempt >= 40) break;
    std::this_thread::sleep_for(milliseconds(25));
  }
  PtraceError derr;
  int detach_err = session->detach(&derr);
  if (err == 0 && agent_rc < 0) {
    err = agent_rc;
    perr.message = "the agent refused to attach: " + std::string(strerror(-err));
  }
  if (err == 0 && detach_err != 0) {
    err = detach_err;
    perr = derr;
  }
  if (err != 0) {
    listener.unexpect(pid);
    if (error) *error = perr.message;
    return err;
  }
  int werr = 0;
  std::shared_ptr<AgentLink> link = listener.wait_for(pid, milliseconds(10000), &werr);
  if (!link) {
    listener.unexpect(pid);
    if (error) *error = "the agent did not connect";
    return werr ? werr : -ETIMEDOUT;
  }
  {
    std::lock_guard lock(impl_->mu);
    impl_->drop_reaped();
    auto t = std::make_unique<Impl::Target>();
    t->pid = pid;
    t->origin = TargetOrigin::kAttached;
    t->link = link;
    Impl::Target& ref = *t;
    impl_->targets[pid] = std::move(t);
    impl_->remember(pid);
    {
      std::lock_guard tl(impl_->targets_mu);
      impl_->exits.erase(pid);
    }
    if (int e = impl_->set_up(ref, error); e != 0) {
      (void)ref.link->detach();
      impl_->targets.erase(pid);
      return e;
    }
    impl_->list_target(ref);
    impl_->queue_notice(TargetNotice::Kind::kJoined, pid);
  }
  return 0;
}

int Tracer::prepare_exec(pid_t pid, uid_t uid, int timeout_ms, std::string* link_name) {
  if (pid <= 0 || timeout_ms < 0) return -EINVAL;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return -ESRCH;
  // The listener takes no other user's connection unless the daemon is root.
  if (geteuid() != 0 && uid != geteuid()) return -EPERM;
  {
    std::lock_guard lock(impl_->mu);
    impl_->drop_reaped();
    if (impl_->targets.count(pid)) return -EEXIST;
    if (!impl_->target_room(nullptr)) return -ENOSPC;
  }
  // The endpoint of that uid: no other user can reach it.
  std::string name;
  if (int e = impl_->listener->endpoint(uid, &name); e != 0) return e;
  // The service thread serves the connection (handle_connected): no thread waits here.
  impl_->listener->expect_exec(pid, uid,
                               std::chrono::steady_clock::now() + milliseconds(timeout_ms));
  if (link_name) *link_name = name;
  return 0;
}

const std::string& Tracer::agent_path() const { return impl_->opts.agent_path; }

int Tracer::detach(pid_t pid) {
  std::lock_guard lock(impl_->mu);
  impl_->drop_reaped();
  auto it = impl_->targets.find(pid);
  if (it == impl_->targets.end()) return -ESRCH;
  impl_->fold_counts(*it->second);
  std::shared_ptr<AgentLink> link = it->second->link;
  impl_->targets.erase(it);
  impl_->unlist_target(pid);
  LinkResult r = link->detach();
  impl_->listener->forget(pid);  // its later images and children stay untraced
  // A launched program that runs on untraced is still ours to reap: its exit is
  // recorded then.
  {
    std::lock_guard tl(impl_->targets_mu);
    // Not over the status of a child reaped meanwhile (reap_children needs no mu).
    if (!impl_->children.count(pid) && !impl_->exits.count(pid)) {
      impl_->exits[pid] = -1;
      impl_->exit_cv.notify_all();
    }
  }
  impl_->queue_notice(TargetNotice::Kind::kDetached, pid);
  if (!r.ok() && r.error != -ENOTCONN) return r.error;
  return 0;
}

std::vector<TargetInfo> Tracer::targets() const {
  // What is listed now, under targets_mu alone (no set-up or request to an agent holds
  // it); the names and the requests still to do are read after.
  std::vector<std::pair<TargetInfo, std::shared_ptr<AgentLink>>> now;
  std::vector<TargetInfo> refused;
  {
    std::lock_guard tl(impl_->targets_mu);
    for (const auto& [pid, l] : impl_->listed) now.emplace_back(l.info, l.link);
    for (const TargetInfo& r : impl_->refused)
      if (!impl_->listed.count(r.pid)) refused.push_back(r);
  }
  std::vector<TargetInfo> out;
  for (auto& [i, link] : now) {
    i.comm = proc_comm(i.pid);
    if (link) i.deferred = link->deferred_requests();
    out.push_back(std::move(i));
  }
  for (TargetInfo& r : refused) {
    if (!process_running(r.pid)) continue;
    r.comm = proc_comm(r.pid);
    out.push_back(std::move(r));
  }
  return out;
}

int Tracer::wait_exit(pid_t pid, int timeout_ms, int* status) {
  std::unique_lock lock(impl_->targets_mu);
  if (!impl_->ever.count(pid)) return -ESRCH;
  bool done = impl_->exit_cv.wait_for(lock, milliseconds(timeout_ms),
                                      [&] { return impl_->exits.count(pid) != 0; });
  if (!done) return -ETIMEDOUT;
  if (status) *status = impl_->exits[pid];
  return 0;
}

void Tracer::on_target_notice(std::function<void(const TargetNotice&)> listener) {
  std::lock_guard tl(impl_->targets_mu);
  impl_->notice_listener = std::move(listener);
}

}  // namespace probefs::tracee
