// The daemon's branch tables (tracee/branch_tables.h): built from the file behind a
// mapping, sealed, laid out as arch/branch_targets.h says, cached per file, and built
// again when the file is rewritten in place.
#include "tracee/branch_tables.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "arch/branch_targets.h"

namespace probefs::tracee {
namespace {

std::vector<uint64_t> read_table(int fd) {
  struct stat st;
  EXPECT_EQ(::fstat(fd, &st), 0);
  std::vector<uint64_t> words(static_cast<size_t>(st.st_size) / 8);
  EXPECT_EQ(::pread(fd, words.data(), words.size() * 8, 0), st.st_size);
  return words;
}

const Mapping* exec_mapping_of(const std::vector<Mapping>& maps, const std::string& name) {
  for (const Mapping& m : maps)
    if (m.exec && m.path.find(name) != std::string::npos) return &m;
  return nullptr;
}

TEST(BranchTables, LibcsTableIsSealedAndMatchesItsBytes) {
  std::vector<Mapping> maps;
  ASSERT_EQ(read_maps(::getpid(), &maps), 0);
  const Mapping* libc = exec_mapping_of(maps, "/libc.so");
  ASSERT_NE(libc, nullptr);
  BranchTables tables;
  const int fd = tables.fd_for(::getpid(), *libc);
  ASSERT_GE(fd, 0) << strerror(-fd);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK),
            F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK);
  EXPECT_EQ(::write(fd, "x", 1), -1);
  const std::vector<uint64_t> table = read_table(fd);
  ::close(fd);
  // What libc's own bytes in this process give (no probe here patches them).
  const size_t length = libc->end - libc->start;
  const std::vector<uint64_t> expected =
      arch::build_branch_table(reinterpret_cast<const uint8_t*>(libc->start), length);
  ASSERT_EQ(table.size(), expected.size());
  EXPECT_TRUE(table == expected);
  const size_t words = arch::branch_table_words(length);
  EXPECT_GT(table[words], 1000u);  // libc has thousands of calls
  // A second process start gets the same table without a new build (and its own fd).
  const int again = tables.fd_for(::getpid(), *libc);
  ASSERT_GE(again, 0);
  EXPECT_TRUE(read_table(again) == expected);
  ::close(again);
}

// Candidates: a call whose displacement runs past the mapping is none; targets are
// marked and the candidates sorted by target.
TEST(BranchTables, LayoutOfASmallTable) {
  // 0: call +5 (-> 10); 5: jmp -10 (-> 0); 10: jne +1 (-> 17); 16: ret; 17: e8 at the end.
  const uint8_t code[] = {0xe8, 0x05, 0, 0, 0,  0xe9, 0xf6, 0xff, 0xff, 0xff, 0x0f, 0x85,
                          0x01, 0,    0, 0,     0xc3, 0xe8, 0x00};
  const std::vector<uint64_t> t = arch::build_branch_table(code, sizeof code);
  ASSERT_EQ(t.size(), 1u + 1u + 3u);
  EXPECT_EQ(t[1], 3u);
  EXPECT_EQ(t[2], uint64_t{0} << 32 | 5);
  EXPECT_EQ(t[3], uint64_t{10} << 32 | 0);
  EXPECT_EQ(t[4], uint64_t{17} << 32 | 10);
  EXPECT_EQ(t[0], (uint64_t{1} << 0) | (uint64_t{1} << 10) | (uint64_t{1} << 17));
  // A bound on the candidates: code that is all branches makes no table.
  EXPECT_EQ(arch::build_branch_table(code, sizeof code, 3).size(), t.size());
  EXPECT_TRUE(arch::build_branch_table(code, sizeof code, 2).empty());
}

// A file rewritten in place keeps its inode; its table is built again.
TEST(BranchTables, AFileRewrittenInPlaceGetsANewTable) {
  char dir[] = "/tmp/probefs-branches-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/code";
  auto write_code = [&](uint8_t disp) {
    std::vector<uint8_t> bytes(8192, 0x90);
    bytes[100] = 0xe8;
    bytes[101] = disp;
    bytes[102] = bytes[103] = bytes[104] = 0;
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0755);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  };
  write_code(1);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* mem = ::mmap(nullptr, 8192, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(mem, MAP_FAILED);
  auto table_now = [&]() -> std::vector<uint64_t> {
    std::vector<Mapping> maps;
    EXPECT_EQ(read_maps(::getpid(), &maps), 0);
    const Mapping* m = exec_mapping_of(maps, path);
    if (!m) return {};
    static BranchTables tables;
    const int t = tables.fd_for(::getpid(), *m);
    if (t < 0) return {};
    std::vector<uint64_t> words = read_table(t);
    ::close(t);
    return words;
  };
  std::vector<uint64_t> first = table_now();
  ASSERT_EQ(first.size(), 128u + 1u + 1u);
  EXPECT_EQ(first[129], uint64_t{106} << 32 | 100);
  // Rewritten with a later mtime (the same second would do: ctime changes too).
  write_code(2);
  std::vector<uint64_t> second = table_now();
  ASSERT_EQ(second.size(), 128u + 1u + 1u);
  EXPECT_EQ(second[129], uint64_t{107} << 32 | 100);
  ::munmap(mem, 8192);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace probefs::tracee
