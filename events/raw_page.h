// The kernel's ring-buffer sub-buffer ("page"), as per_cpu/cpuN/trace_pipe_raw hands it to
// trace-cmd and libtracefs, and as events/header_page and events/header_event describe it.
// A pure encoder: it lays records out in a page and knows nothing of where they came from.
//
// A page is kRawPageSize bytes, or the sub-buffer size buffer_subbuf_size_kb sets (a power
// of two from 4 KiB to kRawMaxPageSize):
//   0   u64 timestamp    the stamp the first event's delta counts from (trace clock, ns)
//   8   u64 commit       bytes of event data used, with the missed-events flags above
//                        them: bit 31 records were lost before this page's first event,
//                        bit 30 their count is stored as a u64 right after the data
//   16  data             events, then zeros to the end of the page
// An event is a u32 header, type_len in its low 5 bits and time_delta (ns since the event
// before it, or since the page's timestamp) in the other 27, then:
//   type_len 1..28   a payload of type_len * 4 bytes (records of up to 112 bytes)
//   type_len 0       a u32 length (the payload's bytes rounded up to 4, plus these 4),
//                    then the payload
//   type_len 30      a time extend: delta >> 27 in the u32 after the header; the delta
//                    of the event after it counts from there
// Payloads are padded with zeros to 4 bytes. This writer never writes padding events
// (type 29) or absolute stamps (type 31): a page's unused tail is plain zeros past commit.
//
// Times that go back (two threads' records stamped in one order and taken in the other)
// are written with a delta of 0: a page's events never go back in time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace probefs::events {

inline constexpr size_t kRawPageSize = 4096;  // the kernel's default sub-buffer
inline constexpr size_t kRawMaxPageSize = 128 * kRawPageSize;  // its largest
inline constexpr size_t kRawPageHeader = 16;
inline constexpr size_t kRawPageData = kRawPageSize - kRawPageHeader;  // 4080
// The largest payload one event can carry in a page of kRawPageSize: the page's data less
// a header and length word.
inline constexpr size_t kRawMaxPayload = kRawPageData - 8;

inline constexpr uint64_t kRawMissedEvents = uint64_t{1} << 31;
inline constexpr uint64_t kRawMissedStored = uint64_t{1} << 30;

// Event header types (events/header_event).
inline constexpr uint32_t kRawTypePadding = 29;
inline constexpr uint32_t kRawTypeTimeExtend = 30;
inline constexpr uint32_t kRawTypeTimeStamp = 31;
inline constexpr uint32_t kRawMaxDataType = 28;
inline constexpr uint64_t kRawDeltaMask = (uint64_t{1} << 27) - 1;

class RawPageWriter {
 public:
  // Writes into `page`, `page_size` bytes the caller owns; starts empty.
  explicit RawPageWriter(uint8_t* page, size_t page_size = kRawPageSize)
      : page_(page), page_size_(page_size) {
    reset();
  }

  // Empties the page.
  void reset();

  // Records lost before this page's first event: the page says so, and stores the count
  // (room for it is kept from here on). Only while the page is empty.
  void set_missed(uint64_t n);

  // Appends one event of `len` payload bytes stamped `ts`. false, and the page as it
  // was, when it does not fit (or `len` is 0 or above the page's data less 8 bytes).
  bool add(uint64_t ts, const uint8_t* payload, size_t len);

  // add() for a caller that writes the payload in place: the event is in the page, and
  // this is where its `len` bytes go (their padding already zero); nullptr, and the page
  // as it was, when they do not fit. retract() takes the last one back out (a record
  // found not to be shown once copied); only right after append().
  uint8_t* append(uint64_t ts, size_t len);
  void retract();

  // Writes the header and the zeros past the data: the page is ready to be read.
  void finish();

  bool empty() const { return events_ == 0; }
  size_t events() const { return events_; }
  size_t used() const { return used_; }

 private:
  size_t room() const;

  uint8_t* page_;
  size_t page_size_;
  size_t used_ = 0;  // bytes of data written
  size_t events_ = 0;
  uint64_t first_ts_ = 0;
  uint64_t last_ts_ = 0;
  uint64_t missed_ = 0;
  // The page before the last append(), for retract(). Written on every append and read
  // only by a retract: a reader lays out millions of events a second, and state that an
  // append stores and the next event loads back in other widths stalls it.
  size_t undo_used_ = 0;
  uint64_t undo_last_ts_ = 0;
};

// The bytes one event of `len` payload bytes takes in a page, its header included.
inline size_t raw_event_size(size_t len) {
  constexpr size_t kSmallMax = kRawMaxDataType * 4;  // 112: the longest type_len payload
  const size_t padded = (len + 3) & ~size_t{3};
  return len <= kSmallMax ? 4 + padded : 8 + padded;
}

// ---- the per-record calls, inline: a reader lays out millions a second ------------------

inline void RawPageWriter::set_missed(uint64_t n) {
  if (events_ == 0) missed_ = n;
}

inline size_t RawPageWriter::room() const {
  return page_size_ - kRawPageHeader - used_ - (missed_ != 0 ? sizeof(uint64_t) : 0);
}

inline uint8_t* RawPageWriter::append(uint64_t ts, size_t len) {
  constexpr size_t kSmallMax = kRawMaxDataType * 4;
  if (len == 0 || len > page_size_ - kRawPageHeader - 8) return nullptr;
  const uint64_t from = events_ == 0 ? ts : last_ts_;
  const uint64_t delta = ts > from ? ts - from : 0;
  const bool extend = delta > kRawDeltaMask;
  const size_t need = raw_event_size(len) + (extend ? 8 : 0);
  if (need > room()) return nullptr;
  uint8_t* at = page_ + kRawPageHeader + used_;
  auto put = [&at](uint32_t v) {
    std::memcpy(at, &v, 4);
    at += 4;
  };
  uint32_t event_delta = static_cast<uint32_t>(delta);
  if (extend) {
    put(kRawTypeTimeExtend | static_cast<uint32_t>((delta & kRawDeltaMask) << 5));
    put(static_cast<uint32_t>(delta >> 27));
    event_delta = 0;
  }
  const size_t padded = (len + 3) & ~size_t{3};
  if (len <= kSmallMax) {
    put(static_cast<uint32_t>(padded / 4) | (event_delta << 5));
  } else {
    put(event_delta << 5);  // type_len 0: the length word follows
    put(static_cast<uint32_t>(padded + 4));
  }
  if (padded != len) std::memset(at + len, 0, padded - len);
  undo_used_ = used_;
  undo_last_ts_ = last_ts_;
  if (events_ == 0) first_ts_ = ts;
  last_ts_ = from + delta;  // the later of the two: times never go back in a page
  used_ = static_cast<size_t>(at + padded - (page_ + kRawPageHeader));
  ++events_;
  return at;
}

inline void RawPageWriter::retract() {
  used_ = undo_used_;
  last_ts_ = undo_last_ts_;
  --events_;
}

}  // namespace probefs::events
