#include "fs/trace_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "events/kstrto.h"
#include "events/raw_page.h"
#include "events/trace_clock.h"
#include "fs/dynamic_events.h"
#include "fs/raw_pipe.h"
#include "fs/saved_tgids.h"
#include "fs/settings_files.h"
#include "fs/trace_options.h"
#include "fs/trace_reader.h"
#include "fs/tracefs.h"
#include "tracee/proc_info.h"

namespace probefs::fs {
namespace {

// A blocked read looks at Request::is_interrupted() this often.
constexpr int kReaderSliceMs = 20;
// Records a trace_pipe read takes from the tracer at once, at most.
constexpr size_t kMaxBatch = 512;
// The kernel's ring pages hold 4080 bytes of events; a buffer has at least two.
constexpr uint64_t kPageData = 4080;
// A trace_marker_raw write: a u32 id, then data; the kernel takes 4096 bytes at most.
constexpr size_t kMarkerRawMin = 4;
constexpr size_t kMarkerRawMax = 4096;
// The most a raw_data entry's page takes: 4080 bytes of data less a header, a length word
// and the entry's own 8 bytes of common fields.
constexpr size_t kMarkerRawMaxRecorded = 4060;

std::string_view trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// buffer_size_kb as the kernel shows a size of `kb` KiB: whole pages, at least two.
uint64_t kernel_buffer_kb(uint64_t kb) {
  const uint64_t pages = std::max<uint64_t>(2, (kb * 1024 + kPageData - 1) / kPageData);
  return pages * kPageData / 1024;
}

std::string number_line(uint64_t v) { return std::to_string(v) + "\n"; }

// ---- trace and per_cpu/cpuN/trace -------------------------------------------------------

class TraceHandle : public Handle {
 public:
  TraceHandle(std::shared_ptr<TraceReader> r, int cpu) : reader_(std::move(r)), cpu_(cpu) {}

  int read(const Request&, uint64_t off, size_t size, std::string* out) override {
    out->clear();
    std::lock_guard l(mu_);
    // From the start: a new header and a new walk (cat, or a reader that seeks back).
    if (off == 0 || !started_ || off < base_) restart();
    while (off >= base_ + text_.size() && !ended_) {
      base_ += text_.size();
      text_.clear();
      auto lk = reader_->lock();
      if (!reader_->trace_chunk(&cursor_, cpu_, &text_)) ended_ = true;
    }
    if (off >= base_ && off - base_ < text_.size()) {
      const size_t at = static_cast<size_t>(off - base_);
      out->assign(text_, at, std::min(size, text_.size() - at));
    }
    return 0;
  }

  // Writing to trace does nothing (only O_TRUNC clears), and says it took everything.
  int64_t write(const Request&, uint64_t, std::string_view data) override {
    return static_cast<int64_t>(data.size());
  }

 private:
  void restart() {
    text_ = reader_->header();
    base_ = 0;
    cursor_ = reader_->start_cursor();
    ended_ = false;
    started_ = true;
  }

  std::shared_ptr<TraceReader> reader_;
  const int cpu_;
  std::mutex mu_;
  std::string text_;   // the file's bytes [base_, base_ + size)
  uint64_t base_ = 0;
  TraceReader::Cursor cursor_;
  bool started_ = false;
  bool ended_ = false;
};

class TraceFile : public File {
 public:
  TraceFile(Tracefs& fs, std::shared_ptr<TraceReader> r, int cpu)
      : fs_(fs), reader_(std::move(r)), cpu_(cpu) {}

  int open(const Request& rq, int flags, std::unique_ptr<Handle>* out) override {
    if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) truncate(rq);
    *out = std::make_unique<ClearingHandle>(*this);
    return 0;
  }

  // `echo > trace` empties the buffer; per_cpu/cpuN/trace drops that CPU's records.
  int truncate(const Request&) override {
    if (cpu_ >= 0) {
      reader_->discard(cpu_);
      return 0;
    }
    return reader_->reset_buffer([this] {
      fs_.tracer().clear_records(reader_->buffer());
      return 0;
    });
  }

