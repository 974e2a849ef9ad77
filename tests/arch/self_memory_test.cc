// arch/self_memory.h: a private file mapping given a page of its own keeps its bytes and
// its protection, and its page table entries reach a fork child (which then maps the
// pages without touching them).
#include "arch/self_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

namespace probefs::arch {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kPages = 4;

// A field of /proc/self/smaps ("Rss", "Anonymous") for the mapping that starts at addr, in
// kB; -1 when there is no such mapping.
long smaps_kb(uintptr_t addr, const std::string& field) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool in_it = false;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      in_it = lo == addr;
      continue;
    }
    if (in_it && line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

std::string perms_of(uintptr_t addr) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo == addr) return perms;
  }
  return "";
}

// Rss of the mapping at addr as a fork child sees it before it touches anything there.
long rss_in_fork_child(uintptr_t addr) {
  int p[2];
  if (pipe(p) != 0) return -2;
  const pid_t pid = fork();
  if (pid == 0) {
    const long kb = smaps_kb(addr, "Rss");
    (void)!write(p[1], &kb, sizeof kb);
    _exit(0);
  }
  close(p[1]);
  long kb = -2;
  if (read(p[0], &kb, sizeof kb) != sizeof kb) kb = -2;
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return kb;
}

TEST(SelfMemory, AnOwnedPageTakesTheMappingsEntriesIntoForkChildren) {
  char path[] = "/tmp/probefs-self-memory-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  std::string bytes(kPages * kPage, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  void* m = mmap(nullptr, bytes.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  ASSERT_NE(m, MAP_FAILED);
  const auto base = reinterpret_cast<uintptr_t>(m);
  const auto* mem = static_cast<const volatile char*>(m);
  for (size_t i = 0; i < kPages; ++i) (void)mem[i * kPage];  // mapped here

  // A mapping of file pages only: a fork child starts without its entries.
  EXPECT_EQ(rss_in_fork_child(base), 0);
  EXPECT_EQ(smaps_kb(base, "Anonymous"), 0);

  ASSERT_EQ(own_a_page_of(base + kPages * kPage - 1), 0);
  EXPECT_EQ(smaps_kb(base, "Anonymous"), 4);  // one page, a copy
  EXPECT_EQ(perms_of(base), "r--p");
  EXPECT_EQ(std::memcmp(m, bytes.data(), bytes.size()), 0);
  // Now every page the parent had mapped is mapped in the child from the start.
  EXPECT_EQ(rss_in_fork_child(base), static_cast<long>(kPages * kPage / 1024));

  EXPECT_EQ(own_a_page_of(0), -EFAULT);  // nothing there
  munmap(m, bytes.size());
}

// The process id our own memory is read through is kept, and asked again in a fork child
// (the page that keeps it is emptied there): the child reads its own memory, not its
// parent's.
TEST(SelfMemory, AForkChildReadsItsOwnMemoryAfterItsParentKeptItsId) {
  static volatile long value = 1;
  long got = 0;
  ASSERT_TRUE(read_self_memory_all(reinterpret_cast<uintptr_t>(&value), &got, sizeof got));
  EXPECT_EQ(got, 1);
  EXPECT_EQ(self_memory_pid(), getpid());
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    value = 2;
    long v = 0;
    const bool ok = read_self_memory_all(reinterpret_cast<uintptr_t>(&value), &v, sizeof v);
    _exit(ok && v == 2 && self_memory_pid() == getpid() ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(self_memory_pid(), getpid());
}

}  // namespace
}  // namespace probefs::arch
