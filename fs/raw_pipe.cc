#include "fs/raw_pipe.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string_view>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "events/raw_page.h"
#include "fs/trace_reader.h"
#include "fs/trace_reader_direct.h"
#include "fs/tracefs.h"
#include "fs/vfs.h"

namespace probefs::fs {

std::chrono::microseconds raw_gather_wait(size_t made, size_t want,
                                          std::chrono::steady_clock::duration since,
                                          std::chrono::microseconds max) {
  using std::chrono::microseconds;
  if (made == 0 || want < 4 || made * 2 >= want || since <= decltype(since)::zero())
    return microseconds(0);
  // At the rate the pages came since the last look, the time the rest takes.
  const double per_page = std::chrono::duration<double, std::micro>(since).count() /
                          static_cast<double>(made);
  const double rest = per_page * static_cast<double>(want - made);
  if (!(rest <= static_cast<double>(max.count()))) return microseconds(0);
  return microseconds(std::max<long>(1, static_cast<long>(rest)));
}

namespace {

using Clock = std::chrono::steady_clock;

// A blocked read looks at Request::is_interrupted() this often.
constexpr int kReaderSliceMs = 20;
// Records taken from the tracer at once: about eight pages of small records.
constexpr size_t kBatch = 1024;

// Where the kernel's trace_marker records say they were written: its tracing_mark_write,
// from /proc/kallsyms (read once), which trace-cmd saves with a recording and names the
// print event's ip by. 0 where kallsyms hides addresses or has no such function.
uint64_t tracing_mark_write_address() {
  static const uint64_t address = [] {
    std::ifstream in("/proc/kallsyms");
    std::string line;
    constexpr std::string_view kName = " tracing_mark_write";
    while (std::getline(in, line)) {
      if (line.size() <= kName.size() || line.compare(line.size() - kName.size(),
                                                      kName.size(), kName) != 0)
        continue;
      return std::strtoull(line.c_str(), nullptr, 16);
    }
    return 0ull;
  }();
  return address;
}

// trace_marker's record (fs/trace_reader.h) as the kernel's ftrace print event:
//   0 u16 common_type (5)  2 u8 flags  3 u8 preempt count  4 s32 pid
//   8 u64 ip (tracing_mark_write_address())  16 text\0
// false when the record is too short to be one.
bool marker_as_print(const uint8_t* data, uint32_t len, std::vector<uint8_t>* out) {
  if (len < kMarkerHeaderSize) return false;
  uint32_t text_len;
  std::memcpy(&text_len, data + 12, 4);
  text_len = std::min(text_len, len - kMarkerHeaderSize);
  const char* text = reinterpret_cast<const char*>(data + kMarkerHeaderSize);
  text_len = static_cast<uint32_t>(strnlen(text, text_len));
  out->assign(16 + text_len + 1, 0);
  const uint16_t id = kPrintEventId;
  std::memcpy(out->data(), &id, 2);
  std::memcpy(out->data() + 2, data + 2, 6);  // flags, preempt count, pid
  const uint64_t ip = tracing_mark_write_address();
  std::memcpy(out->data() + 8, &ip, 8);
  std::memcpy(out->data() + 16, text, text_len);
  return true;
}

// trace_marker_raw's record as the kernel's ftrace raw_data event:
//   0 u16 common_type (19)  2 u8 flags  3 u8 preempt count  4 s32 pid  8 u32 id  12 data
bool marker_raw_as_raw_data(const uint8_t* data, uint32_t len, std::vector<uint8_t>* out) {
  if (len < kMarkerHeaderSize + 4) return false;
  uint32_t n;
  std::memcpy(&n, data + 12, 4);
  n = std::min(n, len - kMarkerHeaderSize);
  if (n < 4) return false;
  out->assign(8 + n, 0);
  const uint16_t id = kRawDataEventId;
  std::memcpy(out->data(), &id, 2);
  std::memcpy(out->data() + 2, data + 2, 6);  // flags, preempt count, pid
  std::memcpy(out->data() + 8, data + kMarkerHeaderSize, n);
  return true;
}

// A daemon record (pid 0) of trace_marker or trace_marker_raw as the kernel's event;
// false for one that is neither, or too short.
bool daemon_record_as_event(const uint8_t* data, uint32_t len, std::vector<uint8_t>* out) {
  if (len < 2) return false;
  uint16_t id;
  std::memcpy(&id, data, 2);
  if (id == kMarkerEventId) return marker_as_print(data, len, out);
  if (id == kMarkerRawEventId) return marker_raw_as_raw_data(data, len, out);
  return false;
}

// One open trace_pipe_raw: the pages a read lays out, handed out in order. A fill makes
// as many pages as the read asked for; records go straight from the rings into them
// while no reader setting refuses any (TraceReader::consume_direct), through a Batch
// otherwise.
class RawPipeHandle final : public Handle {
 public:
  // Pages of the buffer's sub-buffer size when the file was opened.
  RawPipeHandle(Tracefs& fs, std::shared_ptr<TraceReader> r, int cpu)
      : reader_(std::move(r)),
        cpu_(cpu),
        page_size_(fs.subbuf_bytes(reader_->buffer())),
        gather_max_(fs.options().raw_gather_max) {}

