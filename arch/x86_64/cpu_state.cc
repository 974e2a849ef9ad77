#include "arch/x86_64/cpu_state.h"

#include <cpuid.h>

#include <cstdint>

namespace probefs::arch::x86_64 {
namespace {

uint64_t xcr0() {
  uint32_t lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

VectorLevel detect() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return kVectorSse;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!osxsave || !avx) return kVectorSse;
  const uint64_t enabled = xcr0();
  if ((enabled & 0x6) != 0x6) return kVectorSse;  // SSE and AVX state
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return kVectorAvx;
  const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30);  // bw: 64-bit k registers
  if (avx512f && avx512bw && (enabled & 0xe0) == 0xe0) return kVectorAvx512;  // opmask, ZMM
  return kVectorAvx;
}

}  // namespace

VectorLevel vector_level() {
  static const VectorLevel level = detect();
  return level;
}

}  // namespace probefs::arch::x86_64
