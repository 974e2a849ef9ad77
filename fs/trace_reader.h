// The reading side of the trace files (fs/trace_files.h): what `trace`, `trace_pipe` and
// per_cpu/cpuN/ share. It takes records from the tracer, decides each once (the record
// check against its event's layout, set_event_pid and tracing_cpumask: the readers' own
// settings; triggers and soft-disabled events decided at the hit), formats the kernel's
// lines under the text options, and puts blocked readers and poll waiters to sleep until
// records may be there.
//
// The decisions. A record is decided once, by the first reader that reaches it, in
// timestamp order: `trace` (non-consuming) may reach a record long before trace_pipe
// consumes it, and may show it again and again. Decisions are kept per thread: each
// thread's records come in the order of its ring, so a thread's records are numbered from
// the first one still in the buffer (`consumed` counts the ones taken out), and the reader
// remembers how many of them it has decided (`decided`) and which of those it refused. A
// consumer pops decisions; a `trace` pass finds them by number. Records of an event no
// longer in the EventTable are never shown. While no setting can refuse a record, the
// readers take them directly (consume_direct), deciding nothing.
//
// `trace` streams: the tracer can only walk every record (for_each_record), so a reader
// makes its text one chunk at a time, each chunk from a fresh walk that skips, per thread,
// the records earlier chunks passed. A chunk holds at most kTraceChunkRecordBytes of
// records (a few MiB of text), so a full buffer is never one giant snapshot; the price is
// one walk of the buffer per chunk.
//
// Waiting. One background thread waits on the tracer (wait_for_records) while a reader is
// blocked or a poll is armed, and sleeps otherwise; it wakes the blocked readers (who wait
// on a condition variable, in bounded slices, looking at their Request between them) and
// calls the poll wake-ups. wake_all() (wake_readers) wakes everyone at once. When the
// tracer says records are there at once and the woken readers do not take them (per_cpu
// readers of another CPU), the thread asks again only after a short pause, not in a spin.
//
// Threads: any FUSE thread. Everything that takes or formats records runs under lock()
// (one reader at a time, as the kernel serialises its trace readers). Waiting has its own
// lock and never takes the reader lock; the poll wake-ups run on the background thread
// with no lock held, since the FUSE server's wake-up asks readable(), which takes it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "events/trace_clock.h"
#include "fs/tracefs.h"

namespace probefs::fs {

// The records of one `trace` chunk: the tracer is walked once per chunk.
inline constexpr size_t kTraceChunkRecordBytes = 4u << 20;

// trace_marker's records (kMarkerEventId): the writer, then the text as written, with a
// newline added when it has none (the kernel's print entry, own layout):
//   0 u16 common_type   2 u8 flags (0)   3 u8 preempt count (1, as a write() has it)
//   4 s32 common_pid (writer's thread)   8 s32 writer's tgid   12 u32 text length
//   16 char comm[16] (the writer's name at the write)   32 text
inline constexpr uint32_t kMarkerHeaderSize = 32;
// trace_marker_raw's records (kMarkerRawEventId) have the same header, then the bytes as
// written: the u32 id, then the data.
// The most text one write() records: the kernel's limit with 4 KiB sub-buffers (a longer
// write is cut to this and returns it).
inline constexpr size_t kMarkerMaxText = 4054;

// The options that change the text (options/).
struct TextOptions {
  bool irq_info = true;      // the flags column
  bool context_info = true;  // TASK-PID, TGID, CPU, flags and TIMESTAMP columns
  bool record_tgid = false;  // the TGID column
  // Stack records (options/stacktrace, userstacktrace): names with offsets and sizes,
  // addresses beside names, a user address as its mapped file and offset.
  bool sym_offset = false;
  bool sym_addr = false;
  bool sym_userobj = false;
};

// "PID COMM" of the threads seen (saved_cmdlines), the newest kept, oldest dropped.
class SavedCmdlines {
 public:
  static constexpr uint32_t kDefaultSize = 6552;  // the kernel's default
  static constexpr uint32_t kMaxSize = 32768;     // PID_MAX_DEFAULT

  void save(pid_t tid, std::string_view comm);
  std::string show() const;
  uint32_t size() const;
  void resize(uint32_t n);

 private:
  mutable std::mutex mu_;
  uint32_t capacity_ = kDefaultSize;
  std::deque<pid_t> order_;  // oldest first
  std::unordered_map<pid_t, std::string> comm_;
};

class SettingsFiles;  // fs/settings_files.h

class TraceReader {
 public:
  // The reader of buffer `buffer` (tracee::Tracer's "Buffers": 0 the top level's, an
  // instance's else).
  TraceReader(Tracefs& fs, SavedCmdlines& cmdlines, uint32_t buffer = 0);
  uint32_t buffer() const { return buffer_; }
  // What is traced at all: tracing_cpumask and the pid lists of `settings`, followed into
  // children while `event_fork` says so (options/event-fork). The kernel drops records
  // outside them as they are written; here the reader drops them as it decides each
  // record. Set once, before any read.
  void set_scope(const SettingsFiles* settings, std::function<bool()> event_fork);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  // ---- reading: the calls in this part need lock() held ------------------------------

