// The daemon's unwind tables (tracee/unwind_tables.h): built from the .eh_frame of the
// files this process maps, sealed, laid out as arch/unwind_table.h says, and right: a
// walk by them (arch/frame_walk.h) from inside code without frame pointers finds the
// return addresses the program's own backtrace() finds, frame for frame.
#include "tracee/unwind_tables.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "arch/frame_walk.h"
#include "arch/unwind_table.h"
#include "events/memory_reader.h"
#include "tests/tracee/unwind_chain.h"

namespace probefs::tracee {
namespace {

// The tables of every executable mapping of this process that has one, mapped.
class MappedTables {
 public:
  MappedTables() {
    std::vector<Mapping> maps;
    EXPECT_EQ(read_maps(::getpid(), &maps), 0);
    for (const Mapping& m : maps) {
      if (!m.exec) continue;
      const int fd = tables_.fd_for(::getpid(), m);
      if (fd < 0) continue;
      struct stat st;
      EXPECT_EQ(::fstat(fd, &st), 0);
      void* mem = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      ::close(fd);
      EXPECT_NE(mem, MAP_FAILED);
      if (mem == MAP_FAILED) continue;
      mapped_.push_back({mem, static_cast<size_t>(st.st_size)});
      arch::UnwindTableView v;
      EXPECT_TRUE(arch::unwind_table_view(mem, static_cast<size_t>(st.st_size), m.start, m.end, &v))
          << m.path;
      views_.push_back(v);
      paths_.push_back(m.path);
    }
  }
  ~MappedTables() {
    for (auto& [mem, bytes] : mapped_) ::munmap(mem, bytes);
  }
  const arch::UnwindRow* find(uint64_t pc) const {
    for (const arch::UnwindTableView& v : views_)
      if (pc >= v.start && pc < v.end) return arch::unwind_row(v, pc);
    return nullptr;
  }
  const arch::UnwindTableView* view_of(const std::string& name) const {
    for (size_t i = 0; i < views_.size(); ++i)
      if (paths_[i].find(name) != std::string::npos) return &views_[i];
    return nullptr;
  }

