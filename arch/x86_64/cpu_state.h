// What vector state this CPU and kernel keep for a thread, which is what a detour or a
// return trampoline must save around handlers that may use vector registers.
#pragma once

namespace probefs::arch::x86_64 {

enum VectorLevel : int {
  kVectorSse = 1,     // xmm0-15
  kVectorAvx = 2,     // ymm0-15
  kVectorAvx512 = 3,  // zmm0-31, k0-7
};

// From CPUID and XCR0 (the state the kernel enabled), once.
VectorLevel vector_level();

}  // namespace probefs::arch::x86_64