  // The reader lock, with this holder's view of the options, clock and events.
  std::unique_lock<std::mutex> lock();

  // A record a consumer took: copied out of the tracer, and decided.
  struct Held {
    pid_t pid = 0;
    pid_t tid = 0;  // tracee::TraceRecord::tid: the daemon's fact, written into the copy
    uint32_t cpu = 0;
    uint64_t ts = 0;
    uint64_t lost_before = 0;
    uint32_t off = 0;  // into Batch::bytes
    uint32_t len = 0;
    bool shown = false;
  };
  // The records one trace_pipe file took and has not printed yet.
  struct Batch {
    std::vector<uint8_t> bytes;
    std::vector<Held> recs;
    size_t next = 0;         // the first not yet printed
    uint64_t clear_gen = 0;  // records held across an emptying of the buffers are dropped
    size_t left() const { return recs.size() - next; }
  };
  // Consumes up to `max` records (of CPU `cpu`, or of all for -1) into `b`: how many.
  // The records restore() put back come first.
  size_t consume(Batch* b, size_t max, int cpu);
  // Puts records a consumer took back into the buffer, ahead of every record in it (a
  // snapshot swap gives the buffer what its snapshot held): decided already, read first
  // by consumers and `trace`, counted in the header; gone when the buffer is emptied.
  void restore(Batch b);

  // The buffer's snapshot: the records a swap took out of the buffer, decided, printed as
  // `trace` prints them. Swaps come from `echo 1 > snapshot` and trace_marker's snapshot
  // trigger (swap_snapshot), and from the targets' snapshot triggers, whose request
  // records (events/ring.h) are found as the buffer is read: lock() takes the whole
  // buffer and swaps at each request when the control page counts new ones, and a
  // consumer that meets one does the same. While the snapshot is allocated, consumers
  // take records through batches (direct() is false).
  struct Snapshot {
    bool allocated = false;
    Batch batch;
    uint64_t lost = 0;  // records lost before those it took
  };
  const Snapshot& snapshot() const { return snapshot_; }
  void swap_snapshot();      // echo 1 (allocates it)
  void clear_snapshot();     // echo 2
  void free_snapshot();      // echo 0
  void allocate_snapshot();  // a snapshot trigger was set
  // Whether restored records of CPU `cpu` (-1: any) are still to be read.
  bool restored(int cpu) const;
  // Drops what `b` holds from before the buffers were last emptied.
  void revalidate(Batch* b);

  // consume_direct()'s Taker lays records out as they are taken, with no copy between
  // the ring and its own buffer (trace_pipe_raw's pages). For each record, its
  // `uint8_t* place(const Held& h)` gets the facts and returns where the h.len bytes go,
  // or nullptr when it cannot take the record now. The bytes are copied there (a
  // target's record with its thread written in, as in Batch::bytes) and the record is
  // decided on that copy, never on the target's memory; then its
  // `void placed(const Held& h, bool shown)` says whether it is shown. Both run with the
  // tracer's read lock held: they must not call into the Tracer (nor anything that does,
  // such as comm lookups).
  //
  // Whether this lock holder may use consume_direct(): no pid list or cpumask limits what
  // is traced.
  bool direct() const { return fill_direct_; }
  // Consumes up to `max` records of CPU `cpu` (-1: all) into `t`, when direct(); `b` must
  // hold nothing. A record place() refuses is consumed into `b`, decided, and ends the
  // call; the records the tracer handed out with it (its batch) follow it into `b`.
  // Returns how many records were consumed. The calls that share `pass` take what one
  // look at the rings finds (tracee::Tracer::ReadPass). Defined in
  // fs/trace_reader_direct.h.
  template <class Taker>
  size_t consume_direct(Batch* b, size_t max, int cpu, Taker& t,
                        tracee::Tracer::ReadPass* pass = nullptr);
  // Appends a record's text: the LOST line when `lost_lines` and records were lost before
  // it, then its line if it is shown.
  void append(std::string& out, const Batch& b, const Held& h, bool lost_lines);
  // Learns the name of a thread whose record a raw reader took (saved_cmdlines keeps it
  // for the tools that read it after the pages).
  void remember_comm(pid_t pid, pid_t tid) { comm(pid, tid); }

