// decode() over libc's executable text, a linear sweep as the optimizer's checks decode:
// probefs's own decoder (arch/x86_64/isa/insn.h) against Capstone 4 with operand detail,
// the baseline it replaced inside traced processes, in the same run. Each row is the best
// of five sweeps.
#include <dlfcn.h>
#include <link.h>

#include <capstone/capstone.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "arch/x86_64/isa/insn.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Text {
  const uint8_t* bytes;
  size_t size;
  uintptr_t addr;
};

// libc's executable segments, as loaded.
int collect(dl_phdr_info* info, size_t, void* data) {
  if (!info->dlpi_name || !std::strstr(info->dlpi_name, "libc.so")) return 0;
  auto* out = static_cast<std::vector<Text>*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
    const uintptr_t at = info->dlpi_addr + ph.p_vaddr;
    out->push_back({reinterpret_cast<const uint8_t*>(at), ph.p_filesz, at});
  }
  return 1;
}

template <class Sweep>
double best_ns_per_insn(Sweep sweep, size_t* count) {
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = Clock::now();
    const size_t n = sweep();
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    best = std::min(best, ns / static_cast<double>(std::max<size_t>(n, 1)));
    *count = n;
  }
  return best;
}

}  // namespace

int main() {
  std::vector<Text> text;
  dl_iterate_phdr(collect, &text);
  if (text.empty()) {
    std::fprintf(stderr, "libc's text not found\n");
    return 1;
  }
  csh h;
  if (cs_open(CS_ARCH_X86, CS_MODE_64, &h) != CS_ERR_OK) return 1;
  cs_option(h, CS_OPT_DETAIL, CS_OPT_ON);
  cs_insn* ci = cs_malloc(h);
  size_t n_capstone = 0, n_ours = 0;
  const double capstone = best_ns_per_insn(
      [&] {
        size_t n = 0;
        for (const Text& t : text) {
          for (size_t off = 0; off < t.size; ++n) {
            const uint8_t* p = t.bytes + off;
            size_t left = std::min<size_t>(t.size - off, 15);
            uint64_t pc = t.addr + off;
            off += cs_disasm_iter(h, &p, &left, &pc, ci) ? ci->size : 1;
          }
        }
        return n;
      },
      &n_capstone);
  const double ours = best_ns_per_insn(
      [&] {
        size_t n = 0;
        probefs::arch::x86_64::Insn insn;
        for (const Text& t : text) {
          for (size_t off = 0; off < t.size; ++n) {
            const int rc = probefs::arch::x86_64::decode(t.bytes + off, t.size - off,
                                                         t.addr + off, &insn);
            off += rc == 0 ? insn.len : 1;
          }
        }
        return n;
      },
      &n_ours);
  cs_free(ci, 1);
  cs_close(&h);
  std::printf("decode over libc's text (linear sweep, best of 5)\n\n");
  std::printf("%-44s %12s %12s %10s\n", "decoder", "insns", "ns/insn", "x baseline");
  std::printf("%-44s %12zu %12.1f %10.2f\n", "Capstone 4, detail on (baseline)", n_capstone,
              capstone, 1.0);
  std::printf("%-44s %12zu %12.1f %10.2f\n", "probefs decode() (arch/x86_64/isa/insn.h)", n_ours,
              ours, ours / capstone);
  return 0;
}
