// Tracer's implementation, shared by the files of its rooms (tracee/tracer.h is the API).
//
// Tracer::Impl is three rooms, each a file of its own:
//   tracer_targets.cc    the targets and their lifecycle: launch, attach, detach, the service
//                        thread (connections, mappings, closed links, exits, reaping), the
//                        notices, `targets`, wait_exit
//   tracer_placement.cc  the probes and where they are placed in each target: definitions,
//                        sites, DEFINE building, and the operations fanned out to every
//                        target (enable, disable, filter, arm, optimization, list, profile)
//   tracer_records.cc    the ring areas and their readers: the merger, admitting records,
//                        consuming and walking them, clearing, the trace clock, the buffer
//                        size, the daemon's own ring (trace_marker)
// and tracer.cc ties them: create() and the destructor.
//
// Locks, and what each guards:
//   mu          the targets table and each Target, and the placement
//               (probes, slots, agent ids, the armed and optimization switches, each
//               target's sites and notes); buffer_kb's changes. One lock for the table and
//               the placement: setting up a target places every probe in it, and placing
//               a probe walks every target. It is held across requests to agents (up to
//               their deadline) and across a target's set-up.
//   targets_mu  what readers of the targets room need: the targets as `targets` lists
//               them (listed), the processes refused, the exits and who was a target
//               (wait_exit), the notices and their listener; and our children, which the
//               service thread reaps under it alone (reap_children, while it waits for mu:
//               lock_serving). Never held across a request to an agent, so `targets`,
//               wait_exit, our children's exits and the notices wait for none.
//   read_mu     the records: the areas read (rings, tags), the mergers, the readers'
//               consuming state, admit_record's state, the clock and its converter,
//               tracing_on, the names and symbolizers kept for departed targets (and so
//               symbolizer()), and each area's event_ids. Never held across a request to
//               an agent.
//   marker_mu   the daemon's own ring's producer (write_record).
// Order: mu, then targets_mu, then read_mu, then marker_mu; write_record takes marker_mu
// alone. A function that holds one never waits for one before it in that order; the
// calls that only read records or the targets' state take no lock before targets_mu.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "events/ring_consumer.h"
#include "events/trace_clock.h"
#include "tracee/agent_link.h"
#include "tracee/branch_tables.h"
#include "tracee/unwind_tables.h"
#include "tracee/elf_symbols.h"
#include "tracee/probe_places.h"
#include "tracee/proc_maps.h"
#include "tracee/tracer.h"

namespace probefs::tracee {

// Counter slots of the ring areas: one per probe, so at most this many probes at once.
inline constexpr uint32_t kProbeSlots = 8192;

// What trace lines say of a probe's place beyond the symbol table: the name its
// definition asked for where the table names that address otherwise (an alias: `fork`,
// not `__fork`), so that lines, kprobes/list and kprobe_profile say the same; and the
// note kprobes/list and lines add (ProbePlace::note, an IFUNC's).
struct PlaceLabel {
  std::string name;     // "" where the table's name is the one asked for
  uint64_t offset = 0;  // the place's offset in that function
  std::string note;
  bool empty() const { return name.empty() && note.empty(); }
};

// The kernel's error_log entry for a probe the engine refused (trace_kprobe_create's
// handling of register_kprobe's result, `err` negative), positioned at the place.
events::Diagnostic registration_diagnostic(const events::ProbeDefinition& def, int err);

// Names addresses of one target for kprobe-style lines. It shares the target's symbols,
// so it goes on naming them after the target is gone. Any thread: the names a lookup
// returns live in the calling thread's cache, until a later lookup takes their slot.
class TargetNames final : public TargetSymbolizer {
 public:
  explicit TargetNames(std::shared_ptr<const ProcessSymbols> syms)
      : syms_(std::move(syms)), id_(next_id_.fetch_add(1, std::memory_order_relaxed)) {}

