#include "tracee/tracer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "events/parse.h"
#include "events/ring_consumer.h"
#include "events/trace_clock.h"
#include "tracee/agent_link.h"
#include "tracee/inject.h"
#include "tracee/launch.h"
#include "tracee/probe_places.h"
#include "tracee/proc_info.h"

namespace probefs::tracee {

namespace lk = events::link;
using std::chrono::milliseconds;

namespace {

// Counter slots of the ring areas: one per probe, so at most this many probes at once.
constexpr uint32_t kProbeSlots = 8192;
// Names of threads whose rings were freed, kept for comm_of (the newest this many): their
// records may still be held by a reader that consumed them and prints them later.
constexpr size_t kSavedComms = 4096;
// Symbolizers of departed targets whose ring areas were freed, kept for symbolizer() (the
// newest this many), for the same readers.
constexpr size_t kDepartedSymbolizers = 16;

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

// Names addresses of one target for kprobe-style lines. It shares the target's symbols,
// so it goes on naming them after the target is gone. Any thread: the names a lookup
// returns live in the calling thread's cache, until a later lookup takes their slot.
class TargetNames final : public TargetSymbolizer {
 public:
  explicit TargetNames(std::shared_ptr<const ProcessSymbols> syms)
      : syms_(std::move(syms)), id_(next_id_.fetch_add(1, std::memory_order_relaxed)) {}

  // The note of event `event_id`'s probe at `addr` (ifunc_note), or none ("").
  void set_note(uint64_t addr, uint16_t event_id, const std::string& note) {
    std::lock_guard l(notes_mu_);
    if (note.empty()) notes_.erase({addr, event_id});
    else notes_[{addr, event_id}] = note;
    has_notes_.store(!notes_.empty(), std::memory_order_release);
  }

  bool lookup_event(uint64_t addr, uint16_t event_id, events::SymbolInfo* out) override {
    if (!lookup(addr, out)) return false;
    // Most traces have no note at all: they pay one load.
    if (!has_notes_.load(std::memory_order_acquire)) return true;
    thread_local std::string note;
    std::lock_guard l(notes_mu_);
    auto it = notes_.find({addr, event_id});
    if (it == notes_.end()) return true;
    note = it->second;
    out->note = note;
    return true;
  }

  bool lookup(uint64_t addr, events::SymbolInfo* out) override {
    // A trace names the same few addresses again and again (a probe's, its callers'):
    // each thread keeps the last answers, keyed by this symbolizer's id and the address.
    thread_local Cached cache[kCacheSlots];
    Cached& c = cache[(addr ^ (addr >> 12) ^ id_) % kCacheSlots];
    if (c.id != id_ || c.addr != addr) {
      ResolvedSymbol rs;
      c.id = 0;
      if (!syms_ || syms_->describe(addr, &rs) != 0 || rs.name.empty()) return false;
      c.name = std::move(rs.name);
      c.module = std::move(rs.module);
      c.offset = addr - rs.addr;
      c.size = rs.function.end > rs.function.start ? rs.function.end - rs.function.start : 0;
      c.id = id_;
      c.addr = addr;
    }
    out->name = c.name;
    out->offset = c.offset;
    out->size = c.size;
    out->module = c.module;
    return true;
  }

 private:
  struct Cached {
    uint64_t id = 0;  // 0: empty
    uint64_t addr = 0;
    std::string name, module;
    uint64_t offset = 0, size = 0;
  };
  static constexpr size_t kCacheSlots = 16;
  static inline std::atomic<uint64_t> next_id_{1};
  std::shared_ptr<const ProcessSymbols> syms_;
  const uint64_t id_;
  std::mutex notes_mu_;  // guards notes_; readers of any thread, the tracer's writes
  std::map<std::pair<uint64_t, uint16_t>, std::string> notes_;  // (addr, event id) -> note
  std::atomic<bool> has_notes_{false};
};

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

// Requests to many targets at once (DESIGN.md §9): each is sent as it comes, and the
// replies are collected afterwards under one deadline, so the targets work in parallel
// and a slow one costs the others nothing. A stopped target's request waits in its link
// (LinkResult::deferred), as a synchronous one would; a hung one's is -ETIMEDOUT once the
// common deadline passed. Every request started is collected (collect()), once.
class FanOut {
 public:
  FanOut() : deadline_(std::chrono::steady_clock::now() + AgentLink::kDefaultTimeout) {}

  // Starts a request; its reply's place in collect()'s answer is the number returned.
  size_t start(const std::shared_ptr<AgentLink>& link, lk::MsgType type, lk::Body body) {
    calls_.push_back({link, link->start(type, std::move(body))});
    return calls_.size() - 1;
  }

  // Every reply, in the order the requests were started.
  std::vector<LinkResult> collect() {
    std::vector<LinkResult> out;
    out.reserve(calls_.size());
    for (const Call& c : calls_) out.push_back(c.link->collect(c.ticket, deadline_));
    calls_.clear();
    return out;
  }

  // The first failure in that order, or 0; with `ignore_closed`, not a link that closed
  // meanwhile (-ENOTCONN: its target is gone, and so is what was asked of it).
  static int first_error(const std::vector<LinkResult>& rs, bool ignore_closed) {
    for (const LinkResult& r : rs)
      if (!r.ok() && !(ignore_closed && r.error == -ENOTCONN)) return r.error;
    return 0;
  }

 private:
  struct Call {
    std::shared_ptr<AgentLink> link;
    AgentLink::Ticket ticket;
  };
  std::chrono::steady_clock::time_point deadline_;
  std::vector<Call> calls_;
};

}  // namespace

struct Tracer::Impl {
  struct Probe {
    ProbeId id = 0;
    ProbeSpec spec;
    FileIdentity file;
    uint32_t slot = 0;
    bool per_target_compile = false;
    // Counts of targets that are gone.
    uint64_t gone_hits = 0;
    uint64_t gone_misses = 0;
  };

  // A probe placed in one target: one per place (a file mapped twice has two).
  struct Site {
    uint32_t agent_id = 0;
    uintptr_t addr = 0;
  };

  // One ring area and its reader. Kept until the reader is drained and no reader waits
  // on it, even after its target is gone: with the target's symbolizer, which names the
  // addresses in its records.
  struct Rings {
    events::RingArea area;
    events::RingAreaReader reader;
    pid_t pid = 0;  // 0: the daemon's own area (write_record)
    uint32_t tag = 0;
    std::shared_ptr<TargetNames> symbolizer;
    // What the target may write here (read_mu): the event ids of every probe it was
    // given a site of while this area lived (sorted; never shrinks, so that records
    // written before a probe left still pass), and per ring the owner word last checked
    // with its verdict (TraceRecord: a thread of pid, or gone).
    std::vector<uint16_t> event_ids;
    struct OwnerCheck {
      uint32_t tid = 0;
      bool ok = false;
    };
    std::vector<OwnerCheck> owners;
  };

