// The optimizer's scan for rel32 branch candidates (arch/x86_64/rel32_scan.h) against a
// plain byte-by-byte reading of the same bytes: random bytes, real code (libc's own text),
// and scans in chunks that split branches across chunk ends.
#include "arch/x86_64/rel32_scan.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>

#include <cstring>
#include <random>
#include <vector>

namespace probefs::arch::x86_64 {
namespace {

using Found = std::vector<std::pair<size_t, int64_t>>;

Found naive(const uint8_t* b, size_t n, size_t owned) {
  Found out;
  for (size_t q = 0; q < owned; ++q) {
    size_t field;
    if (b[q] == 0xe8 || b[q] == 0xe9) field = q + 1;
    else if (b[q] == 0x0f && q + 1 < n && b[q + 1] >= 0x80 && b[q + 1] <= 0x8f) field = q + 2;
    else continue;
    if (field + 4 > n) continue;
    int32_t rel;
    std::memcpy(&rel, b + field, 4);
    out.emplace_back(q, static_cast<int64_t>(field + 4) + rel);
  }
  return out;
}

Found scanned(const uint8_t* b, size_t n, size_t owned) {
  Found out;
  for_each_rel32(b, n, owned, [&](size_t q, int64_t t) { out.emplace_back(q, t); });
  return out;
}

TEST(Rel32Scan, FindsWhatAByteByByteReadingFindsInRandomBytes) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<uint8_t> b(1 + rng() % 600);
    // Rich in the opcode bytes, so that words with several candidates are common.
    const uint8_t kBytes[] = {0xe8, 0xe9, 0x0f, 0x84, 0x85, 0x0e, 0xe8, 0x00, 0xff};
    for (uint8_t& x : b) x = rng() % 3 ? kBytes[rng() % sizeof kBytes] : static_cast<uint8_t>(rng());
    const size_t owned = rng() % 2 ? b.size() : rng() % (b.size() + 1);
    ASSERT_EQ(scanned(b.data(), b.size(), owned), naive(b.data(), b.size(), owned)) << round;
  }
}

int first_exec_segment(dl_phdr_info* info, size_t, void* data) {
  if (std::strstr(info->dlpi_name, "libc.so") == nullptr) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      auto* out = static_cast<std::pair<const uint8_t*, size_t>*>(data);
      *out = {reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr), ph.p_memsz};
      return 1;
    }
  }
  return 0;
}

TEST(Rel32Scan, FindsWhatAByteByByteReadingFindsInLibcInChunks) {
  std::pair<const uint8_t*, size_t> text{nullptr, 0};
  dl_iterate_phdr(first_exec_segment, &text);
  ASSERT_NE(text.first, nullptr);
  const Found whole = naive(text.first, text.second, text.second);
  EXPECT_GT(whole.size(), 10000u);  // libc calls and jumps a lot
  ASSERT_EQ(scanned(text.first, text.second, text.second), whole);
  // In chunks that overlap by 5 bytes, as the optimizer reads a mapping.
  Found chunks;
  constexpr size_t kChunk = 4093;
  for (size_t at = 0; at < text.second; at += kChunk) {
    const size_t n = std::min(kChunk + 5, text.second - at);
    for_each_rel32(text.first + at, n, std::min(kChunk, n), [&](size_t q, int64_t t) {
      chunks.emplace_back(at + q, static_cast<int64_t>(at) + t);
    });
  }
  EXPECT_EQ(chunks, whole);
}

TEST(Rel32Scan, TargetsMarkOneBitPerByteAndAnswerRanges) {
  std::vector<uint64_t> bits(4, 0);
  Rel32Targets t{bits.data(), 200};
  t.mark(-1);
  t.mark(200);  // outside: ignored
  t.mark(70);
  EXPECT_FALSE(t.any(0, 70));
  EXPECT_TRUE(t.any(70, 71));
  EXPECT_TRUE(t.any(60, 80));
  EXPECT_FALSE(t.any(71, 400));
  EXPECT_EQ(bits[1], uint64_t{1} << 6);
}

}  // namespace
}  // namespace probefs::arch::x86_64