 private:
  class ClearingHandle : public TraceHandle {
   public:
    explicit ClearingHandle(TraceFile& f) : TraceHandle(f.reader_, f.cpu_), file_(f) {}
    int truncate(const Request& rq) override { return file_.truncate(rq); }

   private:
    TraceFile& file_;
  };

  Tracefs& fs_;
  std::shared_ptr<TraceReader> reader_;
  const int cpu_;
};

// ---- trace_pipe and per_cpu/cpuN/trace_pipe ----------------------------------------------

// One open trace_pipe: the kernel's iterator. A read formats whole lines into the caller's
// buffer until it holds `size` bytes or kTracePipeReadMax would be passed; bytes past
// `size` (the end of the last line) stay for the next read on this open file, which
// returns them alone. A line that does not fit waits, formatted, for the next read.
class PipeHandle : public Handle {
 public:
  PipeHandle(Tracefs& fs, std::shared_ptr<TraceReader> r, int cpu)
      : fs_(fs), reader_(std::move(r)), cpu_(cpu) {}

  int read(const Request& rq, uint64_t, size_t size, std::string* out) override {
    out->clear();
    if (size == 0) return 0;
    std::unique_lock l(mu_);
    for (;;) {
      if (take_rest(size, out)) return 0;
      const uint64_t gen = reader_->data_gen();
      fill(size, out);
      if (!out->empty()) {
        if (out->size() > size) {
          rest_.assign(*out, size);
          rest_pos_ = 0;
          out->resize(size);
        }
        returned_data_ = true;
        return 0;
      }
      if (const int r = reader_->empty_read(rq, returned_data_); r <= 0) return r;
      l.unlock();
      reader_->wait(gen, kReaderSliceMs);
      l.lock();
    }
  }

  bool readable() override {
    std::lock_guard l(mu_);
    if (rest_pos_ < rest_.size() || !carry_.empty()) return true;
    if (reader_->read_ends(returned_data_)) return true;
    {
      auto lk = reader_->lock();
      reader_->revalidate(&batch_);
      // Takes a record at a time until one would print (only records taken are decided);
      // an empty buffer is seen without taking anything.
      for (int tries = 0; tries < 64; ++tries) {
        for (size_t k = batch_.next; k < batch_.recs.size(); ++k)
          if (batch_.recs[k].shown || batch_.recs[k].lost_before) return true;
        if ((!fs_.tracer().has_records(cpu_, reader_->buffer()) && !reader_->restored(cpu_)) ||
            reader_->consume(&batch_, 1, cpu_) == 0)
          break;
      }
    }
    reader_->arm_poll();
    return false;
  }

 private:
  bool take_rest(size_t size, std::string* out) {
    if (rest_pos_ >= rest_.size()) return false;
    const size_t n = std::min(size, rest_.size() - rest_pos_);
    out->assign(rest_, rest_pos_, n);
    rest_pos_ += n;
    if (rest_pos_ == rest_.size()) {
      rest_.clear();
      rest_pos_ = 0;
    }
    return true;
  }

  void fill(size_t size, std::string* out) {
    auto lk = reader_->lock();
    reader_->revalidate(&batch_);
    const size_t want = std::min(size, kTracePipeReadMax);
    out->reserve(want + 512);
    for (;;) {
      if (!carry_.empty()) {
        if (!out->empty() && out->size() + carry_.size() > kTracePipeReadMax) return;
        out->append(carry_);
        carry_.clear();
        if (out->size() >= want) return;
        continue;
      }
      if (batch_.left() == 0) {
        // About as many records as the room left takes, so that few are held past this
        // read (records held when the file closes are lost, as the kernel loses the rest
        // of its last line).
        const size_t room = want - out->size();
        const size_t guess = std::clamp<size_t>(room / std::max<size_t>(avg_line_, 1) + 1, 1,
                                                kMaxBatch);
        if (reader_->consume(&batch_, guess, cpu_) == 0) return;
      }
      const TraceReader::Held& h = batch_.recs[batch_.next++];
      const size_t at = out->size();
      reader_->append(*out, batch_, h, /*lost_lines=*/true);
      const size_t added = out->size() - at;
      if (added == 0) continue;
      avg_line_ = (avg_line_ * 7 + added) / 8;
      if (out->size() > kTracePipeReadMax && at > 0) {
        carry_.assign(*out, at);
        out->resize(at);
        return;
      }
      if (out->size() >= want) return;
    }
  }

