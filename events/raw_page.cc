#include "events/raw_page.h"

#include <cstring>

namespace probefs::events {
namespace {

constexpr size_t kSmallMax = kRawMaxDataType * 4;  // 112: the longest type_len payload

size_t align4(size_t n) { return (n + 3) & ~size_t{3}; }

}  // namespace

size_t raw_event_size(size_t len) {
  return len <= kSmallMax ? 4 + align4(len) : 8 + align4(len);
}

void RawPageWriter::reset() {
  used_ = 0;
  events_ = 0;
  first_ts_ = last_ts_ = 0;
  missed_ = 0;
}

void RawPageWriter::set_missed(uint64_t n) {
  if (events_ == 0) missed_ = n;
}

size_t RawPageWriter::room() const {
  return kRawPageData - used_ - (missed_ != 0 ? sizeof(uint64_t) : 0);
}

void RawPageWriter::put32(uint32_t v) {
  std::memcpy(page_ + kRawPageHeader + used_, &v, 4);
  used_ += 4;
}

bool RawPageWriter::add(uint64_t ts, const uint8_t* payload, size_t len) {
  if (len == 0 || len > kRawMaxPayload) return false;
  if (events_ == 0) first_ts_ = last_ts_ = ts;
  const uint64_t delta = ts > last_ts_ ? ts - last_ts_ : 0;
  const bool extend = delta > kRawDeltaMask;
  const size_t need = raw_event_size(len) + (extend ? 8 : 0);
  if (need > room()) {
    if (events_ == 0) first_ts_ = last_ts_ = 0;
    return false;
  }
  uint32_t event_delta = static_cast<uint32_t>(delta);
  if (extend) {
    put32(kRawTypeTimeExtend | static_cast<uint32_t>((delta & kRawDeltaMask) << 5));
    put32(static_cast<uint32_t>(delta >> 27));
    event_delta = 0;
  }
  const size_t padded = align4(len);
  if (len <= kSmallMax) {
    put32(static_cast<uint32_t>(padded / 4) | (event_delta << 5));
  } else {
    put32(event_delta << 5);  // type_len 0: the length word follows
    put32(static_cast<uint32_t>(padded + 4));
  }
  uint8_t* at = page_ + kRawPageHeader + used_;
  std::memcpy(at, payload, len);
  std::memset(at + len, 0, padded - len);
  used_ += padded;
  ++events_;
  if (ts > last_ts_) last_ts_ = ts;
  return true;
}

void RawPageWriter::finish() {
  uint64_t commit = used_;
  size_t end = kRawPageHeader + used_;
  if (missed_ != 0) {
    std::memcpy(page_ + end, &missed_, sizeof missed_);
    end += sizeof missed_;
    commit |= kRawMissedEvents | kRawMissedStored;
  }
  std::memcpy(page_, &first_ts_, 8);
  std::memcpy(page_ + 8, &commit, 8);
  std::memset(page_ + end, 0, kRawPageSize - end);
}

}  // namespace probefs::events