  // The label of event `event_id`'s probe at `addr`, or none (an empty label).
  void set_label(uint64_t addr, uint16_t event_id, const PlaceLabel& label) {
    std::lock_guard l(notes_mu_);
    if (label.empty()) notes_.erase({addr, event_id});
    else notes_[{addr, event_id}] = label;
    has_notes_.store(!notes_.empty(), std::memory_order_release);
  }

  bool lookup_event(uint64_t addr, uint16_t event_id, events::SymbolInfo* out) override {
    if (!lookup(addr, out)) return false;
    // Most traces have no label at all: they pay one load.
    if (!has_notes_.load(std::memory_order_acquire)) return true;
    thread_local PlaceLabel label;
    std::lock_guard l(notes_mu_);
    auto it = notes_.find({addr, event_id});
    if (it == notes_.end()) return true;
    label = it->second;
    out->note = label.note;
    // The name asked for, where the symbol table prefers another at the same start.
    if (!label.name.empty() && out->offset == label.offset) out->name = label.name;
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
  std::map<std::pair<uint64_t, uint16_t>, PlaceLabel> notes_;  // (addr, event id) -> label
  std::atomic<bool> has_notes_{false};
};
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
  // With ignore_closed, a link that ended on the way (its process exited or exec'd: the
  // link was closed, or the send found the peer gone) refuses nothing.
  static int first_error(const std::vector<LinkResult>& rs, bool ignore_closed) {
    for (const LinkResult& r : rs)
      if (!r.ok() && !(ignore_closed && link_ended(r.error))) return r.error;
    return 0;
  }
  static bool link_ended(int error) {
    return error == -ENOTCONN || error == -EPIPE || error == -ECONNRESET;
  }

 private:
  struct Call {
    std::shared_ptr<AgentLink> link;
    AgentLink::Ticket ticket;
  };
  std::chrono::steady_clock::time_point deadline_;
  std::vector<Call> calls_;
};

// The histograms' tables as the daemon keeps them (tracer_hists.cc), shared with the
// mappings, which fold their counts in when their target goes.
struct HistMemory;
struct HistState {
  struct Hist {
    events::HistGeometry geometry;
    bool paused = false;
    uint64_t generation = 0;  // distinct for each histogram a slot ever held
    std::vector<std::weak_ptr<HistMemory>> tables;  // one per target that has them
    HistSnapshot retained;  // what the targets gone since counted
  };
  std::mutex mu;  // a leaf: taken last, never across a request to an agent
  std::map<uint32_t, Hist> hists;
  uint64_t next_generation = 1;
};

// One target's tables of one histogram: the daemon's mapping of the memfd it handed the
// agent. When the target leaves the table, its counts join the histogram's retained
// counts (if the histogram is still the one it was made for) and the mapping goes.
struct HistMemory {
  std::shared_ptr<HistState> state;
  uint32_t slot = 0;
  uint64_t generation = 0;
  events::HistGeometry geometry;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint32_t rings = 0;
  // The area's rings_high (RingAreaHeader): tables at or past it were never written, and
  // are not read. The area outlives this (Rings holds both, this one destroyed first).
  const uint32_t* rings_high = nullptr;
  // The tables worth reading now: below rings_high, however the target set it.
  uint32_t rings_in_use() const {
    const uint32_t high = rings_high ? __atomic_load_n(rings_high, __ATOMIC_ACQUIRE) : rings;
    return high < rings ? high : rings;
  }
  HistMemory() = default;
  HistMemory(const HistMemory&) = delete;
  HistMemory& operator=(const HistMemory&) = delete;
  ~HistMemory();
};

// The mount's control page (events/control_page.h): a memfd that cannot shrink or grow,
// mapped here and in every target (CONTROL). Its count slots have their own lock, a leaf.
struct ControlPageOwner {
  int fd = -1;
  events::ControlPage* page = nullptr;
  mutable std::mutex mu;
  std::vector<bool> count_used;  // mu
  ControlPageOwner() = default;
  ControlPageOwner(const ControlPageOwner&) = delete;
  ControlPageOwner& operator=(const ControlPageOwner&) = delete;
  ~ControlPageOwner();
  int create();  // 0 or -errno
};

struct Tracer::Impl {
  struct Probe {
    ProbeId id = 0;
    ProbeSpec spec;
    FileIdentity file;
    uint32_t slot = 0;
    bool per_target_compile = false;
    // Bumped by each set_hists(): sites told an older one are told again (sync_hists).
    uint64_t hist_generation = 0;
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
      // Records of tid are its own when written before this boot-clock time: INT64_MAX
      // for a thread of pid, or one gone; -1: none (owner_written_before).
      int64_t until_ns = -1;
    };
    std::vector<OwnerCheck> owners;
    // Once its target is gone nobody writes here, and only reading changes what the area
    // holds: the reader's progress() when it was last found holding records, and when its
    // rings were last reclaimed. A daemon that keeps thousands of unread areas (a traced
    // build nobody reads) then looks at each again only after a read from it.
    uint64_t full_at = ~uint64_t{0};
    uint64_t reclaimed_at = ~uint64_t{0};
    // The histograms' tables the process counts into while it records here (HIST_TABLE,
    // by slot; mu): a fork child that takes this area as its spare takes them too.
    std::map<uint32_t, std::shared_ptr<HistMemory>> hist_tables;
  };