  Tracefs& fs_;
  std::shared_ptr<TraceReader> reader_;
  const int cpu_;
  std::mutex mu_;
  std::string rest_;  // the end of the last read's text, for the next read alone
  size_t rest_pos_ = 0;
  std::string carry_;  // one record's text that did not fit the last read
  TraceReader::Batch batch_;
  size_t avg_line_ = 100;
  bool returned_data_ = false;
};

using PipeFile = ConsumingFile<PipeHandle>;

// ---- trace_marker --------------------------------------------------------------------------

class MarkerFile : public File {
 public:
  using Write = std::function<int64_t(const Request&, std::string_view)>;
  explicit MarkerFile(Write w) : write_(std::move(w)) {}
  int open(const Request&, int, std::unique_ptr<Handle>* out) override {
    *out = std::make_unique<MarkerHandle>(write_);
    return 0;
  }

 private:
  class MarkerHandle : public Handle {
   public:
    explicit MarkerHandle(Write w) : write_(std::move(w)) {}
    int read(const Request&, uint64_t, size_t, std::string*) override { return -EINVAL; }
    int64_t write(const Request& rq, uint64_t, std::string_view data) override {
      return write_(rq, data);
    }

   private:
    Write write_;
  };
  Write write_;
};

}  // namespace

// ---- TraceFiles ------------------------------------------------------------------------------

struct TraceFiles::Impl {
  Impl(Tracefs& f, uint32_t b, NodePtr dir, SavedCmdlines* top_cmdlines)
      : fs(f),
        buffer(b),
        root(std::move(dir)),
        cmdlines(top_cmdlines ? *top_cmdlines : own_cmdlines),
        reader(std::make_shared<TraceReader>(f, cmdlines, b)),
        settings(f.cpus()) {}

  void add_files();
  void add_options(const NodePtr& dir);
  void add_per_cpu(const NodePtr& dir);
  int64_t write_marker(const Request& rq, std::string_view data);
  int64_t write_marker_raw(const Request& rq, std::string_view data);
  int record_marker(const Request& rq, uint16_t id, std::string_view payload, bool add_newline);
  std::string saved_tgids_text();
  int64_t write_buffer_size(std::string_view data);
  int64_t write_subbuf_size(std::string_view data);
  int64_t write_trace_clock(std::string_view data);
  std::string snapshot_text();
  int64_t write_snapshot(std::string_view data);

  bool tracing_on() const { return fs.tracer().tracing_on(buffer); }
  void set_tracing_on(bool on);

  Tracefs& fs;
  const uint32_t buffer;  // 0: the top level's
  const NodePtr root;     // where its files are
  SavedCmdlines own_cmdlines;
  SavedCmdlines& cmdlines;  // the top level's
  std::shared_ptr<TraceReader> reader;
  std::atomic<bool> markers{true};
  std::atomic<bool> kernel_stacks{false}, user_stacks{false};  // options/stacktrace...
  SavedTgids tgids;
  TraceOptions options;
  SettingsFiles settings;
};

void TraceFiles::Impl::set_tracing_on(bool on) {
  if (buffer == 0) return fs.set_tracing_on(on);
  (void)fs.tracer().set_tracing_on(on, buffer);
  reader->wake_all();
}

