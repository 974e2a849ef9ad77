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

uint8_t* RawPageWriter::reserve(uint64_t ts, size_t len) {
  if (len == 0 || len > kRawMaxPayload) return nullptr;
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
  const size_t padded = align4(len);
  if (len <= kSmallMax) {
    put(static_cast<uint32_t>(padded / 4) | (event_delta << 5));
  } else {
    put(event_delta << 5);  // type_len 0: the length word follows
    put(static_cast<uint32_t>(padded + 4));
  }
  std::memset(at + len, 0, padded - len);
  reserved_end_ = static_cast<size_t>(at + padded - (page_ + kRawPageHeader));
  reserved_ts_ = ts;
  return at;
}

void RawPageWriter::commit() {
  if (events_ == 0) first_ts_ = last_ts_ = reserved_ts_;
  if (reserved_ts_ > last_ts_) last_ts_ = reserved_ts_;
  used_ = reserved_end_;
  ++events_;
}

bool RawPageWriter::add(uint64_t ts, const uint8_t* payload, size_t len) {
  uint8_t* at = reserve(ts, len);
  if (!at) return false;
  std::memcpy(at, payload, len);
  commit();
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
