// /proc/PID/maps reading and grouping, checked against what this process knows of itself.
#include "tracee/proc_maps.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
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

// A file whose name has spaces and looks like the line's own fields, mapped thousands of
// times (maps longer than one read), then unlinked: every mapping is found, with its path,
// offset, device and inode, and " (deleted)" taken off the path.
TEST(ProcMaps, PathsWithSpacesAndDeletedFilesInLongMaps) {
  char dir[] = "/tmp/probefs-maps-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/a b 00000000 fe:00 12 (x)";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  constexpr int kMaps = 3000;
  const long page = sysconf(_SC_PAGESIZE);
  ASSERT_EQ(ftruncate(fd, page * 2), 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  std::vector<void*> mapped;
  for (int i = 0; i < kMaps; ++i) {
    // Alternating offsets and protections, so that neighbours never merge.
    void* p = mmap(nullptr, page, i % 2 ? PROT_READ : PROT_READ | PROT_EXEC, MAP_PRIVATE, fd,
                   (i % 2) * page);
    ASSERT_NE(p, MAP_FAILED);
    mapped.push_back(p);
  }
  close(fd);
  auto count = [&](bool deleted) {
    std::vector<Mapping> maps;
    EXPECT_EQ(read_maps(getpid(), &maps), 0);
    int n = 0;
    for (const Mapping& m : maps) {
      if (m.inode != st.st_ino || m.dev != st.st_dev) continue;
      EXPECT_EQ(m.path, path);
      EXPECT_EQ(m.deleted, deleted);
      EXPECT_EQ(m.end - m.start, static_cast<uintptr_t>(page));
      EXPECT_EQ(m.exec, m.offset == 0);
      ++n;
    }
    return n;
  };
  EXPECT_EQ(count(false), kMaps);
  ASSERT_EQ(unlink(path.c_str()), 0);
  EXPECT_EQ(count(true), kMaps);
  for (void* p : mapped) munmap(p, page);
  rmdir(dir);
}

TEST(ProcMaps, NoSuchProcessIsEsrch) {
  std::vector<Mapping> maps;
  EXPECT_EQ(read_maps(0x3fffffff, &maps), -ESRCH);
}

}  // namespace
}  // namespace probefs::tracee