  // Where a `trace` reader is in the buffer: per thread (key), the incarnation of its
  // gate entry and the number of its first record not passed yet.
  struct Cursor {
    std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> passed;
    uint64_t clear_gen = 0;
    bool restored_passed = false;  // the restored records are behind it
  };
  // Appends the next chunk of `trace` text (records of CPU `cpu`, or all for -1). false
  // at the end of the buffer, or once the buffer was emptied under the reader.
  bool trace_chunk(Cursor* c, int cpu, std::string* out);

  // ---- the calls from here on take what locks they need ---------------------------------

  Cursor start_cursor();
  // The `trace` header, as the options shape it. Its counts are the kernel's: the records
  // in the buffer, and those plus the ones lost since it was last emptied (consumed
  // records count in neither).
  std::string header();
  // The same with these counts (a snapshot's records).
  std::string header(uint64_t entries, uint64_t written);
  // Drops the records of CPU `cpu` (-1: all) without showing them.
  void discard(int cpu);
  // Learns the names of the threads whose records are in the buffer (saved_cmdlines).
  void learn_comms();
  // per_cpu/cpuN/stats.
  std::string stats(int cpu);

  // Runs `op`, a tracer call that empties the buffers (clear, clock change, resize),
  // between readers; when it returns 0, every decision is forgotten, the per-CPU counts
  // start again, and readers holding records or a cursor from before drop them. Returns
  // what `op` returned.
  int reset_buffer(const std::function<int()>& op);
  void set_clock(events::TraceClock c) { clock_.store(c); }
  events::TraceClock clock() const { return clock_.load(); }
  void set_options(const TextOptions& o);
  TextOptions options() const;

  // ---- waiting (never under lock()) -------------------------------------------------------

  // A consuming read (trace_pipe, trace_pipe_raw) that found nothing: whether it ends
  // here (end of file) rather than waits: the mount is going away, or tracing is off and
  // this open file already returned data (the kernel's rule).
  bool read_ends(bool returned_data);
  // What such a read returns now: -EAGAIN when non-blocking, 0 when it ends (read_ends),
  // -EINTR when the caller was signalled; 1 when it is to wait.
  int empty_read(const Request& rq, bool returned_data);

  // A number that changes whenever records may have arrived or readers must look again.
  uint64_t data_gen();
  // Sleeps at most `timeout_ms` until data_gen() is no longer `seen`.
  void wait(uint64_t seen, int timeout_ms);
  // A poll waiter needs waking when records may arrive: the functions given to
  // add_poll_wake() are called then (once per arming).
  void arm_poll();
  void add_poll_wake(std::function<void()> wake);
  // Wakes every blocked reader and poll waiter (wake_readers()).
  void wake_all();
  // Ends waiting for good (the files are going away): waits return at once.
  void stop();
  bool stopped() const { return stop_.load(); }

 private:
  struct ThreadGate {
    uint64_t incarnation = 0;
    uint64_t consumed = 0;
    uint64_t decided = 0;
    std::deque<uint64_t> rejected;  // ascending, each in [consumed, decided)
    bool seen = false;              // in the current trace walk
  };
  struct PassEntry {
    ThreadGate* gate = nullptr;
    uint64_t key = 0;
    uint64_t count = 0;        // records of the thread met in this walk
    uint64_t first_unpassed = 0;
  };
  struct Peeked {
    Held h;
    ThreadGate* gate = nullptr;
    uint64_t key = 0;
    uint64_t index = 0;
  };

  ThreadGate& gate(uint64_t key);
  // consume() without the snapshot requests' swaps.
  size_t consume_raw(Batch* b, size_t max, int cpu);
  static bool is_snapshot_request(const Batch& b, const Held& h);
  static void append_held(Batch* to, const Batch& from, const Held& h);
  void replay_swaps(Batch all);
  void settle_snapshots();
  // Moves up to `max` restored records of CPU `cpu` (-1: all) into `b`: how many.
  size_t take_restored(Batch* b, size_t max, int cpu);
  bool admit_new(const Held& h, const uint8_t* data);
  bool admit_event(const Held& h, const uint8_t* data, uint16_t id);
  struct QuietView {
    uint16_t id = 0;
    const EventView* view = nullptr;
  };
  bool admit_quiet(const Held& h, const uint8_t* data, QuietView* last);
  bool in_scope(const Held& h);
  bool pid_in_scope(pid_t tgid, pid_t tid);
  bool decide_consumed(ThreadGate& g, const Held& h, const uint8_t* data);
  static void skip_consumed(ThreadGate& g);
  bool decide_peeked(ThreadGate& g, uint64_t index, const Held& h, const uint8_t* data);
  const EventView* view(uint16_t id);
  const std::string& comm(pid_t pid, pid_t tid);
  tracee::TargetSymbolizer* symbolizer(pid_t pid);
  void begin_fill();
  void append_line(std::string& out, const Held& h, const uint8_t* data);
  void append_marker(std::string& out, const Held& h, const uint8_t* data);
  void append_marker_raw(std::string& out, const Held& h, const uint8_t* data);
  // kernel_stack and user_stack records (events/ring.h), as the kernel prints them.
  void append_stack(std::string& out, const Held& h, const uint8_t* data);
  // Whether a stack record is whole; its entries.
  static bool stack_record_fits(uint16_t id, const uint8_t* data, uint32_t len);
  void put_context(std::string& out, std::string_view comm, pid_t tid, pid_t tgid,
                   uint32_t cpu, uint8_t flags, uint8_t pc, uint64_t ts) const;
  void prune_unseen();
  void prune_idle();
  void waiter_main();