 private:
  UnwindTables tables_;
  std::vector<std::pair<void*, size_t>> mapped_;
  std::vector<arch::UnwindTableView> views_;
  std::vector<std::string> paths_;
};

TEST(UnwindTables, LibcsTableIsSealedAndDescribesItsFunctions) {
  std::vector<Mapping> maps;
  ASSERT_EQ(read_maps(::getpid(), &maps), 0);
  const Mapping* libc = nullptr;
  for (const Mapping& m : maps)
    if (m.exec && m.path.find("/libc.so") != std::string::npos) libc = &m;
  ASSERT_NE(libc, nullptr);
  UnwindTables tables;
  const int fd = tables.fd_for(::getpid(), *libc);
  ASSERT_GE(fd, 0) << strerror(-fd);
  EXPECT_EQ(::fcntl(fd, F_GET_SEALS) & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK),
            F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK);
  EXPECT_EQ(::write(fd, "x", 1), -1);
  // Built once: the next process start that maps it gets the same memfd's contents.
  const int again = tables.fd_for(::getpid(), *libc);
  ASSERT_GE(again, 0);
  struct stat a, b;
  ASSERT_EQ(::fstat(fd, &a), 0);
  ASSERT_EQ(::fstat(again, &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  ::close(again);
  ::close(fd);

  MappedTables mapped;
  const arch::UnwindTableView* v = mapped.view_of("/libc.so");
  ASSERT_NE(v, nullptr);
  EXPECT_GT(v->count, 10000u);  // libc's FDEs hold tens of thousands of rows
  // Every function starts with its return address at the stack pointer (CFA = rsp + 8).
  // libc's own functions (a sanitizer's runtime interposes some of these names).
  void* libc_handle = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc_handle, nullptr);
  for (const char* name : {"qsort", "malloc", "fork", "write", "getpid"}) {
    const auto addr = reinterpret_cast<uint64_t>(::dlsym(libc_handle, name));
    ASSERT_NE(addr, 0u) << name;
    const arch::UnwindRow* r = arch::unwind_row(*v, addr);
    ASSERT_NE(r, nullptr) << name;
    EXPECT_EQ(r->kind, arch::kUnwindCfaSp) << name;
    EXPECT_EQ(r->cfa_offset, 8) << name;
    EXPECT_EQ(r->bp_rule, arch::kUnwindBpSame) << name;
  }
  ::dlclose(libc_handle);
}

struct Walked {
  const MappedTables* tables = nullptr;
  uint32_t fp = 0, n = 0;
  uint64_t out[UNW_MAX_FRAMES] = {};
};

// Inside unw_leaf (its frames and its callers' still on the stack), from the registers it
// recorded.
void walk_from_leaf(unw_seen* seen) {
  auto* w = static_cast<Walked*>(seen->context);
  auto same = [](uint64_t, uint64_t ra) { return ra; };
  const auto rd = events::LiveMemoryReader::for_self();
  uint64_t fp[UNW_MAX_FRAMES];
  w->fp = arch::walk_frame_pointers(rd, seen->regs.bp, seen->regs.sp, fp, UNW_MAX_FRAMES, same);
  w->n = arch::walk_unwind(rd, seen->regs.pc, seen->regs.sp, seen->regs.bp, false, w->out,
                           UNW_MAX_FRAMES, [&](uint64_t pc) { return w->tables->find(pc); }, same);
}

TEST(UnwindTables, AWalkByThemIsBacktracesWithoutFramePointers) {
  MappedTables mapped;
  Walked w;
  w.tables = &mapped;
  unw_seen seen{};
  seen.walk = walk_from_leaf;
  seen.context = &w;
  ASSERT_GT(unw_top(&seen), 0);
  // unw_leaf zeroed rbp: the frame-pointer chain finds nothing.
  EXPECT_EQ(seen.regs.bp, 0u);
  EXPECT_EQ(w.fp, 0u);
  // The tables find backtrace()'s callers of unw_leaf: unw_mid, unw_top, this test and
  // gtest's frames down to the first function of the thread (or the walk's bound).
  // backtrace()'s first frame is in unw_leaf (a sanitizer's interceptor of it adds one).
  auto name_of = [](uint64_t a) {
    Dl_info i;
    return ::dladdr(reinterpret_cast<void*>(a), &i) != 0 && i.dli_sname != nullptr
               ? std::string(i.dli_sname) : std::to_string(a);
  };
  ASSERT_GE(seen.frames, 4);
  int first = 0;
  while (first < seen.frames && name_of(reinterpret_cast<uint64_t>(seen.callers[first])) != "unw_mid")
    ++first;
  ASSERT_LE(first, 2) << "backtrace() did not find unw_mid";
  const uint32_t callers = static_cast<uint32_t>(seen.frames - first);
  std::string both;
  for (uint32_t i = 0; i < callers || i < w.n; ++i)
    both += (i < w.n ? name_of(w.out[i]) : "-") + " | " +
            (i < callers ? name_of(reinterpret_cast<uint64_t>(seen.callers[first + i])) : "-") + "\n";
  ASSERT_GE(w.n, callers) << both;
  for (uint32_t i = 0; i < callers; ++i)
    EXPECT_EQ(w.out[i], reinterpret_cast<uint64_t>(seen.callers[first + i])) << "frame " << i << "\n" << both;
  Dl_info mid, top;
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(w.out[0]), &mid), 0);
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(w.out[1]), &top), 0);
  EXPECT_STREQ(mid.dli_sname, "unw_mid");
  EXPECT_STREQ(top.dli_sname, "unw_top");
}

}  // namespace
}  // namespace probefs::tracee
