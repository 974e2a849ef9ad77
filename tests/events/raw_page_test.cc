// Pages written by RawPageWriter, read back by libtraceevent's kbuffer: the decoder
// trace-cmd and KernelShark use on the kernel's trace_pipe_raw.
#include "events/raw_page.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

extern "C" {
#include <traceevent/kbuffer.h>
}

namespace probefs::events {
namespace {

struct Decoded {
  unsigned long long ts;
  std::vector<uint8_t> payload;  // kbuffer's view: the padded length
};

struct Page {
  std::vector<Decoded> events;
  int missed = 0;
};

Page decode(std::vector<uint8_t>& page) {
  kbuffer* kb = kbuffer_alloc(KBUFFER_LSIZE_8, KBUFFER_ENDIAN_LITTLE);
  Page out;
  EXPECT_EQ(kbuffer_load_subbuffer(kb, page.data()), 0);
  out.missed = kbuffer_missed_events(kb);
  unsigned long long ts = 0;
  for (void* d = kbuffer_read_event(kb, &ts); d; d = kbuffer_next_event(kb, &ts)) {
    const int size = kbuffer_event_size(kb);
    const auto* p = static_cast<const uint8_t*>(d);
    out.events.push_back({ts, std::vector<uint8_t>(p, p + size)});
  }
  kbuffer_free(kb);
  return out;
}

std::vector<uint8_t> payload_of(size_t len, uint8_t seed) {
  std::vector<uint8_t> p(len);
  for (size_t i = 0; i < len; ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
  return p;
}

TEST(RawPage, SmallAndLargeRecordsComeBackWithTheirStamps) {
  std::vector<uint8_t> page(kRawPageSize, 0xAA);
  RawPageWriter w(page.data());
  const size_t lens[] = {8, 13, 112, 113, 500, 4};
  uint64_t ts = 1'000'000'000;
  for (size_t i = 0; i < std::size(lens); ++i) {
    std::vector<uint8_t> p = payload_of(lens[i], static_cast<uint8_t>(i));
    ASSERT_TRUE(w.add(ts + i * 1000, p.data(), p.size())) << lens[i];
  }
  w.finish();
  Page got = decode(page);
  ASSERT_EQ(got.events.size(), std::size(lens));
  EXPECT_EQ(got.missed, 0);
  for (size_t i = 0; i < std::size(lens); ++i) {
    EXPECT_EQ(got.events[i].ts, ts + i * 1000) << i;
    const std::vector<uint8_t> p = payload_of(lens[i], static_cast<uint8_t>(i));
    ASSERT_GE(got.events[i].payload.size(), p.size()) << i;
    EXPECT_LT(got.events[i].payload.size(), p.size() + 4) << i;
    EXPECT_TRUE(std::equal(p.begin(), p.end(), got.events[i].payload.begin())) << i;
  }
  uint64_t commit;
  std::memcpy(&commit, page.data() + 8, 8);
  EXPECT_EQ(commit, w.used());
  for (size_t i = kRawPageHeader + w.used(); i < kRawPageSize; ++i)
    ASSERT_EQ(page[i], 0) << "tail byte " << i;
}

TEST(RawPage, LongGapsAreTimeExtends) {
  std::vector<uint8_t> page(kRawPageSize);
  RawPageWriter w(page.data());
  const uint64_t stamps[] = {5, 5 + (1ull << 27), 5 + (1ull << 27) + 1, 5 + (7ull << 40)};
  const std::vector<uint8_t> p = payload_of(16, 3);
  for (uint64_t ts : stamps) ASSERT_TRUE(w.add(ts, p.data(), p.size()));
  w.finish();
  Page got = decode(page);
  ASSERT_EQ(got.events.size(), std::size(stamps));
  for (size_t i = 0; i < std::size(stamps); ++i) EXPECT_EQ(got.events[i].ts, stamps[i]) << i;
}

TEST(RawPage, StampsThatGoBackAreHeldAtTheLastOne) {
  std::vector<uint8_t> page(kRawPageSize);
  RawPageWriter w(page.data());
  const std::vector<uint8_t> p = payload_of(8, 1);
  ASSERT_TRUE(w.add(1000, p.data(), p.size()));
  ASSERT_TRUE(w.add(900, p.data(), p.size()));
  ASSERT_TRUE(w.add(1100, p.data(), p.size()));
  w.finish();
  Page got = decode(page);
  ASSERT_EQ(got.events.size(), 3u);
  EXPECT_EQ(got.events[0].ts, 1000u);
  EXPECT_EQ(got.events[1].ts, 1000u);
  EXPECT_EQ(got.events[2].ts, 1100u);
}

TEST(RawPage, MissedEventsAreCountedOnThePage) {
  std::vector<uint8_t> page(kRawPageSize);
  RawPageWriter w(page.data());
  w.set_missed(42);
  const std::vector<uint8_t> p = payload_of(24, 9);
  while (w.add(7, p.data(), p.size())) {
  }
  EXPECT_LE(w.used() + 8, kRawPageData);  // room kept for the count
  w.finish();
  Page got = decode(page);
  EXPECT_EQ(got.missed, 42);
  EXPECT_EQ(got.events.size(), w.events());
  uint64_t commit;
  std::memcpy(&commit, page.data() + 8, 8);
  EXPECT_EQ(commit & ~(kRawMissedEvents | kRawMissedStored), w.used());
  EXPECT_EQ(commit & (kRawMissedEvents | kRawMissedStored), kRawMissedEvents | kRawMissedStored);
}

TEST(RawPage, APageTakesWhatFitsAndRefusesTheRestWhole) {
  std::vector<uint8_t> page(kRawPageSize);
  RawPageWriter w(page.data());
  const std::vector<uint8_t> p = payload_of(100, 2);  // 104 bytes per event
  size_t n = 0;
  while (w.add(1 + n, p.data(), p.size())) ++n;
  EXPECT_EQ(n, kRawPageData / raw_event_size(p.size()));
  const size_t used = w.used();
  EXPECT_FALSE(w.add(1000, p.data(), p.size()));
  EXPECT_EQ(w.used(), used);
  const std::vector<uint8_t> huge = payload_of(kRawMaxPayload + 1, 0);
  RawPageWriter empty(page.data());
  EXPECT_FALSE(empty.add(1, huge.data(), huge.size()));
  EXPECT_TRUE(empty.empty());
  const std::vector<uint8_t> biggest = payload_of(kRawMaxPayload, 0);
  EXPECT_TRUE(empty.add(1, biggest.data(), biggest.size()));
  empty.finish();
  Page got = decode(page);
  ASSERT_EQ(got.events.size(), 1u);
  EXPECT_EQ(got.events[0].payload.size(), kRawMaxPayload);
}

}  // namespace
}  // namespace probefs::events
