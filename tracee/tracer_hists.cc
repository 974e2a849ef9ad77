// The histograms room of Tracer: each histogram's tables in every target (one memfd per
// histogram and target, events/hist.h), the histograms each probe's hits count into, and
// reading them. Reading takes only the histograms' own lock (HistState::mu, a leaf) and
// reads shared memory: it never waits for a target, and a stopped or hung one shows what
// it counted so far. A target that goes leaves its counts behind (~HistMemory).
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "events/trace_clock.h"

#include "tracee/tracer_impl.h"

namespace probefs::tracee {

HistMemory::~HistMemory() {
  if (base == nullptr) return;
  {
    std::lock_guard l(state->mu);
    auto it = state->hists.find(slot);
    if (it != state->hists.end() && it->second.generation == generation)
      events::hist_read_tables(base, bytes, rings_in_use(), geometry,
                               &it->second.retained.entries, &it->second.retained.totals);
  }
  ::munmap(base, bytes);
}

namespace {

// A fresh memfd of the histogram's tables for a target of `rings` rings, mapped; its
// descriptor in *fd (the caller hands it over and closes it). nullptr on failure.
std::shared_ptr<HistMemory> make_tables(const std::shared_ptr<HistState>& state, uint32_t slot,
                                        const HistState::Hist& h, uint32_t rings, int* fd) {
  const uint64_t bytes = h.geometry.memfd_bytes(rings);
  *fd = ::memfd_create("probefs-hist", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (*fd < 0) return nullptr;
  // Sealed at its size: a target that kept the descriptor cannot shrink it under the
  // daemon's mapping (its reads would fault) nor grow it.
  if (::ftruncate(*fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ::close(*fd);
    return nullptr;
  }
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (mem == MAP_FAILED) {
    ::close(*fd);
    return nullptr;
  }
  auto* ctl = static_cast<events::HistControl*>(mem);
  ctl->paused = h.paused ? 1 : 0;
  auto m = std::make_shared<HistMemory>();
  m->state = state;
  m->slot = slot;
  m->generation = h.generation;
  m->geometry = h.geometry;
  m->base = static_cast<uint8_t*>(mem);
  m->bytes = bytes;
  m->rings = rings;
  return m;
}

}  // namespace

void Tracer::Impl::give_hist_tables(Rings& r, AgentLink& link, uint32_t spare_id,
                                    std::vector<HistTableTicket>* tickets) {
  std::lock_guard l(hist_state->mu);
  // None of the histograms destroyed since.
  for (auto it = r.hist_tables.begin(); it != r.hist_tables.end();) {
    auto h = hist_state->hists.find(it->first);
    if (h == hist_state->hists.end() || h->second.generation != it->second->generation)
      it = r.hist_tables.erase(it);
    else
      ++it;
  }
  for (auto& [slot, h] : hist_state->hists) {
    if (r.hist_tables.count(slot)) continue;
    int fd = -1;
    auto m = make_tables(hist_state, slot, h, r.reader.ring_count(), &fd);
    if (!m) continue;
    m->rings_high = &r.area.header()->rings_high;
    lk::HistTable msg;
    msg.slot = slot;
    msg.geometry = h.geometry;
    msg.rings = m->rings;
    msg.spare_id = spare_id;
    tickets->push_back({&r, slot, link.start_hist_table(msg, fd)});
    ::close(fd);
    h.tables.push_back(m);
    r.hist_tables[slot] = std::move(m);
  }
}

void Tracer::Impl::collect_hist_tables(AgentLink& link, std::vector<HistTableTicket>& tickets) {
  const auto deadline = std::chrono::steady_clock::now() + AgentLink::kDefaultTimeout;
  for (HistTableTicket& k : tickets)
    if (!link.collect(k.ticket, deadline).ok()) k.rings->hist_tables.erase(k.slot);
  tickets.clear();
}

bool Tracer::Impl::stacks_wanted() const {
  if (kernel_stacks.load()) return true;
  for (const auto& [id, p] : probes) {
    for (const events::TriggerSpec& t : p.spec.triggers)
      if (t.action == events::TriggerAction::kStackTrace) return true;
    for (const events::HistProgram& prog : p.spec.hists)
      if (prog.wants_stack()) return true;
  }
  return false;
}

// The tables are built on first use (a few milliseconds for libc, cached per file) and
// only while stacks are wanted: a daemon whose users never ask for stacks builds none.
// Once handed, a table stays with the process (the agent never drops one).
void Tracer::Impl::sync_unwind(Target& t) {
  if (!t.link || t.link->closed() || !stacks_wanted()) return;
  std::vector<AgentLink::Ticket> tickets;
  for (const Mapping& m : t.maps) {
    if (!m.exec || m.deleted || m.end <= m.start) continue;
    if (!t.unwind_sent.insert({m.start, m.end, m.inode, m.offset}).second) continue;
    const int fd = unwind_tables.fd_for(t.pid, m);
    if (fd < 0) continue;  // no .eh_frame, or past the limits: frame pointers there
    tickets.push_back(t.link->start_table(lk::MsgType::kUnwind, lk::Unwind{m.start, m.end}, fd));
    ::close(fd);
  }
  for (const AgentLink::Ticket& k : tickets)
    (void)t.link->collect(k, std::chrono::steady_clock::now() + AgentLink::kDefaultTimeout);
}

void Tracer::Impl::sync_hists(Target& t) {
  if (!t.link || t.link->closed() || !t.rings) return;
  if (t.link->hello().abi_version < 5) return;
  sync_unwind(t);
  std::vector<HistTableTicket> tables;
  give_hist_tables(*t.rings, *t.link, 0, &tables);
  for (uint32_t id : t.spares)
    if (auto s = spares.find(id); s != spares.end() && s->second.rings)
      give_hist_tables(*s->second.rings, *t.link, id, &tables);
  collect_hist_tables(*t.link, tables);
  std::vector<AgentLink::Ticket> tickets;
  for (auto& [id, sites] : t.sites) {
    auto p = probes.find(id);
    if (p == probes.end() || p->second.hist_generation == 0) continue;
    lk::SetHist sh;
    sh.record = (p->second.spec.buffers & 1) != 0;
    sh.instances = p->second.spec.buffers & lk::kInstanceBuffers;
    const auto& filters = p->second.spec.instance_filters;
    for (uint32_t b = 1; b < filters.size(); ++b) {
      if (!filters[b]) continue;
      sh.instance_filters.resize(b + 1u);
      sh.instance_filters[b] = *filters[b];
    }
    sh.soft = p->second.spec.soft;
    sh.triggers = p->second.spec.triggers;
    sh.clock = hist_clock();
    {
      std::lock_guard l(hist_state->mu);
      for (const events::HistProgram& prog : p->second.spec.hists) {
        auto h = hist_state->hists.find(prog.slot);
        if (h == hist_state->hists.end()) continue;
        sh.programs.push_back(prog);
        sh.geometries.push_back(h->second.geometry);
      }
    }
    for (const Site& s : sites) {
      uint64_t& sent = t.hist_sent[s.agent_id];
      if (sent == p->second.hist_generation) continue;
      sent = p->second.hist_generation;
      sh.probe_id = s.agent_id;
      tickets.push_back(t.link->start(lk::MsgType::kSetHist, sh));
    }
  }
  // Synthetic events: the ones gone, then the ones changed since this target was told.
  for (auto it = t.synth_sent.begin(); it != t.synth_sent.end();) {
    if (synths.count(it->first)) {
      ++it;
      continue;
    }
    lk::SetHist sh;
    sh.synth_id = it->first;
    sh.synth_size = 8;
    sh.record = false;
    tickets.push_back(t.link->start(lk::MsgType::kSetHist, sh));
    it = t.synth_sent.erase(it);
  }
  for (const auto& [id, sy] : synths) {
    // Its records come from any target its actions run in: theirs to write.
    allow_event(t, id);
    uint64_t& sent = t.synth_sent[id];
    if (sent == sy.generation) continue;
    sent = sy.generation;
    lk::SetHist sh;
    sh.synth_id = id;
    sh.synth_size = sy.spec.size;
    sh.record = sy.spec.record;
    sh.synth_filter = sy.spec.filter;
    sh.clock = hist_clock();
    {
      std::lock_guard l(hist_state->mu);
      for (const events::HistProgram& prog : sy.spec.hists) {
        auto h = hist_state->hists.find(prog.slot);
        if (h == hist_state->hists.end()) continue;
        sh.programs.push_back(prog);
        sh.geometries.push_back(h->second.geometry);
      }
    }
    tickets.push_back(t.link->start(lk::MsgType::kSetHist, sh));
  }
  for (const AgentLink::Ticket& k : tickets)
    (void)t.link->collect(k, std::chrono::steady_clock::now() + AgentLink::kDefaultTimeout);
}

events::HistClock Tracer::Impl::hist_clock() {
  if (hist_clock_.mult == 0) {
    timespec ts{};
    const uint64_t tsc = events::ring_detail::read_tsc();
    ::clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    hist_clock_.anchor_tsc = tsc;
    hist_clock_.anchor_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                            static_cast<uint64_t>(ts.tv_nsec);
    hist_clock_.mult = events::tsc_ns_mult();
  }
  return hist_clock_;
}

int Tracer::set_synth(uint16_t event_id, SynthSpec spec) {
  if (event_id == 0 || spec.size < 8 || spec.size % 8 != 0 ||
      spec.hists.size() > events::kHistMaxPerEvent)
    return -EINVAL;
  std::lock_guard lock(impl_->mu);
  Impl::Synth& sy = impl_->synths[event_id];
  sy.spec = std::move(spec);
  sy.generation = impl_->next_synth_generation++;
  for (auto& [pid, t] : impl_->targets) impl_->sync_hists(*t);
  return 0;
}

void Tracer::remove_synth(uint16_t event_id) {
  std::lock_guard lock(impl_->mu);
  if (!impl_->synths.erase(event_id)) return;
  for (auto& [pid, t] : impl_->targets) impl_->sync_hists(*t);
}

int Tracer::set_hists(ProbeId id, std::vector<events::HistProgram> programs,
                      std::vector<events::TriggerSpec> triggers, uint32_t soft) {
  if (programs.size() > events::kHistMaxPerEvent || triggers.size() > events::kMaxHitTriggers)
    return -EINVAL;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->probes.find(id);
  if (it == impl_->probes.end()) return -ENOENT;
  it->second.spec.hists = std::move(programs);
  it->second.spec.triggers = std::move(triggers);
  it->second.spec.soft = soft;
  ++it->second.hist_generation;
  for (auto& [pid, t] : impl_->targets) impl_->sync_hists(*t);
  return 0;
}

int Tracer::set_probe_buffers(ProbeId id, uint32_t buffers) {
  if (buffers & ~(lk::kInstanceBuffers | 1u)) return -EINVAL;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->probes.find(id);
  if (it == impl_->probes.end()) return -ENOENT;
  if (it->second.spec.buffers == buffers) return 0;
  it->second.spec.buffers = buffers;
  ++it->second.hist_generation;
  for (auto& [pid, t] : impl_->targets) impl_->sync_hists(*t);
  return 0;
}

int Tracer::set_instance_filter(ProbeId id, uint32_t buffer,
                                std::shared_ptr<const events::CompiledFilter> f) {
  if (buffer == 0 || buffer >= events::kRingMaxBuffers) return -EINVAL;
  std::lock_guard lock(impl_->mu);
  auto it = impl_->probes.find(id);
  if (it == impl_->probes.end()) return -ENOENT;
  auto& filters = it->second.spec.instance_filters;
  if (filters.size() <= buffer) {
    if (!f) return 0;
    filters.resize(buffer + 1u);
  }
  if (filters[buffer] == f) return 0;
  filters[buffer] = std::move(f);
  ++it->second.hist_generation;
  for (auto& [pid, t] : impl_->targets) impl_->sync_hists(*t);
  return 0;
}

int Tracer::create_hist(const events::HistGeometry& geometry, uint32_t* slot) {
  std::lock_guard lock(impl_->mu);
  {
    std::lock_guard l(impl_->hist_state->mu);
    HistState& st = *impl_->hist_state;
    uint32_t s = 0;
    while (s < events::kHistMaxSlots && st.hists.count(s)) ++s;
    if (s == events::kHistMaxSlots) return -ENOSPC;
    HistState::Hist& h = st.hists[s];
    h.geometry = geometry;
    h.generation = st.next_generation++;
    *slot = s;
  }
  for (auto& [pid, t] : impl_->targets) impl_->sync_hists(*t);
  return 0;
}

void Tracer::destroy_hist(uint32_t slot) {
  std::lock_guard lock(impl_->mu);
  std::shared_ptr<HistMemory> own;  // released after the locks: its end takes them
  {
    std::lock_guard ol(impl_->own_hists_mu);
    if (auto it = impl_->own_hists.find(slot); it != impl_->own_hists.end()) {
      own = std::move(it->second);
      impl_->own_hists.erase(it);
    }
  }
  {
    std::lock_guard l(impl_->hist_state->mu);
    impl_->hist_state->hists.erase(slot);
  }
  std::vector<std::pair<std::shared_ptr<AgentLink>, AgentLink::Ticket>> tickets;
  std::vector<std::shared_ptr<HistMemory>> gone;
  auto release = [&](Impl::Rings* r, const std::shared_ptr<AgentLink>& link, uint32_t spare_id) {
    if (r == nullptr) return;
    auto it = r->hist_tables.find(slot);
    if (it == r->hist_tables.end()) return;
    if (link && !link->closed()) {
      lk::HistTable msg;
      msg.slot = slot;
      msg.release = true;
      msg.geometry = it->second->geometry;
      msg.rings = it->second->rings;
      msg.spare_id = spare_id;
      tickets.emplace_back(link, link->start_hist_table(msg, -1));
    }
    gone.push_back(std::move(it->second));
    r->hist_tables.erase(it);
  };
  for (auto& [pid, t] : impl_->targets) {
    release(t->rings.get(), t->link, 0);
    for (uint32_t id : t->spares)
      if (auto s = impl_->spares.find(id); s != impl_->spares.end())
        release(s->second.rings.get(), t->link, id);
  }
  for (auto& [link, k] : tickets)
    (void)link->collect(k, std::chrono::steady_clock::now() + AgentLink::kDefaultTimeout);
  gone.clear();  // after the agents let go: the mappings fold into nothing and go
}

void Tracer::clear_hist(uint32_t slot) {
  std::vector<std::shared_ptr<HistMemory>> held;  // released after the lock: may fold
  std::lock_guard l(impl_->hist_state->mu);
  auto it = impl_->hist_state->hists.find(slot);
  if (it == impl_->hist_state->hists.end()) return;
  it->second.retained = HistSnapshot{};
  for (auto& w : it->second.tables) {
    auto m = w.lock();
    if (!m) continue;
    auto* ctl = reinterpret_cast<events::HistControl*>(m->base);
    __atomic_store_n(&ctl->epoch, ctl->epoch + 1, __ATOMIC_RELEASE);
    held.push_back(std::move(m));
  }
}

void Tracer::pause_hist(uint32_t slot, bool paused) {
  std::vector<std::shared_ptr<HistMemory>> held;
  std::lock_guard l(impl_->hist_state->mu);
  auto it = impl_->hist_state->hists.find(slot);
  if (it == impl_->hist_state->hists.end()) return;
  it->second.paused = paused;
  for (auto& w : it->second.tables) {
    auto m = w.lock();
    if (!m) continue;
    auto* ctl = reinterpret_cast<events::HistControl*>(m->base);
    __atomic_store_n(&ctl->paused, paused ? 1u : 0u, __ATOMIC_RELEASE);
    held.push_back(std::move(m));
  }
}

HistSnapshot Tracer::read_hist(uint32_t slot) {
  HistSnapshot out;
  std::vector<std::shared_ptr<HistMemory>> live;
  events::HistGeometry g;
  {
    std::lock_guard l(impl_->hist_state->mu);
    auto it = impl_->hist_state->hists.find(slot);
    if (it == impl_->hist_state->hists.end()) return out;
    out = it->second.retained;
    g = it->second.geometry;
    auto& v = it->second.tables;
    for (auto w = v.begin(); w != v.end();) {
      if (auto m = w->lock()) {
        live.push_back(std::move(m));
        ++w;
      } else {
        w = v.erase(w);  // its target went: its counts are in `retained`
      }
    }
  }
  for (const auto& m : live)
    events::hist_read_tables(m->base, m->bytes, m->rings_in_use(), g, &out.entries, &out.totals);
  live.clear();  // without the lock: a last reference folds into the retained counts
  return out;
}

std::shared_ptr<HistMemory> Tracer::Impl::own_hist_table(
    uint32_t slot, std::vector<std::shared_ptr<HistMemory>>* stale) {
  std::lock_guard l(hist_state->mu);
  auto h = hist_state->hists.find(slot);
  if (h == hist_state->hists.end()) return nullptr;
  std::shared_ptr<HistMemory>& m = own_hists[slot];
  if (m && m->generation == h->second.generation) return m;
  int fd = -1;
  // One table (the daemon's hits take turns under own_hists_mu), read as a target's.
  auto fresh = make_tables(hist_state, slot, h->second, 1, &fd);
  if (!fresh) return nullptr;
  ::close(fd);
  h->second.tables.push_back(fresh);
  // An earlier histogram's table takes hist_state->mu on its way out: not here.
  if (m) stale->push_back(std::move(m));
  m = std::move(fresh);
  return m;
}

void Tracer::count_daemon_hists(const std::vector<events::HistProgram>& programs,
                                const uint8_t* rec, uint32_t len, std::string_view comm,
                                std::vector<events::HistFired>* fired) {
  if (programs.empty() || rec == nullptr || len < 8) return;
  events::HistClock clock;
  {
    std::lock_guard lock(impl_->mu);
    clock = impl_->hist_clock();
  }
  const uint64_t now = clock.ns(events::ring_detail::read_tsc());
  const int c = ::sched_getcpu();
  const uint32_t cpu = c < 0 ? 0 : static_cast<uint32_t>(c);
  char name[events::kHistCommBytes] = {};
  std::memcpy(name, comm.data(), std::min(comm.size(), sizeof name - 1));
  auto comm_of = [&](char* out) { std::memcpy(out, name, sizeof name); };
  std::vector<std::shared_ptr<HistMemory>> stale;  // released after the lock
  std::lock_guard ol(impl_->own_hists_mu);
  for (const events::HistProgram& p : programs) {
    if (p.filter) {
      events::FilterContext fc;
      fc.cpu = cpu;
      fc.comm = name;
      if (!events::filter_match(*p.filter, rec, len, fc)) continue;
    }
    std::shared_ptr<HistMemory> m = impl_->own_hist_table(p.slot, &stale);
    if (!m) continue;
    const events::HistShape g(m->geometry);
    auto* ctl = reinterpret_cast<const events::HistControl*>(m->base);
    uint8_t* table = m->base + events::kHistControlBytes;
    if (!p.inter_event()) {
      (void)events::hist_update(p, g, ctl, table, rec, len, cpu, nullptr, comm_of);
      continue;
    }
    std::shared_ptr<HistMemory> held[events::kHistMaxVarRefs];
    events::HistShape shapes[events::kHistMaxVarRefs];
    events::HistRefTable refs[events::kHistMaxVarRefs] = {};
    for (uint32_t r = 0; r < p.nrefs && r < events::kHistMaxVarRefs; ++r) {
      held[r] = impl_->own_hist_table(p.refs[r].slot, &stale);
      if (!held[r]) continue;
      shapes[r] = events::HistShape(held[r]->geometry);
      refs[r] = {held[r]->base + events::kHistControlBytes,
                 reinterpret_cast<const events::HistControl*>(held[r]->base), &shapes[r]};
    }
    events::HistFired f;
    f.synth_id = 0;
    (void)events::hist_update_inter(p, g, ctl, table, rec, len, cpu, nullptr, now, refs, comm_of,
                                    &f);
    if (f.synth_id != 0) fired->push_back(f);
  }
}

}  // namespace probefs::tracee