  Tracefs& fs_;
  tracee::Tracer& tracer_;
  SavedCmdlines& cmdlines_;
  const uint32_t buffer_;
  std::atomic<events::TraceClock> clock_{events::TraceClock::kLocal};
  mutable std::mutex opt_mu_;
  TextOptions opts_;

  // Guarded by mu_ (the reader lock).
  std::mutex mu_;
  std::unordered_map<uint64_t, ThreadGate> gates_;
  Batch restored_;  // restore()'s records, restored_.next the first not consumed
  Snapshot snapshot_;
  uint32_t snapshot_seen_ = 0;  // the snapshot requests of the control page handled
  uint64_t next_incarnation_ = 1;
  uint64_t clear_gen_ = 0;
  uint64_t fill_gen_ = 0;        // per lock holder: validity of the caches below
  TextOptions fill_opts_;
  events::TraceClock fill_clock_ = events::TraceClock::kLocal;
  bool fill_fast_ = true;
  bool fill_direct_ = false;
  int64_t fill_now_ms_ = 0;
  struct ViewSlot {
    uint64_t gen = 0;
    std::shared_ptr<const EventView> view;
  };
  std::vector<ViewSlot> views_;  // by id - kFirstEventId
  struct CommSlot {
    std::string comm;
    int64_t fetched_ms = 0;
  };
  std::unordered_map<uint64_t, CommSlot> comms_;
  // This fill's, held until the next: a departed target's may be the last reference.
  std::vector<std::pair<pid_t, std::shared_ptr<tracee::TargetSymbolizer>>> symbolizers_;
  // The mappings of live targets for sym-userobj, read once per fill.
  std::unordered_map<pid_t, std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>>>
      maps_;
  // The scope (set_scope): its version as this fill began (0: nothing limited), and
  // what was decided under that version.
  const SettingsFiles* scope_ = nullptr;
  std::function<bool()> event_fork_;
  uint64_t fill_scope_ = 0;
  uint64_t scope_seen_ = 0;
  bool scope_follow_ = false;
  std::vector<char> scope_cpus_;
  std::unordered_map<uint64_t, bool> scope_threads_;
  std::vector<uint64_t> read_events_;   // per CPU: records consumed
  std::vector<uint64_t> dropped_events_;  // per CPU: records lost before those
  // One trace walk's scratch.
  std::unordered_map<uint64_t, PassEntry> pass_;
  std::vector<uint8_t> peek_bytes_;
  std::vector<Peeked> peeked_;

  // Waiting: guarded by wait_mu_.
  std::mutex wait_mu_;
  std::condition_variable readers_cv_;  // blocked readers
  std::condition_variable waiter_cv_;   // the waiter thread, when it has nothing to do
  uint64_t data_gen_ = 0;
  int blocked_ = 0;
  bool poll_armed_ = false;
  bool wake_polls_ = false;  // wake_all() left the poll wakes to the waiter thread
  // Takes that found records (consume_raw, consume_direct): whether the records the
  // waiter thread last woke the readers for were theirs.
  std::atomic<uint64_t> takes_{0};
  std::vector<std::function<void()>> poll_wakes_;
  std::thread waiter_;
  std::atomic<bool> stop_{false};
};

// A file whose every open is a consuming reader of its own, a Handle H(fs, reader, cpu)
// (trace_pipe, trace_pipe_raw, of one CPU or of all for -1): read as a stream, and poll
// waiters woken when the reader says records may have come.
template <typename H>
class ConsumingFile : public File {
 public:
  ConsumingFile(Tracefs& fs, std::shared_ptr<TraceReader> r, int cpu)
      : fs_(fs), reader_(std::move(r)), cpu_(cpu) {}
  int open(const Request&, int, std::unique_ptr<Handle>* out) override {
    *out = std::make_unique<H>(fs_, reader_, cpu_);
    return 0;
  }
  void set_wakeup(std::function<void()> wake) override {
    reader_->add_poll_wake(std::move(wake));
  }
  bool stream() const override { return true; }

 private:
  Tracefs& fs_;
  std::shared_ptr<TraceReader> reader_;
  const int cpu_;
};

}  // namespace probefs::fs