  struct Target {
    pid_t pid = 0;
    pid_t parent = 0;
    TargetOrigin origin = TargetOrigin::kLaunched;
    bool folded = false;     // its counts joined its probes' totals
    std::chrono::steady_clock::time_point unlinked_since;  // when its link ended
    std::string exe;
    std::shared_ptr<AgentLink> link;
    std::shared_ptr<ProcessSymbols> syms;
    std::vector<Mapping> maps;
    std::shared_ptr<Rings> rings;
    std::map<ProbeId, std::vector<Site>> sites;
    // The notes of the places of its probes (ProbePlace::note), by probe and address, for
    // kprobes/list and its symbolizer: only those that have one.
    std::map<std::pair<ProbeId, uintptr_t>, std::string> notes;
    std::shared_ptr<TargetNames> symbolizer;
    // The last answers of its agent to LIST and BLACKLIST (kprobes_list, kprobes_blacklist):
    // served while they are current, and while it is stopped (a request would wait in
    // its link until it runs again: LinkResult::deferred). `list_generation` is its
    // link's list_generation() read before the LIST that gave last_list.
    std::string last_list;
    uint64_t list_generation = 0;
    bool list_known = false;
    std::string last_blacklist;
    bool blacklist_known = false;
  };

  Options opts;
  std::unique_ptr<AgentListener> listener;
  // The soft RLIMIT_NOFILE this process had before create() raised it to the hard one
  // (each target holds a link descriptor): what launched programs start with.
  uint64_t nofile_soft = 0;

  mutable std::mutex mu;  // targets, probes, switches
  std::map<ProbeId, Probe> probes;
  ProbeId next_probe = 1;
  uint32_t next_agent_id = 1;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  std::map<pid_t, std::unique_ptr<Target>> targets;
  bool armed = true;
  bool optimization = true;
  std::function<void(const TargetNotice&)> notice_listener;
  std::deque<TargetNotice> notices;  // waiting for the service thread to deliver them
  std::set<pid_t> children;          // launched by us: we reap them
  // How long a launched program's new image may take to connect after its exec.
  static constexpr std::chrono::seconds kExecGrace{10};

  // Processes refused (note_refused), newest last.
  static constexpr size_t kRefusedKept = 64;
  std::deque<TargetInfo> refused;

  // Exits: pid -> wait status, for wait_exit(); the newest kExitsKept of processes that
  // were targets (`ever`), so that a long traced build does not grow them for ever.
  static constexpr size_t kExitsKept = 8192;
  std::map<pid_t, int> exits;
  std::set<pid_t> ever;
  std::deque<pid_t> ever_order;
  std::condition_variable exit_cv;

  // Records.
  std::mutex read_mu;  // the mergers, the readers' consuming state, the converter
  std::vector<std::shared_ptr<Rings>> rings;  // every area read
  std::vector<pid_t> tag_pid;  // by tag; tags are never reused
  std::vector<Rings*> tag_rings;  // by tag: the area while it is read, else nullptr
  // Records rejected (TraceRecord) since the buffers were last emptied, by CPU; and a
  // lost count a rejected record carried, handed on with the next record returned.
  std::vector<uint64_t> rejected;
  uint64_t rejected_lost = 0;
  // The last (area, ring, owner, event) admit_record let through: the next record of the
  // same run needs no lookup. Cleared whenever an area leaves the readers.
  struct LastAdmitted {
    Rings* rings = nullptr;
    uint32_t ring = 0;
    uint32_t tid = 0;
    uint16_t id = 0;
  };
  LastAdmitted last_admitted;
  uint32_t next_tag = 1;
  events::RingMerger merger{true};
  events::RingMerger peeker{false};
  events::TraceClock clock = events::TraceClock::kLocal;
  events::TraceClockConverter conv;
  bool tracing_on = true;  // every area's record_disabled is its negation
  // Records dropped (RingAreaReader::dropped) in areas freed since the buffers were last
  // emptied: written in the trace header counts them.
  uint64_t dropped_gone = 0;
  // Names of the threads whose rings were freed (comm_of), by pid << 32 | tid, and the
  // order they came in (the oldest go first).
  std::unordered_map<uint64_t, std::string> saved_comms;
  std::deque<uint64_t> saved_order;
  // Symbolizers of departed targets whose areas were freed, oldest first.
  std::deque<std::pair<pid_t, std::shared_ptr<TargetNames>>> departed;
  // The daemon's own records (trace_marker): one ring, of the targets' size, in an area
  // of its own that the readers merge with the targets' (it is in `rings`, pid 0). Any
  // thread may write: marker_mu serialises the producer. Lock order: mu, read_mu,
  // marker_mu; write_record takes marker_mu alone.
  std::mutex marker_mu;
  std::shared_ptr<Rings> own;      // replaced (buffer size) with read_mu and marker_mu
  events::RingProducer own_prod;   // marker_mu
  uint64_t own_last_tsc = 0;       // marker_mu: the last TSC stamp written there
  std::atomic<bool> interrupted{false};
  std::condition_variable_any idle_cv;  // wait_for_records with no area at all
  uint32_t buffer_kb;

  std::thread service;
  std::atomic<bool> stop{false};

  // ---- helpers (mu held unless said) ----

  uint32_t stamp_mode() const {
    return events::ring_detect_stamp_mode(events::trace_clock_stamp(clock));
  }

  // Areas of targets (the daemon's own not counted). read_mu held.
  size_t target_areas() const { return rings.size() - (own ? 1 : 0); }

  // Room for one more target area under opts.max_targets: pushes out the unread records of
  // the departed targets that came first, as many as it takes. false when every area
  // belongs to a live target. mu held; takes read_mu.
  bool make_room_for_target() {
    const std::set<Rings*> live = live_rings();
    std::lock_guard rl(read_mu);
    const size_t limit = std::max<uint32_t>(opts.max_targets, 1);
    if (target_areas() < limit) return true;
    free_drained_rings(live);  // what the service thread has not freed yet
    size_t excess = target_areas() >= limit ? target_areas() - limit + 1 : 0;
    for (const std::shared_ptr<Rings>& r : rings) {
      if (excess == 0) break;
      if (live.count(r.get()) || r == own) continue;
      dropped_gone += r->reader.entries() + r->reader.dropped();
      r->reader.clear();
      --excess;
    }
    free_drained_rings(live);
    return target_areas() < limit;
  }