void TraceFiles::Impl::add_files() {
  Tree& t = fs.tree();
  tracee::Tracer& tracer = fs.tracer();
  const bool top = buffer == 0;
  t.add_file(root, "trace", kModeReadWrite, std::make_shared<TraceFile>(fs, reader, -1));
  t.add_file(root, "trace_pipe", kModeRead, std::make_shared<PipeFile>(fs, reader, -1));
  t.add_file(root, "tracing_on", kModeReadWrite,
             make_text_file([this] { return std::string(tracing_on() ? "1\n" : "0\n"); },
                            [this](const Request&, std::string_view d) -> int64_t {
                              uint64_t v;
                              if (!events::kstrtoull(d, 10, &v)) return -EINVAL;
                              set_tracing_on(v != 0);
                              return static_cast<int64_t>(d.size());
                            }));
  t.add_file(root, "trace_marker", kModeWrite,
             std::make_shared<MarkerFile>(
                 [this](const Request& rq, std::string_view d) { return write_marker(rq, d); }));
  t.add_file(root, "trace_clock", kModeReadWrite,
             make_text_file([&tracer] { return tracer.trace_clock_text(); },
                            [this](const Request&, std::string_view d) {
                              return write_trace_clock(d);
                            }));
  t.add_file(root, "buffer_size_kb", kModeReadWrite,
             make_text_file(
                 [&tracer] { return number_line(kernel_buffer_kb(tracer.buffer_size_kb())); },
                 [this](const Request&, std::string_view d) { return write_buffer_size(d); }));
  t.add_file(root, "buffer_subbuf_size_kb", kModeReadWrite,
             make_text_file([this] { return number_line(fs.subbuf_bytes(buffer) / 1024); },
                            [this](const Request&, std::string_view d) {
                              return write_subbuf_size(d);
                            }));
  t.add_file(root, "buffer_total_size_kb", kModeRead, make_text_file([this, &tracer] {
               return number_line(kernel_buffer_kb(tracer.buffer_size_kb()) *
                                  tracer.rings_in_use(buffer));
             }));
  t.add_file(root, "current_tracer", kModeReadWrite,
             make_text_file([] { return std::string("nop\n"); },
                            [](const Request&, std::string_view d) -> int64_t {
                              // Only nop is here: any other name is an unknown tracer.
                              if (trim(d) != "nop") return -EINVAL;
                              return static_cast<int64_t>(d.size());
                            }));
  t.add_file(root, "available_tracers", kModeRead,
             make_text_file([] { return std::string("nop\n"); }));
  if (top) {
  t.add_file(root, "saved_cmdlines", kModeRead, make_text_file([this] {
               reader->learn_comms();
               return cmdlines.show();
             }));
  t.add_file(root, "saved_cmdlines_size", kModeReadWrite,
             make_text_file([this] { return number_line(cmdlines.size()); },
                            [this](const Request&, std::string_view d) -> int64_t {
                              uint64_t v;
                              if (!events::kstrtoull(d, 10, &v) || v == 0 ||
                                  v > SavedCmdlines::kMaxSize)
                                return -EINVAL;
                              cmdlines.resize(static_cast<uint32_t>(v));
                              return static_cast<int64_t>(d.size());
                            }));
  t.add_file(root, "saved_tgids", kModeRead,
             make_text_file([this] { return saved_tgids_text(); }));
  }
  t.add_file(root, "snapshot", kModeReadWrite,
             make_text_file([this] { return snapshot_text(); },
                            [this](const Request&, std::string_view d) { return write_snapshot(d); }));
  t.add_file(root, "trace_marker_raw", kModeWrite,
             std::make_shared<MarkerFile>(
                 [this](const Request& rq, std::string_view d) { return write_marker_raw(rq, d); }));
  settings.add_files(t, root, !top);
  add_options(t.mkdir(root, "options", kModeDirPrivate));
  add_per_cpu(t.mkdir(root, "per_cpu", kModeDirPrivate));
}