  struct Target {
    pid_t pid = 0;
    pid_t parent = 0;
    TargetOrigin origin = TargetOrigin::kLaunched;
    bool folded = false;     // its counts joined its probes' totals
    std::chrono::steady_clock::time_point unlinked_since;  // when its link ended
    // Since then, its new image was found one its agent can enter (left_untraceable):
    // only kExecGrace's end is waited for now.
    bool image_judged = false;
    std::string exe;
    std::shared_ptr<AgentLink> link;
    std::shared_ptr<ProcessSymbols> syms;
    std::vector<Mapping> maps;
    std::shared_ptr<Rings> rings;
    std::map<ProbeId, std::vector<Site>> sites;
    // The probes that could not go into it and were said so (note_not_placed): each is
    // retried when objects are mapped, and said once.
    std::set<ProbeId> not_placed;
    // The labels of the places of its probes, by probe and address, for kprobes/list and
    // its symbolizer: only those that have one.
    std::map<std::pair<ProbeId, uintptr_t>, PlaceLabel> notes;
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
    // The spare areas its agent holds for its next fork children (SPARE), oldest first:
    // at most lk::kMaxHeldSpares.
    std::vector<uint32_t> spares;
    uint32_t forks = 0;  // its fork children that joined
    // For each of its sites (agent id) the hist_generation of its probe that it was last
    // told (SET_HIST).
    std::map<uint32_t, uint64_t> hist_sent;
    // The generation of each synthetic event it was last told (SET_HIST with synth_id).
    std::map<uint16_t, uint64_t> synth_sent;
    // The mappings whose unwind tables it was handed or will not be (UNWIND), as
    // (start, end, inode, offset): a fork child starts with its parent's.
    std::set<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>> unwind_sent;
  };

  // Spare areas (SPARE, events/link.h): handed to a target that forks, taken by its next
  // fork child, which records there before the daemon knows of it and joins without a
  // round trip (adopt_spare). By id; mu.
  struct SpareArea {
    pid_t owner = 0;  // the process it was handed to
    std::shared_ptr<Rings> rings;  // in spare_rings until taken
    // When its owner stopped holding it for certain (a child came without it, the owner
    // exec'd, left or detached): it goes if no child names it within kSpareGrace.
    std::chrono::steady_clock::time_point let_go;
  };
  static constexpr std::chrono::seconds kSpareGrace{5};

  // ---- set by create(), read by every room ----
  Options opts;
  std::unique_ptr<AgentListener> listener;
  // The soft RLIMIT_NOFILE this process had before create() raised it to the hard one
  // (each target holds a link descriptor): what launched programs start with.
  uint64_t nofile_soft = 0;

  // The targets table and the placement room (see the top). Timed: the service thread
  // reaps our children while it waits for it (lock_serving).
  mutable std::timed_mutex mu;

