#include "events/raw_page.h"

#include <cstring>

namespace probefs::events {

void RawPageWriter::reset() {
  used_ = 0;
  events_ = 0;
  first_ts_ = last_ts_ = 0;
  missed_ = 0;
}

bool RawPageWriter::add(uint64_t ts, const uint8_t* payload, size_t len) {
  uint8_t* at = append(ts, len);
  if (!at) return false;
  std::memcpy(at, payload, len);
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
  std::memset(page_ + end, 0, page_size_ - end);
}

}  // namespace probefs::events