  // Whether a target may join now (make_room_for_target); *why says otherwise. mu held.
  bool target_room(std::string* why) {
    if (make_room_for_target()) return true;
    if (why)
      *why = "the target limit (" + std::to_string(opts.max_targets) +
             " traced processes) is reached";
    return false;
  }

  // A process that was refused (TargetInfo::untraced), kept for `targets` while it runs
  // and queued as a kRefused notice. mu held.
  void note_refused(pid_t pid, pid_t parent, TargetOrigin origin, const std::string& reason,
                    const std::string& why) {
    TargetInfo i;
    i.pid = pid;
    i.parent = parent;
    i.origin = origin;
    i.untraced = reason;
    refused.push_back(std::move(i));
    while (refused.size() > kRefusedKept) refused.pop_front();
    TargetNotice n;
    n.kind = TargetNotice::Kind::kRefused;
    n.pid = pid;
    n.parent = parent;
    n.reason = why;
    notices.push_back(std::move(n));
  }

  // A new ring area for a target (pid 0: the daemon's own, one ring), registered with the
  // readers. nullptr on failure.
  std::shared_ptr<Rings> new_rings(pid_t pid, int* err) {
    if (pid != 0 && !make_room_for_target()) {
      *err = -ENOSPC;
      return nullptr;
    }
    auto r = std::make_shared<Rings>();
    events::RingGeometry g;
    g.ring_count = pid != 0 ? opts.rings_per_target : 1;
    g.ring_bytes = buffer_kb * 1024;
    g.probe_slots = pid != 0 ? kProbeSlots : 8;
    uint32_t mode;
    {
      std::lock_guard rl(read_mu);
      mode = stamp_mode();
    }
    if ((*err = events::RingArea::create(g, mode, &r->area)) != 0) return nullptr;
    if ((*err = r->reader.attach(r->area.mem(), r->area.size(), pid != 0 ? pid : getpid())) != 0)
      return nullptr;
    r->pid = pid;
    std::lock_guard rl(read_mu);
    // The clock and the switch as they are now: either may have changed since `mode` was
    // read, and from here on their setters see this area.
    events::ring_set_stamp_mode(r->area.header(), stamp_mode());
    events::ring_set_record_disabled(r->area.header(), !tracing_on);
    r->tag = next_tag++;
    tag_pid.resize(r->tag + 1);
    tag_pid[r->tag] = pid;
    tag_rings.resize(r->tag + 1, nullptr);
    tag_rings[r->tag] = r.get();
    r->owners.resize(r->reader.ring_count());
    rings.push_back(r);
    merger.add(&r->reader, r->tag);
    peeker.add(&r->reader, r->tag);
    // A reader asleep in wait_for_records waits on the areas there were: it wakes to wait
    // on this one too, before the new target's first records can fill its rings.
    if (own) {
      events::RingAreaHeader* h = own->area.header();
      __atomic_store_n(&h->sleeping, 1u, __ATOMIC_RELEASE);
      events::ring_wake(h);
    }
    return r;
  }

  // Remembers the name of thread `tid` of `pid`, whose ring is being freed. read_mu held.
  void save_comm(pid_t pid, uint32_t tid, std::string comm) {
    const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 32 | tid;
    if (!saved_comms.insert_or_assign(key, std::move(comm)).second) return;
    saved_order.push_back(key);
    while (saved_order.size() > kSavedComms) {
      saved_comms.erase(saved_order.front());
      saved_order.pop_front();
    }
  }

  // Frees the rings of an area whose owners are gone, keeping their names. read_mu held.
  void reclaim_rings(Rings& r) {
    std::vector<std::pair<uint32_t, std::string>> names;
    r.reader.reclaim(&names);
    for (auto& [tid, comm] : names) save_comm(r.pid, tid, std::move(comm));
  }

