// /proc/PID/maps reading and grouping, checked against what this process knows of itself.
#include "tracee/proc_maps.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/tracee/test_functions.h"

namespace probefs::tracee {
namespace {

TEST(ProcMaps, TheExecutablesCodeIsAnExecMappingOfItsFileAndOpensAsIt) {
  std::vector<Mapping> maps;
  ASSERT_EQ(read_maps(getpid(), &maps), 0);
  struct stat exe;
  ASSERT_EQ(stat("/proc/self/exe", &exe), 0);
  const auto code = reinterpret_cast<uintptr_t>(&probefs_test_fn_a);
  const Mapping* found = nullptr;
  for (const Mapping& m : maps) {
    EXPECT_LT(m.start, m.end);
    EXPECT_EQ(m.path[0], '/');
    if (m.start <= code && code < m.end) found = &m;
  }
  ASSERT_NE(found, nullptr);
  EXPECT_TRUE(found->exec);
  EXPECT_EQ(found->inode, exe.st_ino);
  const int fd = open_mapped_file(getpid(), *found);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_ino, exe.st_ino);
  close(fd);

  // One group holds every mapping of the executable, code included.
  size_t groups_with_exe = 0;
  for (const MappingGroup& g : group_mappings(maps)) {
    if (g.maps.front().inode != exe.st_ino) continue;
    ++groups_with_exe;
    EXPECT_TRUE(g.has_exec);
    for (size_t i = 1; i < g.maps.size(); ++i) EXPECT_GE(g.maps[i].offset, g.maps[i - 1].offset);
  }
  EXPECT_EQ(groups_with_exe, 1u);
}

TEST(ProcMaps, NoSuchProcessIsEsrch) {
  std::vector<Mapping> maps;
  EXPECT_EQ(read_maps(0x3fffffff, &maps), -ESRCH);
}

}  // namespace
}  // namespace probefs::tracee