  // ---- the targets room (tracer_targets.cc): mu ----
  std::map<pid_t, std::unique_ptr<Target>> targets;
  // How long a launched program's new image may take to connect after its exec.
  static constexpr std::chrono::seconds kExecGrace{10};

  // ---- the targets room, what its readers need: targets_mu ----
  mutable std::mutex targets_mu;
  // Every target set up, as `targets` shows it (without the names read then), with its
  // link for the requests it has yet to do: put when its set-up is done, taken out when
  // it leaves the table (list_target, unlist_target).
  struct Listed {
    TargetInfo info;
    std::shared_ptr<AgentLink> link;
  };
  std::map<pid_t, Listed> listed;
  std::function<void(const TargetNotice&)> notice_listener;
  std::deque<TargetNotice> notices;  // waiting for the service thread to deliver them
  std::set<pid_t> children;          // launched by us: we reap them
  // Children reaped (pid, wait status) whose target, if they were one, is still in the
  // table: it leaves it with mu (drop_reaped).
  std::vector<std::pair<pid_t, int>> reaped;

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

  std::thread service;
  std::atomic<bool> stop{false};

  // ---- the placement room (tracer_placement.cc): mu ----
  std::map<ProbeId, Probe> probes;
  ProbeId next_probe = 1;
  uint32_t next_agent_id = 1;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  bool armed = true;
  bool optimization = true;
  std::map<uint32_t, SpareArea> spares;
  uint32_t next_spare_id = 1;
  std::vector<pid_t> spare_due;  // processes that forked, to be handed a spare when idle
  std::atomic<bool> spares_due{false};
  // The branch tables agents are handed as their process starts (its own lock, a leaf).
  BranchTables branch_tables;
  // The unwind tables agents are handed while stacks are wanted (its own lock, a leaf).
  UnwindTables unwind_tables;

  // ---- the records room (tracer_records.cc): read_mu, marker_mu ----
  std::mutex read_mu;  // the mergers, the readers' consuming state, the converter
  std::vector<std::shared_ptr<Rings>> rings;  // every area read
  std::vector<std::shared_ptr<Rings>> spare_rings;  // spare areas, not read (SpareArea)
  std::vector<pid_t> tag_pid;  // by tag; tags are never reused
  std::vector<Rings*> tag_rings;  // by tag: the area while it is read, else nullptr
  // What reading one buffer (Tracer's "Buffers") keeps: its mergers, which read only
  // that buffer's rings;
  // the records rejected (TraceRecord) since it was last emptied, by CPU, and a lost
  // count a rejected record carried, handed on with the next record returned; the
  // records dropped (RingAreaReader::dropped) in areas freed since it was last emptied,
  // which the trace header's `written` counts.
  // A buffer's mergers exist while it is read (`active`: the top level's always, an
  // instance's from its first read until release_buffer): each holds a lane per ring of
  // every area, which a daemon of thousands of areas must not pay for sixteen times.
  struct Buffer {
    events::RingMerger merger;
    events::RingMerger peeker;
    bool active = false;
    std::vector<uint64_t> rejected;
    uint64_t rejected_lost = 0;
    uint64_t dropped_gone = 0;
  };
  std::vector<Buffer> buffers;  // events::kRingMaxBuffers, made by create()
  // The buffer's mergers over every area read, afresh (its records emptied), if it is
  // active. read_mu held.
  void restart_mergers(uint32_t buffer);
  // The buffer, active from now on. read_mu held.
  Buffer& read_buffer(uint32_t buffer);
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
  events::TraceClock clock = events::TraceClock::kLocal;
  events::TraceClockConverter conv;
  // Stamps as CLOCK_BOOTTIME, the clock of threads' start times (/proc/TID/stat): whether
  // a record was written before the thread that holds its writer's number now began.
  events::TraceClockConverter boot_conv;
  ControlPageOwner control;  // set at create, then only its page and counts change
  uint32_t stack_options = 0;  // every target area's (events::kRingKernelStack...)
  std::atomic<bool> kernel_stacks{false};  // its kRingKernelStack bit, for the rooms of mu
  // Names of the threads whose rings were freed (comm_of), by pid << 32 | tid, and the
  // order they came in (the oldest go first).
  std::unordered_map<uint64_t, std::string> saved_comms;
  std::deque<uint64_t> saved_order;
  // Symbolizers of departed targets whose areas were freed, oldest first.
  std::deque<std::pair<pid_t, std::shared_ptr<TargetNames>>> departed;
  // The daemon's own records (trace_marker): one ring per buffer, of the targets' size,
  // in an area of its own that the readers merge with the targets' (it is in `rings`,
  // pid 0). Any thread may write: marker_mu serialises the producers.
  std::mutex marker_mu;
  std::shared_ptr<Rings> own;      // replaced (buffer size) with read_mu and marker_mu
  events::RingProducer own_prod[events::kRingMaxBuffers];  // marker_mu, by buffer
  uint64_t own_last_tsc[events::kRingMaxBuffers] = {};     // marker_mu: the last TSC
                                                            // stamp written in each
  std::atomic<bool> interrupted{false};
  std::condition_variable_any idle_cv;  // wait_for_records with no area at all
  std::atomic<uint32_t> buffer_kb;  // changed under mu; read anywhere