// options/ and trace_options (fs/trace_options.h). The options that change what probefs
// prints are bound to the reader's text options (sym-offset, sym-addr and sym-userobj act
// on stack records only, as the kernel's act on kernel addresses and user stacks) and to
// the marker switch; stacktrace and userstacktrace to the targets' stack records; the
// kernel's others are stored and read back (they belong to tracers and formats probefs
// does not have).
void TraceFiles::Impl::add_options(const NodePtr& dir) {
  auto text_option = [this](const char* name, bool TextOptions::*field) {
    options.bind(
        name, [this, field] { return reader->options().*field; },
        [this, field](bool on) {
          TextOptions o = reader->options();
          o.*field = on;
          reader->set_options(o);
        });
  };
  text_option("context-info", &TextOptions::context_info);
  text_option("irq-info", &TextOptions::irq_info);
  text_option("record-tgid", &TextOptions::record_tgid);
  text_option("sym-offset", &TextOptions::sym_offset);
  text_option("sym-addr", &TextOptions::sym_addr);
  text_option("sym-userobj", &TextOptions::sym_userobj);
  options.bind("markers", [this] { return markers.load(); }, [this](bool on) { markers = on; });
  // A stack record after each event's, written by the targets (events/ring.h).
  // (An instance's are stored: the targets write stack records after the top level's
  // records alone.)
  auto stack_option = [this](const char* name, std::atomic<bool>* flag) {
    options.bind(
        name, [flag] { return flag->load(); },
        [this, flag](bool on) {
          *flag = on;
          if (buffer == 0)
            (void)fs.tracer().set_stack_options(kernel_stacks.load(), user_stacks.load());
        });
  };
  stack_option("stacktrace", &kernel_stacks);
  stack_option("userstacktrace", &user_stacks);
  options.add_files(fs.tree(), root, dir);
}

void TraceFiles::Impl::add_per_cpu(const NodePtr& dir) {
  Tree& t = fs.tree();
  for (int cpu = 0; cpu < fs.cpus(); ++cpu) {
    NodePtr d = t.mkdir(dir, "cpu" + std::to_string(cpu), kModeDirPrivate);
    t.add_file(d, "stats", kModeRead,
               make_text_file([r = reader, cpu] { return r->stats(cpu); }));
    t.add_file(d, "trace", kModeReadWrite, std::make_shared<TraceFile>(fs, reader, cpu));
    t.add_file(d, "trace_pipe", kModeRead, std::make_shared<PipeFile>(fs, reader, cpu));
    t.add_file(d, "trace_pipe_raw", kModeRead, make_raw_pipe_file(fs, reader, cpu));
    // Rings are per thread, not per CPU: each CPU's size is the one size, and setting it
    // sets that size.
    t.add_file(d, "buffer_size_kb", kModeReadWrite,
               make_text_file(
                   [&tracer = fs.tracer()] {
                     return number_line(kernel_buffer_kb(tracer.buffer_size_kb()));
                   },
                   [this](const Request&, std::string_view d) { return write_buffer_size(d); }));
  }
}

// A write to trace_marker is one record: the writer's thread, process and name (read now,
// as the kernel takes them from the writing task) and the text as written, cut to
// kMarkerMaxText, with a newline added when it has none.
int64_t TraceFiles::Impl::write_marker(const Request& rq, std::string_view data) {
  if (!markers) return -EINVAL;
  if (!tracing_on()) return -EBADF;  // the kernel's answer when the buffer takes nothing
  const std::string_view text = data.substr(0, std::min(data.size(), kMarkerMaxText));
  const bool add_newline = text.empty() || text.back() != '\n';
  const int err = record_marker(rq, kMarkerEventId, text, add_newline);
  return err < 0 ? err : static_cast<int64_t>(text.size());
}

// One record of a marker file (fs/trace_reader.h: the writer, then `payload`, and a
// newline when `add_newline`): 0 or a negative errno (EBADF when the buffer takes nothing).
int TraceFiles::Impl::record_marker(const Request& rq, uint16_t id, std::string_view payload,
                                    bool add_newline) {
  std::string comm = "<...>";
  int32_t tgid = 0;
  if (rq.pid > 0) {
    std::string c;
    if (tracee::read_proc_comm(rq.pid, 0, &c) == 0) comm = c;
    tgid = tracee::proc_tgid(rq.pid);
  }
  const uint32_t text_len = static_cast<uint32_t>(payload.size() + (add_newline ? 1 : 0));
  std::vector<uint8_t> rec(kMarkerHeaderSize + text_len, 0);
  const int32_t tid = rq.pid;
  std::memcpy(rec.data(), &id, 2);
  rec[3] = 1;  // preempt depth 1, as the kernel's write path has it ("...1.")
  std::memcpy(rec.data() + 4, &tid, 4);
  std::memcpy(rec.data() + 8, &tgid, 4);
  std::memcpy(rec.data() + 12, &text_len, 4);
  std::memcpy(rec.data() + 16, comm.data(), std::min<size_t>(comm.size(), 16));
  std::memcpy(rec.data() + kMarkerHeaderSize, payload.data(), payload.size());
  if (add_newline) rec.back() = '\n';
  const int err =
      fs.tracer().write_record(rec.data(), static_cast<uint32_t>(rec.size()), buffer);
  if (err == -ENOSPC) return -EBADF;
  if (err < 0) return err;
  if (tid > 0) {
    cmdlines.save(tid, comm);
    tgids.save(tid, tgid);
  }
  // The print event's triggers see the text as written, without the newline added (as
  // the kernel runs them before it adds one).
  if (id == kMarkerEventId) fs.dynamic_events().marker_written(buffer, tid, comm, payload);
  return 0;
}

