// The vector part of the rel32 scan (rel32_scan.h): built with SSE2, the x86-64 baseline,
// unlike the rest of arch. No state; only the daemon's table builder allocates.
#include "arch/x86_64/rel32_scan.h"

#include "arch/branch_targets.h"

#include <emmintrin.h>

#include <algorithm>

namespace probefs::arch::x86_64 {

namespace {

bool opcode_at(const uint8_t* buf, size_t n, size_t q) {
  const uint8_t op = buf[q];
  if ((op & 0xfe) == 0xe8) return true;
  return op == 0x0f && q + 1 < n && (buf[q + 1] & 0xf0) == 0x80;
}

}  // namespace

size_t rel32_opcodes(const uint8_t* buf, size_t n, size_t owned, size_t from, uint32_t* out,
                     size_t cap, size_t* next) {
  size_t k = 0;
  size_t q = from;
  const __m128i ones = _mm_set1_epi8(1), e9 = _mm_set1_epi8(static_cast<char>(0xe9));
  const __m128i of = _mm_set1_epi8(0x0f), hi = _mm_set1_epi8(static_cast<char>(0xf0));
  const __m128i jcc = _mm_set1_epi8(static_cast<char>(0x80));
  // Sixteen at a time while the byte after the block can be read too; room for a whole
  // block's worth of positions before each.
  for (; q + 17 <= n && q + 16 <= owned && cap - k >= 16; q += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + q));
    const __m128i w = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + q + 1));
    // e8 and e9 both read as e9 with the low bit set; 0f where the next byte is 8x.
    const __m128i call_jmp = _mm_cmpeq_epi8(_mm_or_si128(v, ones), e9);
    const __m128i two_byte =
        _mm_and_si128(_mm_cmpeq_epi8(v, of), _mm_cmpeq_epi8(_mm_and_si128(w, hi), jcc));
    for (unsigned m = static_cast<unsigned>(_mm_movemask_epi8(_mm_or_si128(call_jmp, two_byte)));
         m != 0; m &= m - 1)
      out[k++] = static_cast<uint32_t>(q + static_cast<unsigned>(__builtin_ctz(m)));
  }
  for (; q < owned && k < cap; ++q)
    if (opcode_at(buf, n, q)) out[k++] = static_cast<uint32_t>(q);
  *next = q;
  return k;
}

}  // namespace probefs::arch::x86_64

namespace probefs::arch {

std::vector<uint64_t> build_branch_table(const uint8_t* code, size_t n, size_t max_candidates) {
  const size_t words = branch_table_words(n);
  std::vector<uint64_t> table(words + 1, 0);
  bool too_many = false;
  x86_64::for_each_rel32(code, n, n, [&](size_t source, int64_t target) {
    if (too_many || target < 0 || static_cast<uint64_t>(target) >= n) return;
    if (table.size() - words - 1 >= max_candidates) {
      too_many = true;
      return;
    }
    table.push_back(static_cast<uint64_t>(target) << 32 | source);
  });
  if (too_many) return {};
  std::sort(table.begin() + static_cast<ptrdiff_t>(words) + 1, table.end());
  x86_64::Rel32Targets t{table.data(), n};
  for (size_t i = words + 1; i < table.size(); ++i) t.mark(static_cast<int64_t>(table[i] >> 32));
  table[words] = table.size() - words - 1;
  return table;
}

}  // namespace probefs::arch