  int read(const Request& rq, uint64_t, size_t size, std::string* out) override {
    out->clear();
    return read_pages(rq, size, [out](const uint8_t* data, size_t len) {
      out->assign(reinterpret_cast<const char*>(data), len);
    });
  }

  // The server's read: the pages go out from buf_ itself, under mu_.
  int read_to(const Request& rq, uint64_t, size_t size, const Send& send) override {
    return read_pages(rq, size, [&send](const uint8_t* data, size_t len) {
      send(reinterpret_cast<const char*>(data), len);
    });
  }

  bool readable() override {
    std::lock_guard l(mu_);
    if (pos_ < made() || fill(1) || reader_->read_ends(returned_data_)) return true;
    reader_->arm_poll();
    return false;
  }

 private:
  size_t made() const { return pages_ * page_size_; }

  // Blocks (as the kernel's reader does) until there are pages, then hands `out` the
  // rest of the page begun (at most `size` bytes), or as many whole pages as `size`
  // holds, or the first `size` bytes of a page.
  template <class Out>
  int read_pages(const Request& rq, size_t size, Out&& out) {
    if (size == 0) return 0;
    std::unique_lock l(mu_);
    for (;;) {
      if (pos_ < made()) {
        const size_t in_page = pos_ % page_size_;
        size_t n;
        if (in_page != 0 || size < page_size_)
          n = std::min(size, page_size_ - in_page);
        else
          n = std::min(size - size % page_size_, made() - pos_);
        out(buf_.get() + pos_, n);
        pos_ += n;
        returned_data_ = true;
        return 0;
      }
      const uint64_t gen = reader_->data_gen();
      const size_t want = std::max<size_t>(1, size / page_size_);
      // The records this look finds came since the last one, unless that one left some
      // behind (it filled every page it had).
      const Clock::time_point looked = Clock::now();
      const Clock::duration since =
          last_look_ && !last_fill_full_ ? looked - *last_look_ : Clock::duration::max();
      last_look_ = looked;
      if (fill(want)) {
        last_fill_full_ = pages_ >= want;
        if (!rq.nonblocking()) gather(l, want, since);
        continue;
      }
      if (const int r = reader_->empty_read(rq, returned_data_); r <= 0) return r;
      l.unlock();
      reader_->wait(gen, kReaderSliceMs);
      l.lock();
    }
  }

  // After a fill that made few of the `want` pages a read has room for: waits for the rest
  // (unlocked, so that pollers and other readers of this file are not held up) and lays it
  // out behind them, when records come that fast (raw_gather_wait).
  void gather(std::unique_lock<std::mutex>& l, size_t want, Clock::duration since) {
    const auto wait = raw_gather_wait(pages_, want, since, gather_max_);
    if (wait <= Clock::duration::zero()) return;
    l.unlock();
    std::this_thread::sleep_for(wait);
    l.lock();
    if (pos_ != 0 || pages_ == 0 || pages_ >= want) return;  // another read took them
    last_look_ = Clock::now();
    fill(want, true);
    last_fill_full_ = pages_ >= want;
  }

  // Lays this CPU's next records out in up to `max` pages, under one hold of the reader:
  // true when there is any. With `more`, after the pages already made (none handed out).
  bool fill(size_t max, bool more = false) {
    if (!more) {
      pages_ = 0;
      pos_ = 0;
    }
    max_pages_ = max;
    if (cap_pages_ < max) {
      std::unique_ptr<uint8_t[]> bigger(new uint8_t[max * page_size_]);
      if (pages_ != 0) std::memcpy(bigger.get(), buf_.get(), made());
      buf_ = std::move(bigger);
      cap_pages_ = max;
    }
    auto lk = reader_->lock();
    reader_->revalidate(&batch_);
    open_next();
    // What the rings hold when the fill looks, not what comes while it lays that out
    // (the direct path: Tracer::ReadPass). A look whose records all went unshown (an
    // event removed since, a record that does not fit its format, another buffer's
    // marker) is followed by another: a read must not come back empty, or say end of
    // file, while a record it would show is there.
    const size_t pages_before = pages_;
    tracee::Tracer::ReadPass pass;
    while (drain_batch()) {
      const size_t n = reader_->direct()
                           ? reader_->consume_direct(&batch_, kBatch, cpu_, *this, &pass)
                           : reader_->consume(&batch_, kBatch, cpu_);
      learn_threads();
      if (n != 0) continue;
      if (!pass.took || pages_ != pages_before || !writer_.empty()) break;
      pass = tracee::Tracer::ReadPass{};  // that look took records, and none was shown
    }
    learn_threads();
    close_page();
    return pages_ != 0;
  }

