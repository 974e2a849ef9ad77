// What the C++ runtime did, seen from inside its personality routine (throwing_support.cc):
// the landing pads it sent each frame to.
#pragma once

#include <cstdint>
#include <vector>

namespace probefs::tracee::test_support {

struct LandingPadSeen {
  uintptr_t region_start;  // the FDE's initial location
  uintptr_t landing_pad;   // where the frame was resumed
};

std::vector<LandingPadSeen> landing_pads_seen();
void clear_landing_pads_seen();

}  // namespace probefs::tracee::test_support