// trace_marker_raw: checked as the kernel checks a write (markers on, at least the u32
// id, at most kMarkerRawMax bytes; EBADF while the buffer takes nothing), then one
// record of it whole (the kernel's raw_data event).
int64_t TraceFiles::Impl::write_marker_raw(const Request& rq, std::string_view data) {
  if (!markers) return -EINVAL;
  if (data.size() < kMarkerRawMin || data.size() > kMarkerRawMax) return -EINVAL;
  // The kernel's EBADF too for what its page cannot hold (the raw_data entry whole).
  if (!tracing_on() || data.size() > kMarkerRawMaxRecorded) return -EBADF;
  const int err = record_marker(rq, kMarkerRawEventId, data, false);
  return err < 0 ? err : static_cast<int64_t>(data.size());
}

// The threads of the records in the buffer (the tracer knows each writer's group), of
// trace_marker's writes, and those saved_cmdlines names (whose records readers took).
std::string TraceFiles::Impl::saved_tgids_text() {
  fs.tracer().for_each_record([this](const tracee::TraceRecord& r) {
    if (r.pid != 0) tgids.save(r.tid, r.pid);
  });
  tgids.save_missing(cmdlines.show(), [](pid_t tid) { return tracee::proc_tgid(tid); });
  return tgids.show();
}

int64_t TraceFiles::Impl::write_buffer_size(std::string_view data) {
  uint64_t v;
  if (!events::kstrtoull(data, 10, &v) || v == 0) return -EINVAL;
  if (v > UINT32_MAX / 1024) return -ENOMEM;
  const uint32_t kb = static_cast<uint32_t>(kernel_buffer_kb(v));
  // The size it has already: nothing to do (a resize would empty the buffer).
  if (kb == kernel_buffer_kb(fs.tracer().buffer_size_kb())) return static_cast<int64_t>(data.size());
  int err = fs.reset_all_buffers([&] { return fs.tracer().set_buffer_size_kb(kb); });
  if (err == -EINVAL) return -ENOMEM;  // more than a ring can be
  if (err < 0) return err;
  return static_cast<int64_t>(data.size());
}

// The kernel's snapshot text when the snapshot holds nothing: what its writes do.
constexpr std::string_view kSnapshotCommands =
    "# Snapshot commands:\n"
    "# echo 0 > snapshot : Clears and frees snapshot buffer\n"
    "# echo 1 > snapshot : Allocates snapshot buffer, if not already allocated.\n"
    "#                      Takes a snapshot of the main buffer.\n"
    "# echo 2 > snapshot : Clears snapshot buffer (but does not allocate or free)\n"
    "#                      (Doesn't have to be '2' works with any number that\n"
    "#                       is not a '0' or '1')\n";

std::string TraceFiles::Impl::snapshot_text() {
  auto lk = reader->lock();
  const TraceReader::Snapshot& snap = reader->snapshot();
  uint64_t shown = 0;
  for (const TraceReader::Held& h : snap.batch.recs) shown += h.shown ? 1 : 0;
  if (shown == 0) {
    std::string s = "# tracer: nop\n#\n";
    s += snap.allocated ? "#\n# * Snapshot is allocated *\n#\n" : "#\n# * Snapshot is freed *\n#\n";
    s += kSnapshotCommands;
    return s;
  }
  std::string s = reader->header(shown, shown + snap.lost);
  for (const TraceReader::Held& h : snap.batch.recs) reader->append(s, snap.batch, h, false);
  return s;
}

