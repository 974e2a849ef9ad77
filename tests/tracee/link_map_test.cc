// The link-map walker, read through /proc/self/mem, against the dynamic linker's own
// answer (dl_iterate_phdr walks the same list in the same order).
#include "tracee/link_map.h"

#include <fcntl.h>
#include <gelf.h>
#include <link.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace probefs::tracee {
namespace {

TEST(LinkMap, EveryObjectInLoadOrder) {
  std::vector<uintptr_t> expected;  // each object's dynamic section, at run time
  uintptr_t exe_bias = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* out = static_cast<std::vector<uintptr_t>*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
            out->push_back(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
            break;
          }
        }
        return 0;
      },
      &expected);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        *static_cast<uintptr_t*>(data) = info->dlpi_addr;
        return 1;  // the first entry is the executable
      },
      &exe_bias);
  ASSERT_GE(expected.size(), 3u);

  ASSERT_NE(elf_version(EV_CURRENT), EV_NONE);
  const int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Elf* exe = elf_begin(fd, ELF_C_READ, nullptr);
  ASSERT_NE(exe, nullptr);
  const std::vector<uintptr_t> got = read_link_map(getpid(), exe, exe_bias);
  elf_end(exe);
  close(fd);
  // Both name the same objects (the vDSO included) in the same order.
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace probefs::tracee
