// Near allocation (the backend): slots for out-of-line copies and detours within rel32
// reach of the code that jumps to them.
#include "arch/x86_64/near_alloc.h"

#include <gtest/gtest.h>

#include "arch/x86_64/isa/relocate.h"

namespace probefs::arch::x86_64 {
namespace {

TEST(NearAlloc, SlotsLieWithinRel32Reach) {
  static int anchor;
  const auto near = reinterpret_cast<uintptr_t>(&anchor);
  for (int i = 0; i < 100; ++i) {
    auto p = reinterpret_cast<uintptr_t>(alloc_near(near, 64));
    ASSERT_NE(p, 0u);
    EXPECT_EQ(p % 16, 0u);
    EXPECT_TRUE(fits_rel32(near, p) && fits_rel32(p, near));
  }
}

}  // namespace
}  // namespace probefs::arch::x86_64