// 0 frees the snapshot, 1 takes one (TraceReader::swap_snapshot), any other number
// empties it.
int64_t TraceFiles::Impl::write_snapshot(std::string_view data) {
  uint64_t v;
  if (!events::kstrtoull(data, 10, &v)) return -EINVAL;
  {
    auto lk = reader->lock();
    if (v == 0) reader->free_snapshot();
    else if (v == 1) reader->swap_snapshot();
    else if (reader->snapshot().allocated) reader->clear_snapshot();
  }
  if (v == 1) reader->wake_all();
  return static_cast<int64_t>(data.size());
}

// buffer_subbuf_size_kb: KiB, rounded up to a power of two of pages, from one page to 128
// (EINVAL beyond, and for 0). A new size empties the buffer, as the kernel's new
// sub-buffers hold nothing of the old ones.
int64_t TraceFiles::Impl::write_subbuf_size(std::string_view data) {
  uint64_t kb;
  if (!events::kstrtoull(data, 10, &kb)) return -EINVAL;
  if (kb == 0 || kb > events::kRawMaxPageSize / 1024) return -EINVAL;
  const uint64_t pages = (kb * 1024 + events::kRawPageSize - 1) / events::kRawPageSize;
  uint64_t bytes = events::kRawPageSize;
  while (bytes < pages * events::kRawPageSize) bytes *= 2;
  if (bytes == fs.subbuf_bytes(buffer)) return static_cast<int64_t>(data.size());
  const int err = reader->reset_buffer([&] {
    fs.set_subbuf_bytes(buffer, static_cast<uint32_t>(bytes));
    fs.tracer().clear_records(buffer);
    return 0;
  });
  if (err < 0) return err;
  return static_cast<int64_t>(data.size());
}

int64_t TraceFiles::Impl::write_trace_clock(std::string_view data) {
  events::TraceClock c;
  if (!events::parse_trace_clock(data, &c)) return -EINVAL;
  int err = fs.reset_all_buffers([&] {
    int e = fs.tracer().set_trace_clock(std::string(data));
    if (e == 0) fs.set_clock(c);
    return e;
  });
  if (err < 0) return err;
  return static_cast<int64_t>(data.size());
}

TraceFiles::TraceFiles(Tracefs& fs)
    : impl_(std::make_unique<Impl>(fs, 0, fs.tree().root(), nullptr)) {
  impl_->reader->set_scope(&impl_->settings, [impl = impl_.get()] {
    return impl->options.get("event-fork").value_or(false);
  });
  impl_->add_files();
}

TraceFiles::TraceFiles(Tracefs& fs, uint32_t buffer, const NodePtr& dir, TraceFiles& top)
    : impl_(std::make_unique<Impl>(fs, buffer, dir, &top.impl_->cmdlines)) {
  impl_->reader->set_scope(&impl_->settings, [impl = impl_.get()] {
    return impl->options.get("event-fork").value_or(false);
  });
  impl_->reader->set_clock(top.impl_->reader->clock());
  impl_->add_files();
}

TraceFiles::~TraceFiles() { impl_->reader->stop(); }

void TraceFiles::wake_readers() { impl_->reader->wake_all(); }

uint32_t TraceFiles::buffer() const { return impl_->buffer; }

void TraceFiles::allocate_snapshot() {
  auto lk = impl_->reader->lock();
  impl_->reader->allocate_snapshot();
}

void TraceFiles::snapshot_swap() {
  {
    auto lk = impl_->reader->lock();
    impl_->reader->swap_snapshot();
  }
  impl_->reader->wake_all();
}

void TraceFiles::stop_readers() { impl_->reader->stop(); }

int TraceFiles::reset_buffer(const std::function<int()>& op) {
  return impl_->reader->reset_buffer(op);
}

void TraceFiles::set_clock(events::TraceClock c) { impl_->reader->set_clock(c); }

bool TraceFiles::cpu_traced(int cpu) const { return impl_->settings.cpu_traced(cpu); }

bool TraceFiles::event_pid_allowed(pid_t tid) const {
  return impl_->settings.event_pid_allowed(tid);
}

}  // namespace probefs::fs
