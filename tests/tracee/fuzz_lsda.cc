// libFuzzer target: the LSDA parser over arbitrary bytes. It must never read outside the
// buffer (ASan) or overflow (UBSan), whatever the encodings and lengths claim.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tracee/eh_frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the object's class; the rest is the LSDA up to its section's end.
  if (size == 0) return 0;
  const bool elf64 = data[0] & 1;
  std::vector<uint8_t> lsda(data + 1, data + size);  // exactly sized: ASan sees overreads
  std::vector<uint64_t> pads;
  probefs::tracee::parse_lsda(lsda.data(), lsda.data() + lsda.size(), 0x402000, 0x401000,
                              elf64, &pads);
  return 0;
}
