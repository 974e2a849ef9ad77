#include "fs/raw_pipe.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>
#include <mutex>
#include <string>
#include <vector>

#include "events/raw_page.h"
#include "fs/trace_reader.h"
#include "fs/tracefs.h"
#include "fs/vfs.h"

namespace probefs::fs {
namespace {

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

class RawPipeHandle : public Handle {
 public:
  RawPipeHandle(Tracefs&, std::shared_ptr<TraceReader> r, int cpu)
      : reader_(std::move(r)), cpu_(cpu) {}

  int read(const Request& rq, uint64_t, size_t size, std::string* out) override {
    out->clear();
    if (size == 0) return 0;
    std::unique_lock l(mu_);
    for (;;) {
      if (pos_ < pages_.size()) {
        serve(size, out);
        return 0;
      }
      const uint64_t gen = reader_->data_gen();
      if (fill(std::max<size_t>(1, size / events::kRawPageSize))) continue;
      if (const int r = reader_->empty_read(rq, returned_data_); r <= 0) return r;
      l.unlock();
      reader_->wait(gen, kReaderSliceMs);
      l.lock();
    }
  }

  bool readable() override {
    std::lock_guard l(mu_);
    if (pos_ < pages_.size() || fill(1) || reader_->read_ends(returned_data_)) return true;
    reader_->arm_poll();
    return false;
  }

 private:
  // The rest of the page begun (at most `size` bytes), or as many whole pages as `size`
  // holds, or the first `size` bytes of a page.
  void serve(size_t size, std::string* out) {
    const size_t in_page = pos_ % events::kRawPageSize;
    size_t n;
    if (in_page != 0 || size < events::kRawPageSize)
      n = std::min(size, events::kRawPageSize - in_page);
    else
      n = std::min(size - size % events::kRawPageSize, pages_.size() - pos_);
    out->assign(pages_, pos_, n);
    pos_ += n;
    returned_data_ = true;
  }

  // Lays this CPU's next records out in up to `max` pages, under one hold of the reader:
  // true when there is any.
  bool fill(size_t max) {
    pages_.clear();
    pos_ = 0;
    auto lk = reader_->lock();
    reader_->revalidate(&batch_);
    for (size_t i = 0; i < max; ++i) {
      const size_t at = pages_.size();
      pages_.resize(at + events::kRawPageSize);
      events::RawPageWriter w(reinterpret_cast<uint8_t*>(pages_.data() + at));
      if (!fill_page(w)) {
        pages_.resize(at);
        break;
      }
    }
    return !pages_.empty();
  }

  // One page of the records taken: false when it would hold none.
  bool fill_page(events::RawPageWriter& w) {
    for (;;) {
      if (batch_.left() == 0 && reader_->consume(&batch_, kBatch, cpu_) == 0) break;
      TraceReader::Held& h = batch_.recs[batch_.next];
      if (h.lost_before != 0) {
        if (!w.empty()) break;  // a loss opens the next page
        missed_ += h.lost_before;
        h.lost_before = 0;
      }
      w.set_missed(missed_);
      if (!h.shown) {
        ++batch_.next;
        continue;
      }
      const uint8_t* data = batch_.bytes.data() + h.off;
      size_t len = h.len;
      if (h.pid == 0) {
        if (!daemon_record_as_event(data, h.len, &scratch_)) {
          ++batch_.next;
          continue;
        }
        data = scratch_.data();
        len = scratch_.size();
      }
      if (!w.add(h.ts, data, len)) {
        if (!w.empty()) break;  // the page is full: the record opens the next one
        ++missed_;              // larger than any page: lost, as the kernel drops it
        ++batch_.next;
        continue;
      }
      missed_ = 0;  // the page carries the count
      if (h.pid != 0 && (h.pid != last_pid_ || h.tid != last_tid_)) {
        reader_->remember_comm(h.pid, h.tid);  // for saved_cmdlines, read after the pages
        last_pid_ = h.pid;
        last_tid_ = h.tid;
      }
      ++batch_.next;
    }
    if (w.empty()) return false;
    w.finish();
    return true;
  }

  std::shared_ptr<TraceReader> reader_;
  const int cpu_;
  std::mutex mu_;
  std::string pages_;  // whole pages laid out; pos_ of them handed out
  size_t pos_ = 0;
  uint64_t missed_ = 0;  // lost records not yet reported on a page
  TraceReader::Batch batch_;
  std::vector<uint8_t> scratch_;
  pid_t last_pid_ = 0, last_tid_ = 0;
  bool returned_data_ = false;
};


}  // namespace

std::shared_ptr<File> make_raw_pipe_file(Tracefs& fs, std::shared_ptr<TraceReader> reader,
                                         int cpu) {
  return std::make_shared<ConsumingFile<RawPipeHandle>>(fs, std::move(reader), cpu);
}

}  // namespace probefs::fs