  // Lays out what the Batch holds: false when the pages are full first.
  bool drain_batch() {
    for (; batch_.left() > 0; ++batch_.next) {
      TraceReader::Held& h = batch_.recs[batch_.next];
      if (!put_held(h, batch_.bytes.data() + h.off)) return false;
    }
    return true;
  }

  // Ends the page being written (one with no event is not made) and begins the next: false
  // when `max_pages_` are made.
  bool open_next() {
    close_page();
    if (pages_ >= max_pages_) return false;
    writer_ = events::RawPageWriter(buf_.get() + made(), page_size_);
    open_ = true;
    return true;
  }

  void close_page() {
    if (!open_ || writer_.empty()) return;
    writer_.finish();
    ++pages_;
    open_ = false;
  }

  // A record of `len` bytes appended to the page being written, or to the next: where its
  // bytes go; nullptr when every page is made, or, with *too_large, when no page can
  // hold it.
  uint8_t* room(uint64_t ts, size_t len, uint64_t missed, bool* too_large) {
    *too_large = false;
    if (!open_) return nullptr;
    writer_.set_missed(missed);
    if (uint8_t* to = writer_.append(ts, len)) return to;
    if (writer_.empty() || !open_next()) {
      *too_large = writer_.empty();
      return nullptr;
    }
    writer_.set_missed(missed);
    uint8_t* to = writer_.append(ts, len);
    *too_large = to == nullptr;
    return to;
  }

  // A record laid out: the page carries the count of those lost before it. Its thread's
  // name is learnt once the records are taken (the tracer's lock is held meanwhile).
  void laid(const TraceReader::Held& h) {
    missed_ = 0;
    if (h.pid != 0 && (h.pid != last_pid_ || h.tid != last_tid_)) {
      threads_.emplace_back(h.pid, h.tid);
      last_pid_ = h.pid;
      last_tid_ = h.tid;
    }
  }

  // For saved_cmdlines, which tools read after the pages.
  void learn_threads() {
    for (const auto& [pid, tid] : threads_) reader_->remember_comm(pid, tid);
    threads_.clear();
  }

  // A decided record of the Batch: false when there is no room for it in this fill.
  bool put_held(TraceReader::Held& h, const uint8_t* data) {
    if (h.lost_before != 0) {
      if (!writer_.empty() && !open_next()) return false;  // a loss opens the next page
      missed_ += h.lost_before;
      h.lost_before = 0;
    }
    if (!h.shown) return true;
    size_t len = h.len;
    if (h.pid == 0) {
      if (!daemon_record_as_event(data, h.len, &scratch_)) return true;
      data = scratch_.data();
      len = scratch_.size();
    }
    bool too_large;
    uint8_t* to = room(h.ts, len, missed_, &too_large);
    if (!to) {
      if (!too_large) return false;
      ++missed_;  // larger than any page: lost, as the kernel drops it
      return true;
    }
    std::memcpy(to, data, len);
    laid(h);
    return true;
  }

  // consume_direct()'s taker: a record straight from the rings. The daemon's own records
  // (markers, laid out as other events) and those that need more than room go through the
  // Batch.
  friend class probefs::fs::TraceReader;
  uint8_t* place(const TraceReader::Held& h) {
    if (h.pid == 0) return nullptr;
    if (h.lost_before != 0 && !writer_.empty() && !open_next()) return nullptr;
    const uint64_t missed = missed_ + h.lost_before;
    bool too_large;
    uint8_t* to = room(h.ts, h.len, missed, &too_large);
    if (to) missed_ = missed;
    return to;
  }

  void placed(const TraceReader::Held& h, bool shown) {
    if (shown) laid(h);
    else writer_.retract();
  }

  std::shared_ptr<TraceReader> reader_;
  const int cpu_;
  const size_t page_size_;
  const std::chrono::microseconds gather_max_;
  std::optional<Clock::time_point> last_look_;  // when a fill last looked at the rings
  bool last_fill_full_ = false;                 // and it made every page it could
  std::mutex mu_;
  std::unique_ptr<uint8_t[]> buf_;  // cap_pages_ pages; pages_ of them made, pos_ bytes handed out
  size_t cap_pages_ = 0;
  size_t pages_ = 0;
  size_t max_pages_ = 0;
  size_t pos_ = 0;
  events::RawPageWriter writer_{nullptr};
  bool open_ = false;    // writer_ is on the page after the ones made
  uint64_t missed_ = 0;  // lost records not yet reported on a page
  TraceReader::Batch batch_;
  std::vector<uint8_t> scratch_;
  pid_t last_pid_ = 0, last_tid_ = 0;
  std::vector<std::pair<pid_t, pid_t>> threads_;  // laid out, name not learnt yet
  bool returned_data_ = false;
};

}  // namespace

std::shared_ptr<File> make_raw_pipe_file(Tracefs& fs, std::shared_ptr<TraceReader> reader,
                                         int cpu) {
  return std::make_shared<ConsumingFile<RawPipeHandle>>(fs, std::move(reader), cpu);
}

}  // namespace probefs::fs
