// The records room: the ring areas (one per target, one of the daemon's own) and their
// readers; the merger that hands records out in timestamp order, admit_record that
// decides what a target had any business writing, consuming and walking records, clearing
// them, the trace clock, the buffer size, trace_marker's ring, and the names
// (threads, symbols) kept for the records of departed targets.
//
// Locks (tracee/tracer_impl.h): read_mu guards the areas read and everything a reader
// touches, and symbolizer() reads the areas alone; marker_mu the daemon's own ring's
// producer. A new area for a target, and a new buffer size, are made under mu (the
// targets room's), read_mu taken after it. No request to an agent is made with read_mu
// held: readers of records never wait for one.

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cerrno>
#include <cstring>

#include "tracee/proc_info.h"
#include "tracee/tracer_impl.h"

namespace probefs::tracee {

using std::chrono::milliseconds;

namespace {

// Names of threads whose rings were freed, kept for comm_of (the newest this many): their
// records may still be held by a reader that consumed them and prints them later.
constexpr size_t kSavedComms = 4096;
// Symbolizers of departed targets whose ring areas were freed, kept for symbolizer() (the
// newest this many), for the same readers.
constexpr size_t kDepartedSymbolizers = 16;

}  // namespace

// Room for one more target area under opts.max_targets: pushes out the unread records of
// the departed targets that came first, as many as it takes. false when every area
// belongs to a live target. mu held; takes read_mu.
bool Tracer::Impl::make_room_for_target() {
  const std::set<Rings*> live = live_rings();
  std::lock_guard rl(read_mu);
  const size_t limit = std::max<uint32_t>(opts.max_targets, 1);
  if (target_areas() < limit) return true;
  free_drained_rings(live);  // what the service thread has not freed yet
  size_t excess = target_areas() >= limit ? target_areas() - limit + 1 : 0;
  for (const std::shared_ptr<Rings>& r : rings) {
    if (excess == 0) break;
    if (live.count(r.get()) || r == own) continue;
    for (uint32_t b = 0; b < buffers.size(); ++b)
      buffers[b].dropped_gone += r->reader.entries(static_cast<int>(b)) +
                                 r->reader.dropped(static_cast<int>(b));
    r->reader.clear();
    --excess;
  }
  free_drained_rings(live);
  return target_areas() < limit;
}

namespace {

// What every target may write besides its events' records (sorted, as event_ids).
std::vector<uint16_t> target_record_ids() {
  std::vector<uint16_t> ids = {events::kKernelStackEventId, events::kUserStackEventId,
                               events::kSnapshotRequestEventId};
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

// A new ring area for a target (pid 0: the daemon's own, one ring), registered with the
// readers. nullptr on failure.
std::shared_ptr<Tracer::Impl::Rings> Tracer::Impl::new_rings(pid_t pid, int* err) {
  if (pid != 0 && !make_room_for_target()) {
    *err = -ENOSPC;
    return nullptr;
  }
  std::shared_ptr<Rings> r = make_rings(pid, err);
  if (!r) return nullptr;
  std::lock_guard rl(read_mu);
  // The clock and the switch as they are now: either may have changed since the area was
  // made, and from here on their setters see this area.
  events::ring_set_stamp_mode(r->area.header(), stamp_mode());
  events::ring_set_stack_options(r->area.header(), stack_options);
  // The stack records a target writes after its events' (options/stacktrace...), and its
  // snapshot triggers' requests.
  if (pid != 0) r->event_ids = target_record_ids();
  read_rings(r, pid);
  return r;
}

// A spare area for `owner` (SPARE): kept current with the clock and the switch like
// the areas read, and read only once a fork child takes it (adopt_spare). Takes read_mu.
std::shared_ptr<Tracer::Impl::Rings> Tracer::Impl::new_spare_rings(pid_t owner, int* err) {
  std::shared_ptr<Rings> r = make_rings(owner, err);
  if (!r) return nullptr;
  std::lock_guard rl(read_mu);
  events::ring_set_stamp_mode(r->area.header(), stamp_mode());
  events::ring_set_stack_options(r->area.header(), stack_options);
  // The stack records its fork child writes after its events', as a target's own area.
  r->event_ids = target_record_ids();
  spare_rings.push_back(r);
  return r;
}

// The spare area r, taken by fork child `pid`: read from now on, as that process's.
// read_mu held.
void Tracer::Impl::adopt_spare_rings(const std::shared_ptr<Rings>& r, pid_t pid) {
  std::erase(spare_rings, r);
  r->reader.set_pid(pid);
  read_rings(r, pid);
}

// An area of `pid`'s (0: the daemon's own) made and attached, read by nobody yet. Takes
// read_mu.
std::shared_ptr<Tracer::Impl::Rings> Tracer::Impl::make_rings(pid_t pid, int* err) {
  auto r = std::make_shared<Rings>();
  events::RingGeometry g;
  g.ring_count = pid != 0 ? opts.rings_per_target : events::kRingMaxBuffers;
  g.ring_bytes = buffer_kb.load() * 1024;
  g.probe_slots = pid != 0 ? kProbeSlots : 8;
  uint32_t mode;
  {
    std::lock_guard rl(read_mu);
    mode = stamp_mode();
  }
  if ((*err = events::RingArea::create(g, mode, &r->area)) != 0) return nullptr;
  if ((*err = r->reader.attach(r->area.mem(), r->area.size(), pid != 0 ? pid : getpid())) != 0)
    return nullptr;
  return r;
}

// r joins the areas read, as `pid`'s. read_mu held.
void Tracer::Impl::read_rings(const std::shared_ptr<Rings>& r, pid_t pid) {
  r->pid = pid;
  r->tag = next_tag++;
  tag_pid.resize(r->tag + 1);
  tag_pid[r->tag] = pid;
  tag_rings.resize(r->tag + 1, nullptr);
  tag_rings[r->tag] = r.get();
  r->owners.resize(r->reader.ring_count());
  rings.push_back(r);
  for (Buffer& b : buffers) {
    if (!b.active) continue;
    b.merger.add(&r->reader, r->tag);
    b.peeker.add(&r->reader, r->tag);
  }
  // A reader asleep in wait_for_records waits on the areas there were: it wakes to wait
  // on this one too, before the new target's first records can fill its rings.
  if (own) {
    events::RingAreaHeader* h = own->area.header();
    __atomic_store_n(&h->sleeping, 1u, __ATOMIC_RELEASE);
    events::ring_wake(h);
  }
}

// Remembers the name of thread `tid` of `pid`, whose ring is being freed. read_mu held.
void Tracer::Impl::save_comm(pid_t pid, uint32_t tid, std::string comm) {
  const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 32 | tid;
  if (!saved_comms.insert_or_assign(key, std::move(comm)).second) return;
  saved_order.push_back(key);
  while (saved_order.size() > kSavedComms) {
    saved_comms.erase(saved_order.front());
    saved_order.pop_front();
  }
}

// Frees the rings of an area whose owners are gone, keeping their names. An area of a
// target that is gone, reclaimed before and not read from since, has nothing new to free.
// read_mu held.
void Tracer::Impl::reclaim_rings(Rings& r, bool live) {
  if (!live && r.reclaimed_at == r.reader.progress()) return;
  std::vector<std::pair<uint32_t, std::string>> names;
  r.reader.reclaim(&names);
  if (!live) r.reclaimed_at = r.reader.progress();
  for (auto& [tid, comm] : names) save_comm(r.pid, tid, std::move(comm));
}

// Frees areas whose target is gone and that hold nothing more, keeping the names of
// their rings' owners. read_mu held. (A waiter in wait_for_records holds its own
// references to the areas it waits on.)
void Tracer::Impl::free_drained_rings(const std::set<Rings*>& live) {
  // One pass, and one removal from the mergers for all: a traced build may leave
  // thousands of areas to free at once.
  std::vector<events::RingAreaReader*> gone;
  std::vector<std::shared_ptr<Rings>> kept, freed;
  kept.reserve(rings.size());
  for (std::shared_ptr<Rings>& sp : rings) {
    Rings* r = sp.get();
    const bool is_live = live.count(r) != 0;
    if (is_live || r->full_at == r->reader.progress() || r->reader.has_data()) {
      if (!is_live) r->full_at = r->reader.progress();
      kept.push_back(std::move(sp));
      continue;
    }
    for (uint32_t i = 0, used = r->reader.rings_used(); i < used; ++i) {
      const uint32_t tid = r->reader.owner(i) & events::kRingOwnerTidMask;
      std::string comm;
      if (tid != 0 && r->reader.owner_comm(i, tid, &comm))
        save_comm(r->pid, tid, std::move(comm));
    }
    for (uint32_t b = 0; b < buffers.size(); ++b)
      buffers[b].dropped_gone += r->reader.dropped(static_cast<int>(b));
    if (r->symbolizer) {
      std::erase_if(departed, [&](const auto& d) { return d.second == r->symbolizer; });
      departed.emplace_back(r->pid, r->symbolizer);
      if (departed.size() > kDepartedSymbolizers) departed.pop_front();
    }
    gone.push_back(&r->reader);
    tag_rings[r->tag] = nullptr;
    freed.push_back(std::move(sp));
  }
  rings = std::move(kept);
  if (gone.empty()) return;
  for (Buffer& b : buffers) {
    if (!b.active) continue;
    b.merger.remove(gone);
    b.peeker.remove(gone);
  }
  last_admitted = {};
  freed.clear();  // the readers left the mergers before their areas go
}

// Target t was given a site of event `id`: its records of that event are its own from
// now on (TraceRecord). mu held; takes read_mu.
void Tracer::Impl::allow_event(Target& t, uint16_t id) {
  if (!t.rings) return;
  std::lock_guard rl(read_mu);
  std::vector<uint16_t>& ids = t.rings->event_ids;
  auto at = std::lower_bound(ids.begin(), ids.end(), id);
  if (at == ids.end() || *at != id) ids.insert(at, id);
}

// allow_event for every probe t holds sites of. mu held; takes read_mu.
void Tracer::Impl::allow_sites(Target& t) {
  for (const auto& [id, sites] : t.sites) {
    if (sites.empty()) continue;
    if (auto p = probes.find(id); p != probes.end()) allow_event(t, p->second.spec.event_id);
  }
}

// The daemon's own area, new (at start, and for a new buffer size): the old one, if
// any, leaves the readers with its records. Takes read_mu and marker_mu.
int Tracer::Impl::new_own_rings() {
  int err = 0;
  std::shared_ptr<Rings> r = new_rings(0, &err);
  if (!r) return err;
  r->area.close_fd();  // the daemon writes it through its mapping alone
  // A ring per buffer (ring b for buffer b). The owner word names the daemon; the service
  // thread never reclaims these rings.
  events::RingProducer prod[events::kRingMaxBuffers]{};
  for (uint32_t b = 0; b < events::kRingMaxBuffers; ++b)
    if (!events::ring_claim(r->area.header(), static_cast<uint32_t>(getpid()), &prod[b], 0,
                            nullptr, b))
      return -ENOSPC;
  std::lock_guard rl(read_mu);
  std::lock_guard ml(marker_mu);
  if (own) {
    std::erase(rings, own);
    for (Buffer& b : buffers) {
      if (!b.active) continue;
      b.merger.remove(&own->reader);
      b.peeker.remove(&own->reader);
    }
    tag_rings[own->tag] = nullptr;
    last_admitted = {};
  }
  own = std::move(r);
  for (uint32_t b = 0; b < events::kRingMaxBuffers; ++b) own_prod[b] = prod[b];
  return 0;
}

namespace {

// Until when (a boot-clock time) thread `tid` may be named as the writer of records of
// target `pid`: always (INT64_MAX) for a thread of pid now, or one that is gone (a
// short-lived thread may claim a ring, write and exit before the daemon looks); before
// the start of the thread of another process that holds the number now (with nobody
// reading, the number may come round before its records are read); never (-1) where
// the number is not one a thread may have. A record written while another process's
// thread held the number is a forgery. /proc/TID/status answers for any thread, listed or
// not.
int64_t owner_written_before(pid_t pid, uint32_t tid) {
  constexpr int64_t kAlways = INT64_MAX, kNever = -1;
  if (tid == 0 || tid > events::kRingOwnerTidMask) return kNever;
  // The common case in one system call: a thread of pid's thread group now. Otherwise
  // (gone, another process's, or not ours to signal) /proc/TID/status says.
  if (syscall(SYS_tgkill, pid, static_cast<pid_t>(tid), 0) == 0) return kAlways;
  // Tgid is in the first hundred bytes.
  ProcStatus status;
  const int err = status.read(static_cast<pid_t>(tid), 0, 1024);
  if (err == -ENOENT || err == -ESRCH) return kAlways;  // gone, or exiting as we read
  if (err < 0) return kNever;
  if (status.text().empty()) return kAlways;  // exiting as we read
  uint64_t tgid = 0;
  if (!status.number("Tgid", &tgid)) return kNever;
  if (tgid == static_cast<uint64_t>(pid)) return kAlways;
  // Another process's thread holds the number: records written before it began (its
  // start is kept in clock ticks: surely before the tick it began in).
  ProcStat stat;
  if (int e = read_proc_stat(static_cast<pid_t>(tgid), static_cast<pid_t>(tid), &stat); e != 0)
    return e == -ENOENT || e == -ESRCH ? kAlways : kNever;  // gone as we looked
  static const long ticks_per_s = sysconf(_SC_CLK_TCK);
  if (ticks_per_s <= 0) return kNever;
  return static_cast<int64_t>(stat.start) * (int64_t{1'000'000'000} / ticks_per_s);
}

// The record's facts, from the daemon's own knowledge (TraceRecord), and whether the
// target had any business writing it. A consumer counts what it rejects and hands a lost
// count the rejected record carried on to the next record it returns; a walk (`trace`)
// only skips. read_mu held.
// out's pid and tid in one store: a consumer loads them together (its key of the thread),
// and one load over two narrower stores waits for both to reach the cache, every record.
void store_thread(TraceRecord* out, pid_t pid, pid_t tid) {
  static_assert(offsetof(TraceRecord, tid) == offsetof(TraceRecord, pid) + sizeof(pid_t));
  const uint64_t both =
      static_cast<uint32_t>(pid) | uint64_t{static_cast<uint32_t>(tid)} << 32;
  std::memcpy(reinterpret_cast<unsigned char*>(out) + offsetof(TraceRecord, pid), &both, 8);
}

bool admit_record(Tracer::Impl& impl, Tracer::Impl::Buffer& buf, const events::RingRecord& rr,
                  TraceRecord* out, bool consuming) {
  Tracer::Impl::Rings* r = rr.tag < impl.tag_rings.size() ? impl.tag_rings[rr.tag] : nullptr;
  const pid_t pid = rr.tag < impl.tag_pid.size() ? impl.tag_pid[rr.tag] : 0;
  pid_t tid = 0;
  out->cpu = rr.cpu;
  out->data = rr.payload.data();
  out->len = static_cast<uint32_t>(rr.payload.size());
  out->lost_before = rr.lost_before + (consuming ? buf.rejected_lost : 0);
  // Records of the target's threads that found no ring: lost before its next record (of
  // the top level's buffer).
  if (consuming && r != nullptr && r->pid != 0 && &buf == &impl.buffers[0])
    out->lost_before += r->reader.take_unowned_lost();
  bool ok = r != nullptr && out->len >= 8;
  out->id = 0;
  if (ok && r->pid == 0) {
    int32_t writer;  // the daemon's own record names its writer
    std::memcpy(&writer, out->data + 4, 4);
    tid = writer;
  } else if (ok) {
    tid = static_cast<pid_t>(rr.tid);
    uint16_t id;
    std::memcpy(&id, out->data, 2);
    out->id = id;
    // A run of one thread's records of one event is the common case: the last verdict.
    Tracer::Impl::LastAdmitted& last = impl.last_admitted;
    if (last.rings != r || last.ring != rr.ring || last.tid != rr.tid || last.id != id) {
      ok = std::binary_search(r->event_ids.begin(), r->event_ids.end(), id);
      bool always = true;  // the verdict holds for the thread's later records too
      if (ok && rr.ring < r->owners.size()) {
        Tracer::Impl::Rings::OwnerCheck& c = r->owners[rr.ring];
        const bool first = c.tid != rr.tid;
        if (first) c = {rr.tid, owner_written_before(r->pid, rr.tid)};
        // A number another process holds now: each record by its own time.
        always = c.until_ns == INT64_MAX;
        ok = always || (c.until_ns >= 0 && !rr.counter_stamp &&
                        static_cast<int64_t>(impl.boot_conv.convert(rr.stamp, false)) < c.until_ns);
        // Its name, for once it is gone: its owner record's, or the ring's (a thread that
        // comes after it may take the ring over, name and all).
        std::string comm;
        if (ok && first && rr.named)
          impl.save_comm(r->pid, rr.tid,
                         std::string(rr.comm, strnlen(rr.comm, events::kRingCommBytes - 1)));
        else if (ok && first && r->reader.owner_comm(rr.ring, rr.tid, &comm))
          impl.save_comm(r->pid, rr.tid, std::move(comm));
      }
      if (ok && always) last = {r, rr.ring, rr.tid, id};
    }
  }
  store_thread(out, pid, tid);
  if (!consuming) {
    if (ok) out->ts_ns = impl.conv.convert(rr.stamp, rr.counter_stamp);
    return ok;
  }
  if (!ok) {
    if (buf.rejected.size() <= rr.cpu && rr.cpu < events::kRingMaxCount)
      buf.rejected.resize(rr.cpu + 1);
    if (rr.cpu < buf.rejected.size()) ++buf.rejected[rr.cpu];
    buf.rejected_lost = out->lost_before;
    return false;
  }
  buf.rejected_lost = 0;
  out->ts_ns = impl.conv.convert(rr.stamp, rr.counter_stamp);
  return true;
}

}  // namespace

int Tracer::write_record(const void* data, uint32_t len, uint32_t buffer) {
  if (data == nullptr || len == 0 || buffer >= events::kRingMaxBuffers) return -EINVAL;
  std::lock_guard ml(impl_->marker_mu);
  events::RingProducer* p = &impl_->own_prod[buffer];
  // Room for the header and a lost count: what can never fit is refused, not lost.
  if (uint64_t{len} + events::kRingRecordHeaderSize + 16 > p->size) return -EINVAL;
  // The kernel's trace_marker with tracing_on 0: "as if not open for write".
  if (events::control_tracing_off(impl_->control.page, buffer)) return -EBADF;
  void* rec = events::ring_reserve(p, len);  // stamped here, on this CPU, in the area's mode
  if (rec == nullptr) return -ENOSPC;        // counted as lost, like a target's full ring
  // Writers on different CPUs take turns on one ring: a TSC a few cycles behind the
  // previous writer's (the CPUs' counters differ by that much) is raised to it, so that
  // the ring stays in stamp order, as each of the kernel's per-CPU buffers is.
  auto* h = reinterpret_cast<events::RingRecordHeader*>(p->data + p->pending_off);
  if (!(h->flags & events::kRingFlagCounterStamp)) {
    h->stamp = std::max(h->stamp, impl_->own_last_tsc[buffer]);
    impl_->own_last_tsc[buffer] = h->stamp;
  }
  std::memcpy(rec, data, len);
  events::ring_commit(p, len);
  // The reader's wake: a full fence here stands for the barrier the targets' producers
  // get from the reader's membarrier (the daemon does not register for it).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  events::ring_wake(p->area);
  return 0;
}

bool Tracer::next_record(TraceRecord* out) {
  std::lock_guard rl(impl_->read_mu);
  events::RingRecord rr;
  Impl::Buffer& b = impl_->buffers[0];
  for (;;) {
    if (!b.merger.next(&rr)) {
      b.merger.publish();  // the room of what was read goes back to the producers
      return false;
    }
    if (admit_record(*impl_, b, rr, out, true)) return true;
  }
}

namespace {

// Records of a run (RingMerger::next_run) behind `first`, which admit_record admitted as
// `admitted`: the same ring and thread. The verdict on the thread's last record holds
// while the event is the same; anything else is admit_record's to decide. (Records of
// threads that found no ring are reported before the next record admit_record takes.)

// Whether the verdict admit_record gave `first` (as `admitted`) still holds for its
// thread: true until a record of the run goes to admit_record and changes it.
bool run_verdict_holds(const Tracer::Impl& impl, const Tracer::Impl::Buffer& buf,
                       const events::RingRecord& first, const TraceRecord& admitted) {
  const Tracer::Impl::LastAdmitted& last = impl.last_admitted;
  return admitted.pid != 0 && buf.rejected_lost == 0 && last.ring == first.ring &&
         last.tid == first.tid && last.rings == impl.tag_rings[first.tag];
}

// A record of a run under a verdict that holds, of the event last admitted: the
// thread's facts, its stamp converted. false for another event (or too short to be one).
inline bool admit_under_verdict(const Tracer::Impl& impl, const TraceRecord& admitted,
                                const events::RingRunRecord& rec, TraceRecord* out) {
  if (rec.len < 8) return false;
  uint16_t id;
  std::memcpy(&id, rec.payload, 2);
  if (id != impl.last_admitted.id) return false;
  out->pid = admitted.pid;
  out->tid = admitted.tid;
  out->cpu = rec.cpu;
  out->data = rec.payload;
  out->len = rec.len;
  out->lost_before = 0;
  out->id = id;
  out->ts_ns = impl.conv.convert(rec.stamp, rec.counter_stamp);
  return true;
}

// A record of the run that the verdict does not cover, decided by admit_record as the
// record it is: `first`'s ring and thread, its own stamp, bytes and CPU.
bool admit_run_record(Tracer::Impl& impl, Tracer::Impl::Buffer& buf,
                      const events::RingRecord& first, const events::RingRunRecord& rec,
                      TraceRecord* out) {
  events::RingRecord rr = first;
  rr.stamp = rec.stamp;
  rr.lost_before = 0;
  rr.cpu = rec.cpu;
  rr.counter_stamp = rec.counter_stamp;
  rr.named = false;
  rr.payload = std::span<const uint8_t>(rec.payload, rec.len);
  return admit_record(impl, buf, rr, out, true);
}

}  // namespace

size_t Tracer::consume_records(const std::function<bool(const TraceRecord&)>& fn,
                               size_t max, int cpu, uint32_t buffer) {
  if (buffer >= impl_->buffers.size()) return 0;
  std::lock_guard rl(impl_->read_mu);
  Impl::Buffer& b = impl_->read_buffer(buffer);
  size_t n = 0;
  events::RingRecord rr;
  TraceRecord t;
  while (n < max && b.merger.next(&rr, cpu)) {
    if (!admit_record(*impl_, b, rr, &t, true)) continue;
    ++n;
    if (!fn(t)) break;
  }
  b.merger.publish();
  return n;
}

size_t Tracer::consume_records_in_place(
    const std::function<bool(std::span<const TraceRecord>)>& fn, size_t max, int cpu,
    uint32_t buffer, ReadPass* pass) {
  if (buffer >= impl_->buffers.size()) return 0;
  std::lock_guard rl(impl_->read_mu);
  Impl::Buffer& b = impl_->read_buffer(buffer);
  if (pass && !pass->begun) {
    pass->begun = true;
    pass->snapshots = b.merger.snapshots();
  }
  // A pass takes a fresh snapshot until it took records from one.
  auto may_refresh = [&] {
    return !pass || !pass->took || b.merger.snapshots() == pass->snapshots;
  };
  size_t n = 0;
  events::RingRecord rr;
  std::array<TraceRecord, kInPlaceBatch> batch;
  std::array<events::RingRunRecord, kInPlaceBatch> run;
  bool more = true;
  while (more && n < max) {
    size_t k = 0;
    while (k < batch.size() && n + k < max && b.merger.next_kept(&rr, cpu, may_refresh())) {
      if (pass) pass->took = true;
      TraceRecord admitted;
      if (admit_record(*impl_, b, rr, &admitted, true)) batch[k++] = admitted;
      else admitted.pid = 0;  // no verdict to follow: each record behind it is decided alone
      // The records behind it in its ring, while they are plain and its ring the oldest.
      const size_t m =
          b.merger.next_run(run.data(), std::min(batch.size() - k, max - n - k), cpu);
      bool holds = m != 0 && run_verdict_holds(*impl_, b, rr, admitted);
      for (size_t i = 0; i < m; ++i) {
        if (holds && admit_under_verdict(*impl_, admitted, run[i], &batch[k])) {
          ++k;
          continue;
        }
        if (admit_run_record(*impl_, b, rr, run[i], &batch[k])) ++k;
        holds = run_verdict_holds(*impl_, b, rr, admitted);
      }
    }
    if (k == 0) break;
    n += k;
    more = fn(std::span<const TraceRecord>(batch.data(), k)) && k == batch.size();
    b.merger.release_kept();  // their bytes are copied: the room may go to the producers
  }
  b.merger.publish();  // the rest of what was read goes back to the producers here
  return n;
}

bool Tracer::wait_for_records(int timeout_ms, int buffer) {
  std::vector<events::RingAreaReader*> readers;
  std::vector<std::shared_ptr<Impl::Rings>> hold;
  {
    std::lock_guard rl(impl_->read_mu);
    hold = impl_->rings;
  }
  for (auto& r : hold) readers.push_back(&r->reader);
  bool woken;
  if (readers.empty()) {
    std::mutex m;
    std::unique_lock l(m);
    woken = impl_->idle_cv.wait_for(l, milliseconds(timeout_ms),
                                    [&] { return impl_->interrupted.exchange(false); });
  } else {
    events::RingWaitResult r = events::ring_wait(readers, timeout_ms, buffer);
    impl_->interrupted.store(false);
    woken = r != events::RingWaitResult::kTimeout;
  }
  return woken;
}

void Tracer::interrupt_wait() {
  impl_->interrupted.store(true);
  impl_->idle_cv.notify_all();
  std::lock_guard rl(impl_->read_mu);
  for (auto& r : impl_->rings) {
    events::RingAreaHeader* h = r->area.header();
    __atomic_store_n(&h->sleeping, 1u, __ATOMIC_RELEASE);
    events::ring_wake(h);
  }
}

void Tracer::for_each_record(const std::function<void(const TraceRecord&)>& fn,
                             uint32_t buffer) {
  if (buffer >= impl_->buffers.size()) return;
  std::lock_guard rl(impl_->read_mu);
  Impl::Buffer& b = impl_->read_buffer(buffer);
  b.peeker.rewind();
  events::RingRecord rr;
  while (b.peeker.next(&rr)) {
    TraceRecord t;
    if (admit_record(*impl_, b, rr, &t, false)) fn(t);
  }
}

struct RecordWalk::State {
  explicit State(uint32_t buffer) : merger(false, static_cast<int>(buffer)), buffer(buffer) {}
  events::RingMerger merger;
  uint32_t buffer;
  // The areas the merger reads, kept alive while it may.
  std::vector<std::shared_ptr<Tracer::Impl::Rings>> areas;
};

RecordWalk::RecordWalk() = default;
RecordWalk::~RecordWalk() = default;
RecordWalk::RecordWalk(RecordWalk&&) noexcept = default;
RecordWalk& RecordWalk::operator=(RecordWalk&&) noexcept = default;

size_t Tracer::for_each_record(RecordWalk* walk,
                               const std::function<bool(const TraceRecord&)>& fn,
                               uint32_t buffer) {
  if (buffer >= impl_->buffers.size()) return 0;
  if (!walk->state_ || walk->state_->buffer != buffer)
    walk->state_ = std::make_unique<RecordWalk::State>(buffer);
  RecordWalk::State& st = *walk->state_;
  std::lock_guard rl(impl_->read_mu);
  // The areas read now: those freed since leave the walk (drained: nothing of theirs is
  // left to hand out), new ones join it at their first record not consumed.
  std::set<Impl::Rings*> now;
  for (auto& r : impl_->rings) now.insert(r.get());
  std::set<Impl::Rings*> walked;
  for (auto it = st.areas.begin(); it != st.areas.end();) {
    if (now.count(it->get())) {
      walked.insert(it->get());
      ++it;
      continue;
    }
    st.merger.remove(&(*it)->reader);
    it = st.areas.erase(it);
  }
  for (auto& r : impl_->rings) {
    if (walked.count(r.get())) continue;
    st.merger.add(&r->reader, r->tag);
    st.areas.push_back(r);
  }
  size_t n = 0;
  events::RingRecord rr;
  TraceRecord t;
  while (st.merger.next(&rr)) {
    if (!admit_record(*impl_, impl_->buffers[buffer], rr, &t, false)) continue;
    ++n;
    if (!fn(t)) break;
  }
  return n;
}

void Tracer::Impl::restart_mergers(uint32_t buffer) {
  Buffer& b = buffers[buffer];
  b.merger = events::RingMerger(true, static_cast<int>(buffer));
  b.peeker = events::RingMerger(false, static_cast<int>(buffer));
  if (b.active) {
    for (auto& r : rings) {
      b.merger.add(&r->reader, r->tag);
      b.peeker.add(&r->reader, r->tag);
    }
  }
  b.dropped_gone = 0;
  b.rejected.clear();
  b.rejected_lost = 0;
}

Tracer::Impl::Buffer& Tracer::Impl::read_buffer(uint32_t buffer) {
  Buffer& b = buffers[buffer];
  if (!b.active) {
    b.active = true;
    b.merger = events::RingMerger(true, static_cast<int>(buffer));
    b.peeker = events::RingMerger(false, static_cast<int>(buffer));
    for (auto& r : rings) {
      b.merger.add(&r->reader, r->tag);
      b.peeker.add(&r->reader, r->tag);
    }
  }
  return b;
}

void Tracer::release_buffer(uint32_t buffer) {
  if (buffer == 0 || buffer >= impl_->buffers.size()) return;
  std::lock_guard rl(impl_->read_mu);
  for (auto& r : impl_->rings) r->reader.clear(static_cast<int>(buffer));
  impl_->buffers[buffer].active = false;
  impl_->restart_mergers(buffer);  // empty ones: their lanes' memory goes
}

void Tracer::clear_records(uint32_t buffer) {
  if (buffer >= impl_->buffers.size()) return;
  std::lock_guard rl(impl_->read_mu);
  for (auto& r : impl_->rings) r->reader.clear(static_cast<int>(buffer));
  impl_->restart_mergers(buffer);
}

uint64_t Tracer::rejected_records(int cpu, uint32_t buffer) {
  if (buffer >= impl_->buffers.size()) return 0;
  std::lock_guard rl(impl_->read_mu);
  const std::vector<uint64_t>& rejected = impl_->buffers[buffer].rejected;
  if (cpu >= 0) return static_cast<size_t>(cpu) < rejected.size() ? rejected[cpu] : 0;
  uint64_t n = 0;
  for (uint64_t v : rejected) n += v;
  return n;
}

void Tracer::record_counts(uint64_t* entries, uint64_t* written, uint32_t buffer) {
  *entries = *written = 0;
  if (buffer >= impl_->buffers.size()) return;
  std::lock_guard rl(impl_->read_mu);
  uint64_t n = 0, dropped = impl_->buffers[buffer].dropped_gone;
  for (auto& r : impl_->rings) {
    n += r->reader.entries(static_cast<int>(buffer));
    dropped += r->reader.dropped(static_cast<int>(buffer));
  }
  *entries = n;
  *written = n + dropped;
}

bool Tracer::has_records(int cpu, uint32_t buffer) {
  if (buffer >= impl_->buffers.size()) return false;
  std::lock_guard rl(impl_->read_mu);
  for (auto& r : impl_->rings)
    if (r->reader.has_data(cpu, static_cast<int>(buffer))) return true;
  return false;
}

uint64_t Tracer::rings_in_use(uint32_t buffer) {
  if (buffer >= impl_->buffers.size()) return 0;
  std::lock_guard rl(impl_->read_mu);
  uint64_t n = 0;
  const int b = static_cast<int>(buffer);
  for (auto& r : impl_->rings) {
    // The daemon's own ring is always claimed (by the daemon): it counts while it holds
    // records.
    if (r == impl_->own) n += r->reader.has_data(-1, b) ? 1 : 0;
    else n += r->reader.rings_in_use(b);
  }
  return n;
}

uint64_t Tracer::rings_freed_retired() {
  std::lock_guard rl(impl_->read_mu);
  uint64_t n = 0;
  for (auto& r : impl_->rings) n += r->reader.stats().rings_freed_retired;
  return n;
}

int Tracer::set_stack_options(bool kernel_stack, bool user_stack) {
  std::unique_lock rl(impl_->read_mu);
  impl_->stack_options = (kernel_stack ? events::kRingKernelStack : 0) |
                         (user_stack ? events::kRingUserStack : 0);
  for (auto& r : impl_->rings)
    if (r->pid != 0) events::ring_set_stack_options(r->area.header(), impl_->stack_options);
  for (auto& r : impl_->spare_rings) events::ring_set_stack_options(r->area.header(), impl_->stack_options);
  rl.unlock();
  impl_->kernel_stacks.store(kernel_stack);
  if (kernel_stack) {
    std::lock_guard lock(impl_->mu);
    for (auto& [pid, t] : impl_->targets) impl_->sync_unwind(*t);
  }
  return 0;
}

int Tracer::set_trace_clock(const std::string& name) {
  events::TraceClock c;
  if (!events::parse_trace_clock(name, &c)) return -EINVAL;
  std::lock_guard rl(impl_->read_mu);
  if (int err = impl_->conv.calibrate(c); err != 0) return err;
  impl_->clock = c;
  const uint32_t mode = impl_->stamp_mode();
  for (auto& r : impl_->rings) events::ring_set_stamp_mode(r->area.header(), mode);
  for (auto& r : impl_->spare_rings) events::ring_set_stamp_mode(r->area.header(), mode);
  for (auto& r : impl_->rings) r->reader.clear();
  for (uint32_t b = 0; b < impl_->buffers.size(); ++b) impl_->restart_mergers(b);
  return 0;
}

std::string Tracer::trace_clock_text() const {
  std::lock_guard rl(impl_->read_mu);
  return events::trace_clock_file(impl_->clock);
}

int Tracer::set_buffer_size_kb(uint32_t kb) {
  if (kb == 0) return -EINVAL;
  std::lock_guard lock(impl_->mu);
  const uint32_t old = impl_->buffer_kb.load();
  impl_->buffer_kb = kb;
  events::RingGeometry g;
  g.ring_count = impl_->opts.rings_per_target;
  g.ring_bytes = kb * 1024;
  g.probe_slots = kProbeSlots;
  events::RingLayout layout;
  if (!events::ring_layout(g, &layout)) {
    impl_->buffer_kb = old;
    return -EINVAL;
  }
  if (int err = impl_->new_own_rings(); err != 0) return err;
  // Spares of the old size are let go (a fork child that took one meanwhile still joins
  // with it); each holder gets one of the new size below.
  std::vector<pid_t> held_spare;
  for (auto& [pid, t] : impl_->targets)
    if (!t->spares.empty()) held_spare.push_back(pid);
  for (pid_t pid : held_spare) impl_->let_go_spares_of(pid);
  for (auto& [pid, t] : impl_->targets) {
    if (!t->link || t->link->closed()) continue;
    int err = 0;
    std::shared_ptr<Impl::Rings> r = impl_->new_rings(pid, &err);
    if (!r) return err;
    uint32_t clk;
    {
      std::lock_guard rl(impl_->read_mu);
      clk = static_cast<uint32_t>(events::trace_clock_stamp(impl_->clock));
      // The old area's counts stay with its probes.
      for (auto& [id, sites] : t->sites) {
        auto p = impl_->probes.find(id);
        if (p != impl_->probes.end() && t->rings) {
          p->second.gone_hits += t->rings->reader.hits(p->second.slot);
          p->second.gone_misses += t->rings->reader.misses(p->second.slot);
        }
      }
      if (t->rings) {
        t->rings->reader.clear();
        r->event_ids = t->rings->event_ids;  // before the agent can write there
      }
      r->symbolizer = t->symbolizer;
    }
    LinkResult res = t->link->setup(r->area.fd(), r->area.size(), clk);
    r->area.close_fd();
    if (!res.ok()) return res.error;
    t->rings = r;
    impl_->sync_hists(*t);  // the new area's histogram tables (the old one's keep their counts)
  }
  for (pid_t pid : held_spare)
    if (auto t = impl_->targets.find(pid); t != impl_->targets.end()) impl_->hand_spare(*t->second);
  // Nothing from before stays: not what a target wrote into its old area while it was
  // switched over, nor the records of departed targets.
  std::lock_guard rl(impl_->read_mu);
  const std::set<Impl::Rings*> live = impl_->live_rings();
  for (auto& r : impl_->rings)
    if (!live.count(r.get())) r->reader.clear();
  for (Impl::Buffer& b : impl_->buffers) b.dropped_gone = 0;
  return 0;
}

uint32_t Tracer::buffer_size_kb() const {
  return impl_->buffer_kb.load();  // no lock: a resize holds mu across its agents' set-ups
}

std::shared_ptr<TargetSymbolizer> Tracer::symbolizer(pid_t pid) {
  // From the areas alone, under read_mu (a reader of records never waits for mu, held
  // across requests to agents): a target's area has its symbolizer from its set-up on,
  // and its newest area is the one of the target that holds the pid now (an exec'd
  // image's, a new buffer size's). Departed: the one its records' area keeps, then the
  // few kept since their areas were freed.
  std::lock_guard rl(impl_->read_mu);
  for (auto it = impl_->rings.rbegin(); it != impl_->rings.rend(); ++it)
    if ((*it)->pid == pid && (*it)->symbolizer) return (*it)->symbolizer;
  for (auto it = impl_->departed.rbegin(); it != impl_->departed.rend(); ++it)
    if (it->first == pid) return it->second;
  return nullptr;
}

std::vector<std::shared_ptr<TargetSymbolizer>> Tracer::symbolizers() {
  std::vector<std::shared_ptr<TargetSymbolizer>> out;
  std::lock_guard rl(impl_->read_mu);
  for (auto it = impl_->rings.rbegin(); it != impl_->rings.rend(); ++it)
    if ((*it)->symbolizer) out.push_back((*it)->symbolizer);
  for (auto it = impl_->departed.rbegin(); it != impl_->departed.rend(); ++it)
    out.push_back(it->second);
  return out;
}

std::string Tracer::comm_of(pid_t pid, pid_t tid) {
  std::string c = proc_comm(pid, tid);
  if (!c.empty() || pid <= 0 || tid <= 0) return c.empty() ? "<...>" : c;
  // Gone: the name it stored in its ring, newest area first (the ring is not freed while
  // it holds records), else the one kept when its ring was freed.
  std::lock_guard rl(impl_->read_mu);
  for (auto it = impl_->rings.rbegin(); it != impl_->rings.rend(); ++it)
    if ((*it)->pid == pid && (*it)->reader.find_comm(static_cast<uint32_t>(tid), &c)) return c;
  const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 32 |
                       static_cast<uint32_t>(tid);
  auto s = impl_->saved_comms.find(key);
  return s != impl_->saved_comms.end() ? s->second : "<...>";
}

}  // namespace probefs::tracee