  // ---- the targets room's functions (tracer_targets.cc; mu held unless said) ----
  bool target_room(std::string* why);
  void note_refused(pid_t pid, pid_t parent, TargetOrigin origin, const std::string& reason,
                    const std::string& why, bool untraceable = false);
  // Why target t, whose link ended while it runs, has no agent: an untraceable program it
  // exec'd (at once), or none it should join without (after kExecGrace). Noted when found.
  bool left_untraceable(pid_t pid, Target& t, std::chrono::steady_clock::time_point now);
  // Processes announced with prepare_exec whose agent never came: noted as untraceable.
  void note_lapsed_execs();
  void note_not_placed(Target& t, ProbeId id, const events::Diagnostic& diag);
  std::set<Rings*> live_rings() const;
  bool inherit_symbols(Target& t, const Target& parent);
  int refresh_symbols(Target& t);
  int set_up(Target& t, std::string* error, const Target* parent = nullptr,
             std::shared_ptr<Rings> spare = nullptr);
  Target* target_of_link(const std::shared_ptr<AgentLink>& link);
  void record_exit(pid_t pid, int status);
  void remember(pid_t pid);
  void queue_notice(TargetNotice::Kind kind, pid_t pid, pid_t parent = 0, int status = -1);
  void list_target(const Target& t);
  void unlist_target(pid_t pid);
  void deliver_notices();
  void fold_counts(Target& t);
  void drop_target(pid_t pid, TargetNotice::Kind kind, int status);
  void handle_connected(const std::shared_ptr<AgentLink>& link, bool prepared);
  void handle_mapped(const LinkEvent& ev);
  void handle_closed(const std::shared_ptr<AgentLink>& link);
  std::shared_ptr<Rings> take_spare(uint32_t id, pid_t owner, Target* owner_target);
  void hand_spare(Target& t);
  bool hand_one_spare(Target& t);
  void let_go_spare(uint32_t id);
  void hand_due_spares();
  void let_go_spares_of(pid_t pid);
  void drop_spares(const std::function<bool(const SpareArea&)>& which);
  void sweep_spares();
  void sweep_unlinked();
  void reap_children();
  void drop_reaped();
  std::unique_lock<std::timed_mutex> lock_serving();
  void service_loop();

  // ---- the placement room's functions (tracer_placement.cc; mu held unless said) ----
  PlaceStatus build_defines(Target& t, const Probe& p, std::vector<lk::Define>* out,
                            events::Diagnostic* diag);
  int send_defines(Target& t, ProbeId id, uint16_t event_id, std::vector<lk::Define>& defs);
  void remove_sites(FanOut& fan, Target& t, ProbeId id);
  void forget_notes(Target& t, ProbeId id, uint16_t event_id);
  void set_label(Target& t, const Probe& p, uintptr_t addr, const PlaceLabel& label);
  void place_pending(Target& t, std::vector<lk::Define>* collect,
                     std::vector<ProbeId>* collect_ids);
  int place_all_pending(Target& t, const std::function<int()>& before = {});
  void start_branch_tables(Target& t, const std::vector<lk::Define>& defs,
                           std::vector<AgentLink::Ticket>* tickets);
  void adopt_inherited_probes(Target& child, const Target* parent);
  void forget_unmapped_sites(Target& t);