  // Frees areas whose target is gone and that hold nothing more, keeping the names of
  // their rings' owners. read_mu held. (A waiter in wait_for_records holds its own
  // references to the areas it waits on.)
  void free_drained_rings(const std::set<Rings*>& live) {
    // One pass, and one removal from the mergers for all: a traced build may leave
    // thousands of areas to free at once.
    std::vector<events::RingAreaReader*> gone;
    std::vector<std::shared_ptr<Rings>> kept, freed;
    kept.reserve(rings.size());
    for (std::shared_ptr<Rings>& sp : rings) {
      Rings* r = sp.get();
      if (live.count(r) || r->reader.has_data()) {
        kept.push_back(std::move(sp));
        continue;
      }
      for (uint32_t i = 0, used = r->reader.rings_used(); i < used; ++i) {
        const uint32_t tid = r->reader.owner(i) & events::kRingOwnerTidMask;
        std::string comm;
        if (tid != 0 && r->reader.owner_comm(i, tid, &comm))
          save_comm(r->pid, tid, std::move(comm));
      }
      dropped_gone += r->reader.dropped();
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
    merger.remove(gone);
    peeker.remove(gone);
    last_admitted = {};
    freed.clear();  // the readers left the mergers before their areas go
  }

  // Target t was given a site of event `id`: its records of that event are its own from
  // now on (TraceRecord). mu held; takes read_mu.
  void allow_event(Target& t, uint16_t id) {
    if (!t.rings) return;
    std::lock_guard rl(read_mu);
    std::vector<uint16_t>& ids = t.rings->event_ids;
    auto at = std::lower_bound(ids.begin(), ids.end(), id);
    if (at == ids.end() || *at != id) ids.insert(at, id);
  }

  // allow_event for every probe t holds sites of. mu held; takes read_mu.
  void allow_sites(Target& t) {
    for (const auto& [id, sites] : t.sites) {
      if (sites.empty()) continue;
      if (auto p = probes.find(id); p != probes.end()) allow_event(t, p->second.spec.event_id);
    }
  }

  // The daemon's own area, new (at start, and for a new buffer size): the old one, if
  // any, leaves the readers with its records. Takes read_mu and marker_mu.
  int new_own_rings() {
    int err = 0;
    std::shared_ptr<Rings> r = new_rings(0, &err);
    if (!r) return err;
    r->area.close_fd();  // the daemon writes it through its mapping alone
    // The owner word names the daemon; the service thread never reclaims this ring.
    events::RingProducer prod{};
    if (!events::ring_claim(r->area.header(), static_cast<uint32_t>(getpid()), &prod))
      return -ENOSPC;
    std::lock_guard rl(read_mu);
    std::lock_guard ml(marker_mu);
    if (own) {
      std::erase(rings, own);
      merger.remove(&own->reader);
      peeker.remove(&own->reader);
      tag_rings[own->tag] = nullptr;
      last_admitted = {};
    }
    own = std::move(r);
    own_prod = prod;
    return 0;
  }

  std::set<Rings*> live_rings() const {
    std::set<Rings*> live;
    if (own) live.insert(own.get());
    for (const auto& [pid, t] : targets)
      if (t->rings) live.insert(t->rings.get());
    return live;
  }

  // A fork child's symbols and mappings, its parent's (it ran no code of its own yet:
  // it waits for GO), without reading /proc or opening a file. false: load them.
  bool inherit_symbols(Target& t, const Target& parent) {
    if (!parent.syms || parent.maps.empty()) return false;
    std::unique_ptr<ProcessSymbols> syms = ProcessSymbols::fork_of(*parent.syms, t.pid);
    if (!syms) return false;
    t.syms = std::move(syms);
    t.maps = parent.maps;
    t.symbolizer = std::make_shared<TargetNames>(t.syms);
    return true;
  }

  int refresh_symbols(Target& t) {
    std::vector<Mapping> maps;
    if (int err = read_maps(t.pid, &maps); err != 0) return err;
    t.maps = std::move(maps);
    if (!t.syms) {
      int err = 0;
      t.syms = ProcessSymbols::load(t.pid, &err);
      if (!t.syms) return err;
      t.symbolizer = std::make_shared<TargetNames>(t.syms);
      return 0;
    }
    return t.syms->reload();
  }

  // The DEFINE messages of probe p in target t, one per place. kError fills *diag.
  PlaceStatus build_defines(Target& t, const Probe& p, std::vector<lk::Define>* out,
                            events::Diagnostic* diag) {
    std::vector<ProbePlace> places;
    PlaceStatus st = place_probe(p.spec.def, p.file, t.maps, *t.syms, &places, diag);
    if (st != PlaceStatus::kPlaced) return st;
    const events::CompiledEvent* ev = &p.spec.compiled;
    events::CompiledEvent own;
    if (p.per_target_compile) {
      const ProcessSymbols* syms = t.syms.get();
      // `@SYM`: a variable or a function of this target, as the kernel finds kernel data.
      events::DataSymbolResolver resolve = [syms](std::string_view sym, uint64_t* addr) {
        return syms->resolve_data(sym, addr) == 0;
      };
      if (!events::compile(p.spec.def, resolve, &own, diag)) return PlaceStatus::kError;
      ev = &own;
    }
    for (const ProbePlace& place : places) {
      set_note(t, p, place.addr, place.note);
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
      out->push_back(std::move(d));
    }
    return PlaceStatus::kPlaced;
  }

  // Sends the defines; on the first failure removes what this call placed in t. 0 or the
  // agent's negative errno.
  int send_defines(Target& t, ProbeId id, uint16_t event_id, std::vector<lk::Define>& defs) {
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
  void remove_sites(FanOut& fan, Target& t, ProbeId id) {
    auto it = t.sites.find(id);
    if (it == t.sites.end()) return;
    for (const Site& s : it->second)
      if (t.link && !t.link->closed()) fan.start(t.link, lk::MsgType::kRemove, lk::ProbeRef{s.agent_id});
    t.sites.erase(it);
    if (auto p = probes.find(id); p != probes.end()) forget_notes(t, id, p->second.spec.event_id);
  }

  // Drops the notes of probe `id` (of event `event_id`) in t. mu held.
  void forget_notes(Target& t, ProbeId id, uint16_t event_id) {
    for (auto n = t.notes.lower_bound({id, 0}); n != t.notes.end() && n->first.first == id;) {
      if (t.symbolizer) t.symbolizer->set_note(n->first.second, event_id, "");
      n = t.notes.erase(n);
    }
  }

  // Keeps the note of probe p's place at addr in t (none: ""), for kprobes/list and
  // trace lines. mu held.
  void set_note(Target& t, const Probe& p, uintptr_t addr, const std::string& note) {
    if (note.empty()) t.notes.erase({p.id, addr});
    else t.notes[{p.id, addr}] = note;
    if (t.symbolizer) t.symbolizer->set_note(addr, p.spec.event_id, note);
  }

  // Places every probe not yet placed in t (a new target, or objects mapped since).
  // Failures in one target leave the probe out of it (the definition stands elsewhere).
  void place_pending(Target& t, std::vector<lk::Define>* collect,
                     std::vector<ProbeId>* collect_ids) {
    for (auto& [id, p] : probes) {
      if (t.sites.count(id)) continue;
      std::vector<lk::Define> defs;
      events::Diagnostic diag;
      if (build_defines(t, p, &defs, &diag) != PlaceStatus::kPlaced) continue;
      if (collect) {
        for (auto& d : defs) {
          d.probe_id = next_agent_id++;
          collect_ids->push_back(id);
          collect->push_back(std::move(d));
        }
      } else {
        (void)send_defines(t, id, p.spec.event_id, defs);
      }
    }
  }

  // Makes t a working target: symbols, ring area, switches, every probe. mu held.
  int set_up(Target& t, std::string* error, const Target* parent = nullptr) {
    const bool inherited = parent != nullptr && inherit_symbols(t, *parent);
    if (int err = inherited ? 0 : refresh_symbols(t); err != 0) {
      if (error) *error = "cannot read the symbols of pid " + std::to_string(t.pid);
      return err;
    }
    for (const auto& [key, note] : t.notes) {  // a fork child's, from its parent
      if (auto p = probes.find(key.first); p != probes.end())
        t.symbolizer->set_note(key.second, p->second.spec.event_id, note);
    }
    int err = 0;
    t.rings = new_rings(t.pid, &err);
    if (!t.rings) {
      if (err == -ENOSPC) (void)target_room(error);  // says which limit
      else if (error) *error = "cannot create the ring area: " + std::string(strerror(-err));
      return err;
    }
    allow_sites(t);  // a fork child's, inherited
    uint32_t clk;
    {
      std::lock_guard rl(read_mu);
      t.rings->symbolizer = t.symbolizer;
      clk = static_cast<uint32_t>(events::trace_clock_stamp(clock));
    }
    LinkResult r = t.link->setup(t.rings->area.fd(), t.rings->area.size(), clk);
    t.rings->area.close_fd();  // the agent holds its own now; the mapping stays
    if (!r.ok()) {
      if (error) *error = "agent refused its ring area: " + r.message;
      return r.error;
    }
    if (!armed) (void)t.link->disarm_all();
    if (!optimization) (void)t.link->set_optimization(false);
    t.exe = inherited ? parent->exe : proc_exe(t.pid);
    place_all_pending(t);
    return 0;
  }

  // place_pending for a target that waits for GO: every DEFINE goes out at once and the
  // replies are collected after (one round trip, not one per place). A probe one of whose
  // places failed leaves the target, as send_defines does it. mu held.
  void place_all_pending(Target& t) {
    std::vector<lk::Define> defs;
    std::vector<ProbeId> ids;
    place_pending(t, &defs, &ids);
    if (defs.empty()) return;
    // Allowed before the DEFINEs go: their probes may fire before the replies come.
    for (const lk::Define& d : defs) allow_event(t, d.event_id);
    std::vector<AgentLink::Ticket> tickets;
    tickets.reserve(defs.size());
    for (const lk::Define& d : defs) tickets.push_back(t.link->start(lk::MsgType::kDefine, d));
    std::vector<bool> ok(defs.size());
    std::set<ProbeId> failed;
    for (size_t i = 0; i < defs.size(); ++i) {
      ok[i] = t.link->collect(tickets[i], std::chrono::steady_clock::time_point::max()).ok();
      if (!ok[i]) failed.insert(ids[i]);
    }
    for (size_t i = 0; i < defs.size(); ++i) {
      if (!ok[i]) continue;
      if (failed.count(ids[i])) (void)t.link->remove(defs[i].probe_id);
      else t.sites[ids[i]].push_back({defs[i].probe_id, defs[i].address});
    }
    for (ProbeId id : failed)
      if (auto p = probes.find(id); p != probes.end()) forget_notes(t, id, p->second.spec.event_id);
  }

  Target* target_of_link(const std::shared_ptr<AgentLink>& link) {
    for (auto& [pid, t] : targets)
      if (t->link == link) return t.get();
    return nullptr;
  }

  void record_exit(pid_t pid, int status) {
    exits[pid] = status;
    exit_cv.notify_all();
  }

  // pid is (or was) a target: wait_exit knows it. mu held.
  void remember(pid_t pid) {
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
  // lock held (a listener may call back in). mu held.
  void queue_notice(TargetNotice::Kind kind, pid_t pid, pid_t parent = 0, int status = -1) {
    TargetNotice n;
    n.kind = kind;
    n.pid = pid;
    n.parent = parent;
    n.status = status;
    notices.push_back(n);
  }

  void deliver_notices() {
    std::deque<TargetNotice> out;
    std::function<void(const TargetNotice&)> fn;
    {
      std::lock_guard l(mu);
      out.swap(notices);
      fn = notice_listener;
    }
    if (fn)
      for (const TargetNotice& n : out) fn(n);
  }

  // The target's counts join its probes' totals, once, when it stops counting (exit,
  // exec, detach). mu held.
  void fold_counts(Target& t) {
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
  void drop_target(pid_t pid, TargetNotice::Kind kind, int status) {
    auto it = targets.find(pid);
    if (it == targets.end()) return;
    fold_counts(*it->second);
    if (it->second->link) it->second->link->close();
    targets.erase(it);
    record_exit(pid, status);
    queue_notice(kind, pid, 0, status);
  }

  // A fork child's code carries the probes its parent had at the fork, under the same
  // ids. What the child really has is what it reports (PROFILE lists every probe it
  // holds): those the daemon still knows stay, the others (removed from the parent since,
  // or of a parent no longer traced) are removed; place_pending adds the ones defined
  // since. mu held.
  void adopt_inherited_probes(Target& child, const Target* parent) {
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
    for (uint32_t stale : held) (void)child.link->remove(stale);
  }

  // ---- the service thread ----

  // A fork child, an exec'd image, or a process prepared for `probefs exec`.
  void handle_connected(const std::shared_ptr<AgentLink>& link, bool prepared) {
    const lk::Hello& h = link->hello();
    std::lock_guard l(mu);
    auto t = std::make_unique<Target>();
    t->pid = link->pid();
    t->link = link;
    TargetNotice::Kind kind;
    const Target* parent_target = nullptr;  // a fork child's, whose symbols it starts with
    if (h.reason == lk::HelloReason::kFork) {
      t->parent = h.ppid;
      t->origin = TargetOrigin::kForked;
      auto parent = targets.find(h.ppid);
      parent_target = parent == targets.end() ? nullptr : parent->second.get();
      adopt_inherited_probes(*t, parent_target);
      kind = TargetNotice::Kind::kForked;
    } else if (prepared && !targets.count(t->pid)) {
      // `probefs exec`: a launched target that is not our child (nobody here reaps it).
      t->origin = TargetOrigin::kLaunched;
      kind = TargetNotice::Kind::kJoined;
    } else {
      // An exec'd image of a target: a new program, none of the old probes.
      auto old = targets.find(t->pid);
      if (old != targets.end()) {
        fold_counts(*old->second);
        t->origin = old->second->origin;
        t->parent = old->second->parent;
        if (old->second->link) old->second->link->close();
        targets.erase(old);
      }
      kind = TargetNotice::Kind::kExeced;
    }
    exits.erase(t->pid);
    remember(t->pid);
    const pid_t pid = t->pid;
    const pid_t parent = t->parent;
    Target& ref = *t;
    targets[pid] = std::move(t);
    std::string err;
    if (int e = set_up(ref, &err, parent_target); e != 0) {
      const TargetOrigin origin = ref.origin;
      ref.link->close();  // its agent lets the program run on untraced
      targets.erase(pid);
      if (e == -ENOSPC) note_refused(pid, parent, origin, "target-limit", err);
      return;
    }
    (void)ref.link->go();
    queue_notice(kind, pid, kind == TargetNotice::Kind::kForked ? parent : 0);
  }

  void handle_mapped(const LinkEvent& ev) {
    std::lock_guard l(mu);
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
    for (size_t i = 0; i < defs.size() && i < res.size(); ++i)
      if (res[i].ok()) t->sites[ids[i]].push_back({defs[i].probe_id, defs[i].address});
    if (!mapped) forget_unmapped_sites(*t);
  }

  // After dlclose: the probes of objects no longer mapped are the engine's [GONE]; they
  // are removed, so that the object's next load gets them again. mu held.
  void forget_unmapped_sites(Target& t) {
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
        if (auto p = probes.find(it->first); p != probes.end()) set_note(t, p->second, s->addr, "");
        s = v.erase(s);
      }
      it = v.empty() ? t.sites.erase(it) : std::next(it);
    }
  }

  void handle_closed(const std::shared_ptr<AgentLink>& link) {
    std::lock_guard l(mu);
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
  void sweep_unlinked() {
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<pid_t, TargetNotice::Kind>> drop;
    for (auto& [pid, t] : targets) {
      if (!t->link || !t->link->closed()) continue;
      // The link ended before its kClosed event was handled: its grace starts now (a
      // fork child that execs at once would otherwise be left before its new image
      // could connect).
      if (t->unlinked_since == std::chrono::steady_clock::time_point{}) t->unlinked_since = now;
      if (children.count(pid)) {
        if (process_running(pid) && now - t->unlinked_since > kExecGrace)
          drop.emplace_back(pid, TargetNotice::Kind::kLeft);
        continue;  // reap_children reports its exit with its status
      }
      if (!process_running(pid))
        drop.emplace_back(pid, TargetNotice::Kind::kExited);
      else if (t->origin == TargetOrigin::kAttached || now - t->unlinked_since > kExecGrace)
        drop.emplace_back(pid, TargetNotice::Kind::kLeft);
    }
    for (auto& [pid, kind] : drop) drop_target(pid, kind, -1);
  }

  // Our own children (launched targets), reaped whether they are targets still or not.
  void reap_children() {
    std::lock_guard l(mu);
    for (auto it = children.begin(); it != children.end();) {
      int st = 0;
      const pid_t pid = *it;
      if (waitpid(pid, &st, WNOHANG) != pid) {
        ++it;
        continue;
      }
      it = children.erase(it);
      if (targets.count(pid)) {
        drop_target(pid, TargetNotice::Kind::kExited, st);
      } else {
        record_exit(pid, st);
      }
    }
  }

  void service_loop() {
    auto last_tick = std::chrono::steady_clock::now();
    while (!stop.load()) {
      LinkEvent ev;
      if (listener->next_event(&ev, milliseconds(20))) {
        switch (ev.kind) {
          case LinkEvent::kConnected: handle_connected(ev.link, ev.prepared); break;
          case LinkEvent::kMapped: handle_mapped(ev); break;
          case LinkEvent::kClosed: handle_closed(ev.link); break;
        }
      }
      reap_children();
      {
        std::lock_guard l(mu);
        sweep_unlinked();
      }
      deliver_notices();
      auto now = std::chrono::steady_clock::now();
      if (now - last_tick > std::chrono::seconds(1)) {
        last_tick = now;
        std::lock_guard l(mu);
        std::lock_guard rl(read_mu);
        conv.update();
        for (auto& r : rings)
          if (r != own) reclaim_rings(*r);
        free_drained_rings(live_rings());
      }
    }
  }
};

Tracer::Tracer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Tracer> Tracer::create(const Options& opts, std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  impl->buffer_kb = opts.buffer_size_kb;
  if (rlimit rl; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    impl->nofile_soft = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }
  int err = 0;
  impl->listener = AgentListener::create(&err);
  if (!impl->listener) {
    if (error) *error = "cannot listen for agents: " + std::string(strerror(-err));
    return nullptr;
  }
  if (int e = impl->conv.calibrate(impl->clock); e != 0) {
    if (error) *error = "cannot read the trace clock: " + std::string(strerror(-e));
    return nullptr;
  }
  if (int e = impl->new_own_rings(); e != 0) {
    if (error) *error = "cannot create the daemon's ring area: " + std::string(strerror(-e));
    return nullptr;
  }
  Impl* raw = impl.get();
  impl->service = std::thread([raw] { raw->service_loop(); });
  return std::unique_ptr<Tracer>(new Tracer(std::move(impl)));
}

Tracer::~Tracer() {
  {
    std::lock_guard l(impl_->mu);
    for (auto& [pid, t] : impl_->targets)
      if (t->link && !t->link->closed()) (void)t->link->detach();
  }
  impl_->stop = true;
  if (impl_->service.joinable()) impl_->service.join();
  impl_->targets.clear();
  impl_->listener.reset();
}

// ---- targets ---------------------------------------------------------------------------

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
    if (!impl_->target_room(error)) return -ENOSPC;  // before a program starts for nothing
  }
  Launched l;
  if (int err = tracee::launch(*impl_->listener, lo, &l, error); err != 0) return err;
  {
    std::lock_guard lock(impl_->mu);
    impl_->children.insert(l.pid);
    impl_->exits.erase(l.pid);
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
    auto t = std::make_unique<Impl::Target>();
    t->pid = pid;
    t->origin = TargetOrigin::kAttached;
    t->link = link;
    Impl::Target& ref = *t;
    impl_->targets[pid] = std::move(t);
    impl_->remember(pid);
    impl_->exits.erase(pid);
    if (int e = impl_->set_up(ref, error); e != 0) {
      (void)ref.link->detach();
      impl_->targets.erase(pid);
      return e;
    }
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
  auto it = impl_->targets.find(pid);
  if (it == impl_->targets.end()) return -ESRCH;
  impl_->fold_counts(*it->second);
  std::shared_ptr<AgentLink> link = it->second->link;
  impl_->targets.erase(it);
  LinkResult r = link->detach();
  impl_->listener->forget(pid);  // its later images and children stay untraced
  // A launched program that runs on untraced is still ours to reap: its exit is
  // recorded then.
  if (!impl_->children.count(pid)) impl_->record_exit(pid, -1);
  impl_->queue_notice(TargetNotice::Kind::kDetached, pid);
  if (!r.ok() && r.error != -ENOTCONN) return r.error;
  return 0;
}

std::vector<TargetInfo> Tracer::targets() const {
  std::lock_guard lock(impl_->mu);
  std::vector<TargetInfo> out;
  for (const auto& [pid, t] : impl_->targets) {
    TargetInfo i;
    i.pid = pid;
    i.parent = t->parent;
    i.origin = t->origin;
    i.exe = t->exe;
    i.comm = proc_comm(pid);
    if (t->link) i.deferred = t->link->deferred_requests();
    out.push_back(std::move(i));
  }
  for (const TargetInfo& r : impl_->refused) {
    if (impl_->targets.count(r.pid) || !process_running(r.pid)) continue;
    TargetInfo i = r;
    i.comm = proc_comm(r.pid);
    out.push_back(std::move(i));
  }
  return out;
}

int Tracer::wait_exit(pid_t pid, int timeout_ms, int* status) {
  std::unique_lock lock(impl_->mu);
  if (!impl_->ever.count(pid)) return -ESRCH;
  bool done = impl_->exit_cv.wait_for(lock, milliseconds(timeout_ms),
                                      [&] { return impl_->exits.count(pid) != 0; });
  if (!done) return -ETIMEDOUT;
  if (status) *status = impl_->exits[pid];
  return 0;
}

void Tracer::on_target_notice(std::function<void(const TargetNotice&)> listener) {
  std::lock_guard lock(impl_->mu);
  impl_->notice_listener = std::move(listener);
}

// ---- probes ----------------------------------------------------------------------------

int Tracer::define_probe(const ProbeSpec& spec, ProbeId* id, events::Diagnostic* diag) {
  std::lock_guard lock(impl_->mu);
  Impl::Probe p;
  p.spec = spec;
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
  // order) is the answer; then what the others placed is removed again.
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
    if (int e = FanOut::first_error(rs, false); e != 0) {
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

// ---- not yet built: the calls fs/ needs next ---------------------------------------------


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
                             n != t->notes.end() ? n->second : std::string());
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

// ---- records ---------------------------------------------------------------------------

namespace {

// Whether thread `tid` may be named as the writer of records of target `pid`: a thread of
// pid now, or a thread that is gone and whose number no live process holds (a short-lived
// thread may claim a ring, write and exit before the daemon looks). A number held by
// another process's thread is a forgery. /proc/TID/status answers for any thread, listed
// or not.
bool owner_is_thread_of(pid_t pid, uint32_t tid) {
  if (tid == 0 || tid > events::kRingOwnerTidMask) return false;
  // The common case in one system call: a thread of pid's thread group now. Otherwise
  // (gone, another process's, or not ours to signal) /proc/TID/status says.
  if (syscall(SYS_tgkill, pid, static_cast<pid_t>(tid), 0) == 0) return true;
  // Tgid is in the first hundred bytes.
  ProcStatus status;
  const int err = status.read(static_cast<pid_t>(tid), 0, 1024);
  if (err == -ENOENT || err == -ESRCH) return true;  // gone, or exiting as we read
  if (err < 0) return false;
  if (status.text().empty()) return true;  // exiting as we read
  uint64_t tgid = 0;
  return status.number("Tgid", &tgid) && tgid == static_cast<uint64_t>(pid);
}

// The record's facts, from the daemon's own knowledge (TraceRecord), and whether the
// target had any business writing it. A consumer counts what it rejects and hands a lost
// count the rejected record carried on to the next record it returns; a walk (`trace`)
// only skips. read_mu held.
bool admit_record(Tracer::Impl& impl, const events::RingRecord& rr, TraceRecord* out,
                  bool consuming) {
  Tracer::Impl::Rings* r = rr.tag < impl.tag_rings.size() ? impl.tag_rings[rr.tag] : nullptr;
  out->pid = rr.tag < impl.tag_pid.size() ? impl.tag_pid[rr.tag] : 0;
  out->cpu = rr.cpu;
  out->data = rr.payload.data();
  out->len = static_cast<uint32_t>(rr.payload.size());
  out->lost_before = rr.lost_before + (consuming ? impl.rejected_lost : 0);
  // Records of the target's threads that found no ring: lost before its next record.
  if (consuming && r != nullptr && r->pid != 0) out->lost_before += r->reader.take_unowned_lost();
  bool ok = r != nullptr && out->len >= 8;
  if (ok && r->pid == 0) {
    int32_t writer;  // the daemon's own record names its writer
    std::memcpy(&writer, out->data + 4, 4);
    out->tid = writer;
  } else if (ok) {
    out->tid = static_cast<pid_t>(rr.tid);
    uint16_t id;
    std::memcpy(&id, out->data, 2);
    // A run of one thread's records of one event is the common case: the last verdict.
    Tracer::Impl::LastAdmitted& last = impl.last_admitted;
    if (last.rings != r || last.ring != rr.ring || last.tid != rr.tid || last.id != id) {
      ok = std::binary_search(r->event_ids.begin(), r->event_ids.end(), id);
      if (ok && rr.ring < r->owners.size()) {
        Tracer::Impl::Rings::OwnerCheck& c = r->owners[rr.ring];
        if (c.tid != rr.tid) {
          c = {rr.tid, owner_is_thread_of(r->pid, rr.tid)};
          // Its name, for once it is gone: a thread that comes after it may take the
          // ring over, name and all, as soon as it is drained.
          std::string comm;
          if (c.ok && r->reader.owner_comm(rr.ring, rr.tid, &comm))
            impl.save_comm(r->pid, rr.tid, std::move(comm));
        }
        ok = c.ok;
      }
      if (ok) last = {r, rr.ring, rr.tid, id};
    }
  }
  if (!consuming) {
    if (ok) out->ts_ns = impl.conv.convert(rr.stamp, rr.counter_stamp);
    return ok;
  }
  if (!ok) {
    if (impl.rejected.size() <= rr.cpu && rr.cpu < events::kRingMaxCount)
      impl.rejected.resize(rr.cpu + 1);
    if (rr.cpu < impl.rejected.size()) ++impl.rejected[rr.cpu];
    impl.rejected_lost = out->lost_before;
    return false;
  }
  impl.rejected_lost = 0;
  out->ts_ns = impl.conv.convert(rr.stamp, rr.counter_stamp);
  return true;
}

}  // namespace

int Tracer::write_record(const void* data, uint32_t len) {
  if (data == nullptr || len == 0) return -EINVAL;
  std::lock_guard ml(impl_->marker_mu);
  events::RingProducer* p = &impl_->own_prod;
  // Room for the header and a lost count: what can never fit is refused, not lost.
  if (uint64_t{len} + events::kRingRecordHeaderSize + 16 > p->size) return -EINVAL;
  // The kernel's trace_marker with tracing_on 0: "as if not open for write".
  if (events::ring_record_disabled(p->area)) return -EBADF;
  void* rec = events::ring_reserve(p, len);  // stamped here, on this CPU, in the area's mode
  if (rec == nullptr) return -ENOSPC;        // counted as lost, like a target's full ring
  // Writers on different CPUs take turns on one ring: a TSC a few cycles behind the
  // previous writer's (the CPUs' counters differ by that much) is raised to it, so that
  // the ring stays in stamp order, as each of the kernel's per-CPU buffers is.
  auto* h = reinterpret_cast<events::RingRecordHeader*>(p->data + p->pending_off);
  if (!(h->flags & events::kRingFlagCounterStamp)) {
    h->stamp = std::max(h->stamp, impl_->own_last_tsc);
    impl_->own_last_tsc = h->stamp;
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
  for (;;) {
    if (!impl_->merger.next(&rr)) {
      impl_->merger.publish();  // the room of what was read goes back to the producers
      return false;
    }
    if (admit_record(*impl_, rr, out, true)) return true;
  }
}

size_t Tracer::consume_records(const std::function<bool(const TraceRecord&)>& fn,
                               size_t max, int cpu) {
  std::lock_guard rl(impl_->read_mu);
  size_t n = 0;
  events::RingRecord rr;
  TraceRecord t;
  while (n < max && impl_->merger.next(&rr, cpu)) {
    if (!admit_record(*impl_, rr, &t, true)) continue;
    ++n;
    if (!fn(t)) break;
  }
  impl_->merger.publish();
  return n;
}

bool Tracer::wait_for_records(int timeout_ms) {
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
    events::RingWaitResult r = events::ring_wait(readers, timeout_ms);
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

void Tracer::for_each_record(const std::function<void(const TraceRecord&)>& fn) {
  std::lock_guard rl(impl_->read_mu);
  impl_->peeker.rewind();
  events::RingRecord rr;
  while (impl_->peeker.next(&rr)) {
    TraceRecord t;
    if (admit_record(*impl_, rr, &t, false)) fn(t);
  }
}

struct RecordWalk::State {
  events::RingMerger merger{false};
  // The areas the merger reads, kept alive while it may.
  std::vector<std::shared_ptr<Tracer::Impl::Rings>> areas;
};

RecordWalk::RecordWalk() = default;
RecordWalk::~RecordWalk() = default;
RecordWalk::RecordWalk(RecordWalk&&) noexcept = default;
RecordWalk& RecordWalk::operator=(RecordWalk&&) noexcept = default;

size_t Tracer::for_each_record(RecordWalk* walk,
                               const std::function<bool(const TraceRecord&)>& fn) {
  if (!walk->state_) walk->state_ = std::make_unique<RecordWalk::State>();
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
    if (!admit_record(*impl_, rr, &t, false)) continue;
    ++n;
    if (!fn(t)) break;
  }
  return n;
}

void Tracer::clear_records() {
  std::lock_guard rl(impl_->read_mu);
  for (auto& r : impl_->rings) r->reader.clear();
  impl_->merger = events::RingMerger(true);
  impl_->peeker = events::RingMerger(false);
  for (auto& r : impl_->rings) {
    impl_->merger.add(&r->reader, r->tag);
    impl_->peeker.add(&r->reader, r->tag);
  }
  impl_->dropped_gone = 0;
  impl_->rejected.clear();
  impl_->rejected_lost = 0;
}

uint64_t Tracer::rejected_records(int cpu) {
  std::lock_guard rl(impl_->read_mu);
  if (cpu >= 0)
    return static_cast<size_t>(cpu) < impl_->rejected.size() ? impl_->rejected[cpu] : 0;
  uint64_t n = 0;
  for (uint64_t v : impl_->rejected) n += v;
  return n;
}

void Tracer::record_counts(uint64_t* entries, uint64_t* written) {
  std::lock_guard rl(impl_->read_mu);
  uint64_t n = 0, dropped = impl_->dropped_gone;
  for (auto& r : impl_->rings) {
    n += r->reader.entries();
    dropped += r->reader.dropped();
  }
  *entries = n;
  *written = n + dropped;
}

bool Tracer::has_records(int cpu) {
  std::lock_guard rl(impl_->read_mu);
  for (auto& r : impl_->rings)
    if (r->reader.has_data(cpu)) return true;
  return false;
}

uint64_t Tracer::rings_in_use() {
  std::lock_guard rl(impl_->read_mu);
  uint64_t n = 0;
  for (auto& r : impl_->rings) {
    // The daemon's own ring is always claimed (by the daemon): it counts while it holds
    // records.
    if (r == impl_->own) n += r->reader.has_data() ? 1 : 0;
    else n += r->reader.rings_in_use();
  }
  return n;
}

int Tracer::set_tracing_on(bool on) {
  std::lock_guard rl(impl_->read_mu);
  impl_->tracing_on = on;
  for (auto& r : impl_->rings) events::ring_set_record_disabled(r->area.header(), !on);
  return 0;
}

bool Tracer::tracing_on() const {
  std::lock_guard rl(impl_->read_mu);
  return impl_->tracing_on;
}

int Tracer::set_trace_clock(const std::string& name) {
  events::TraceClock c;
  if (!events::parse_trace_clock(name, &c)) return -EINVAL;
  std::lock_guard rl(impl_->read_mu);
  if (int err = impl_->conv.calibrate(c); err != 0) return err;
  impl_->clock = c;
  const uint32_t mode = impl_->stamp_mode();
  for (auto& r : impl_->rings) events::ring_set_stamp_mode(r->area.header(), mode);
  for (auto& r : impl_->rings) r->reader.clear();
  impl_->dropped_gone = 0;
  impl_->merger = events::RingMerger(true);
  impl_->peeker = events::RingMerger(false);
  for (auto& r : impl_->rings) {
    impl_->merger.add(&r->reader, r->tag);
    impl_->peeker.add(&r->reader, r->tag);
  }
  return 0;
}

std::string Tracer::trace_clock_text() const {
  std::lock_guard rl(impl_->read_mu);
  return events::trace_clock_file(impl_->clock);
}

int Tracer::set_buffer_size_kb(uint32_t kb) {
  if (kb == 0) return -EINVAL;
  std::lock_guard lock(impl_->mu);
  const uint32_t old = impl_->buffer_kb;
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
  }
  // Nothing from before stays: not what a target wrote into its old area while it was
  // switched over, nor the records of departed targets.
  std::lock_guard rl(impl_->read_mu);
  const std::set<Impl::Rings*> live = impl_->live_rings();
  for (auto& r : impl_->rings)
    if (!live.count(r.get())) r->reader.clear();
  impl_->dropped_gone = 0;
  return 0;
}

uint32_t Tracer::buffer_size_kb() const {
  std::lock_guard lock(impl_->mu);
  return impl_->buffer_kb;
}

std::shared_ptr<TargetSymbolizer> Tracer::symbolizer(pid_t pid) {
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->targets.find(pid);
    if (it != impl_->targets.end() && it->second->symbolizer) return it->second->symbolizer;
  }
  // Departed: the one its records' area keeps (newest area first), then the few kept
  // since their areas were freed.
  std::lock_guard rl(impl_->read_mu);
  for (auto it = impl_->rings.rbegin(); it != impl_->rings.rend(); ++it)
    if ((*it)->pid == pid && (*it)->symbolizer) return (*it)->symbolizer;
  for (auto it = impl_->departed.rbegin(); it != impl_->departed.rend(); ++it)
    if (it->first == pid) return it->second;
  return nullptr;
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