  // ---- the histograms (tracer_hists.cc; mu held) ----
  std::shared_ptr<HistState> hist_state = std::make_shared<HistState>();
  // Synthetic events (Tracer::set_synth), each with the generation targets are told.
  struct Synth {
    Tracer::SynthSpec spec;
    uint64_t generation = 0;
  };
  std::map<uint16_t, Synth> synths;
  uint64_t next_synth_generation = 1;
  // common_timestamp in the targets: the TSC against CLOCK_MONOTONIC_RAW (the `local`
  // clock), anchored once.
  events::HistClock hist_clock();
  events::HistClock hist_clock_;
  // The daemon's own table of each histogram it counted a hit into
  // (count_daemon_hists), by slot; own_hists_mu is taken before hist_state->mu.
  std::mutex own_hists_mu;
  std::map<uint32_t, std::shared_ptr<HistMemory>> own_hists;
  // The daemon's table of `slot` as of now (made when it has none, or one of an earlier
  // histogram of that slot); null when the slot holds no histogram. own_hists_mu held;
  // a table it replaces goes into *stale, to be let go without the locks.
  std::shared_ptr<HistMemory> own_hist_table(uint32_t slot,
                                             std::vector<std::shared_ptr<HistMemory>>* stale);
  // Hands t the tables of every histogram it lacks, and tells each of its sites the
  // histograms of its probe where it was not told them yet.
  void sync_hists(Target& t);
  // Whether some hit walks its stack: options/stacktrace, a stacktrace trigger, a stack
  // key. mu held.
  bool stacks_wanted() const;
  // While stacks are wanted, hands t the unwind tables of the executable mappings it was
  // not handed yet (UNWIND), and collects the replies. mu held.
  void sync_unwind(Target& t);
  // Gives area r (of the process on `link`; a spare when spare_id != 0) the tables of
  // every histogram it lacks: the HIST_TABLEs are started, then collected; a table the
  // agent did not take is forgotten, to be given again.
  struct HistTableTicket {
    Rings* rings;
    uint32_t slot;
    AgentLink::Ticket ticket;
  };
  void give_hist_tables(Rings& r, AgentLink& link, uint32_t spare_id,
                        std::vector<HistTableTicket>* tickets);
  void collect_hist_tables(AgentLink& link, std::vector<HistTableTicket>& tickets);

  // ---- the records room's functions (tracer_records.cc; mu held unless said) ----
  // The stamp mode of the trace clock, for new areas. read_mu held.
  uint32_t stamp_mode() const {
    return events::ring_detect_stamp_mode(events::trace_clock_stamp(clock));
  }

  // Areas of targets (the daemon's own not counted). read_mu held.
  size_t target_areas() const { return rings.size() - (own ? 1 : 0); }

  bool make_room_for_target();
  std::shared_ptr<Rings> new_rings(pid_t pid, int* err);
  std::shared_ptr<Rings> new_spare_rings(pid_t owner, int* err);
  void adopt_spare_rings(const std::shared_ptr<Rings>& r, pid_t pid);
  std::shared_ptr<Rings> make_rings(pid_t pid, int* err);
  void read_rings(const std::shared_ptr<Rings>& r, pid_t pid);
  void save_comm(pid_t pid, uint32_t tid, std::string comm);
  void reclaim_rings(Rings& r, bool live);
  void free_drained_rings(const std::set<Rings*>& live);
  void allow_event(Target& t, uint16_t id);
  void allow_sites(Target& t);
  int new_own_rings();
};

}  // namespace probefs::tracee
