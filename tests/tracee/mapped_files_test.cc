// The daemon reads the very files a target mapped, or refuses: a running program whose
// file is replaced, deleted or swapped for a FIFO, a directory or a symlink, and a library
// upgraded under it. Each case runs twice: checked by a root process, which reaches the
// mapped inode through /proc/PID/map_files whatever stands at the path, and by uid 65534
// against a target of its own uid, which cannot, and must say the file is gone (-ESTALE)
// instead of reading what is at the path now. The checks run in a forked child (the one
// that drops its uid), bounded by an alarm: an open that waits on a FIFO fails the case
// rather than hanging the suite.
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "events/parse.h"
#include "tests/tracee/mapped_files_util.h"
#include "tracee/elf_symbols.h"
#include "tracee/probe_places.h"
#include "tracee/proc_maps.h"

namespace probefs::tracee {
namespace {

using testing::become;
using testing::copy_file;
using testing::kNobody;
using testing::read_line;
using testing::replace_with;
using testing::run_checker;
using testing::Scratch;

// mapped_prog running as `uid` from `prog`, with `lib` dlopened where given; killed and
// reaped at the end.
struct Target {
  pid_t pid = -1;
  int to_child = -1;
  uintptr_t fn = 0;
  uintptr_t lib_fn = 0;

  // `before_exec` runs in the child first, with root's rights (a mount namespace of its
  // own, say); false ends the child.
  bool start(const std::string& prog, const std::string& lib, uid_t uid,
             const std::function<bool()>& before_exec = {}) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) return false;
    if (pipe2(out, O_CLOEXEC) != 0) {
      close(in[0]);
      close(in[1]);
      return false;
    }
    pid = fork();
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      if (before_exec && !before_exec()) _exit(125);
      if (!become(uid)) _exit(126);
      if (lib.empty()) execl(prog.c_str(), prog.c_str(), nullptr);
      else execl(prog.c_str(), prog.c_str(), lib.c_str(), nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_child = in[1];
    const std::string line = pid > 0 ? read_line(out[0], 30000) : "";
    close(out[0]);
    unsigned long a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx %lx", &a, &b) != 2) return false;
    fn = a;
    lib_fn = b;
    return fn != 0;
  }
  ~Target() {
    if (to_child >= 0) close(to_child);
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

// The executable mapping of `path` in pid's maps, as the daemon read it before whatever
// the test does next.
bool code_mapping(pid_t pid, const std::string& path, Mapping* out) {
  std::vector<Mapping> maps;
  if (read_maps(pid, &maps) != 0) return false;
  for (const Mapping& m : maps) {
    if (m.exec && m.path == path) {
      *out = m;
      return true;
    }
  }
  return false;
}

// open_mapped_file(pid, m) as `uid` sees it: the mapped inode as root, -ESTALE as a user.
std::string check_open(pid_t pid, const Mapping& m, bool as_user) {
  std::string fails;
  const int fd = open_mapped_file(pid, m);
  if (as_user) {
    MAPPED_CHECK_EQ(fd, -ESTALE);
  } else {
    MAPPED_CHECK(fd >= 0);
    struct stat st {};
    MAPPED_CHECK(fd >= 0 && fstat(fd, &st) == 0);
    MAPPED_CHECK_EQ(st.st_ino, m.inode);
    MAPPED_CHECK_EQ(st.st_dev, m.dev);
    MAPPED_CHECK(S_ISREG(st.st_mode));
  }
  if (fd >= 0) close(fd);
  return fails;
}

// resolve(name) in pid: `want` (the running code) as root, -ESTALE as a user.
std::string check_resolve(pid_t pid, const std::string& name, uintptr_t want, bool as_user) {
  std::string fails;
  int err = 0;
  auto syms = ProcessSymbols::load(pid, &err);
  MAPPED_CHECK_EQ(err, 0);
  if (!syms) return fails;
  ResolvedSymbol rs;
  const int r = syms->resolve(name, &rs);
  if (as_user) {
    MAPPED_CHECK_EQ(r, -ESTALE);
  } else {
    MAPPED_CHECK_EQ(r, 0);
    MAPPED_CHECK_EQ(rs.addr, want);
  }
  return fails;
}

class MappedFiles : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ASSERT_EQ(geteuid(), 0u) << "the suite runs as root";
    ASSERT_TRUE(scratch_.ok());
    prog_ = scratch_.path("prog");
    lib_ = scratch_.path("libmapped.so");
    ASSERT_TRUE(copy_file(PROBEFS_MAPPED_PROG_A, prog_));
    ASSERT_TRUE(copy_file(PROBEFS_MAPPED_LIB_A, lib_));
    // The rebuilt files must really put the functions elsewhere, or a daemon that read
    // them would find the right addresses by luck.
    uint64_t a = 0, b = 0;
    ASSERT_EQ(symbol_file_offset(PROBEFS_MAPPED_PROG_A, "probefs_mapped_fn", &a), 0);
    ASSERT_EQ(symbol_file_offset(PROBEFS_MAPPED_PROG_B, "probefs_mapped_fn", &b), 0);
    ASSERT_NE(a, b);
    ASSERT_EQ(symbol_file_offset(PROBEFS_MAPPED_LIB_A, "probefs_mapped_lib_fn", &a), 0);
    ASSERT_EQ(symbol_file_offset(PROBEFS_MAPPED_LIB_B, "probefs_mapped_lib_fn", &b), 0);
    ASSERT_NE(a, b);
  }

  bool as_user() const { return GetParam(); }
  uid_t uid() const { return as_user() ? kNobody : 0; }

  Scratch scratch_;
  std::string prog_;
  std::string lib_;
};

TEST_P(MappedFiles, TheFileAsMappedOpensAsItselfForReadingWithoutBlocking) {
  Target t;
  ASSERT_TRUE(t.start(prog_, "", uid()));
  Mapping m;
  ASSERT_TRUE(code_mapping(t.pid, prog_, &m));
  const pid_t pid = t.pid;
  const uintptr_t fn = t.fn;
  run_checker(uid(), [&] {
    std::string fails = check_open(pid, m, false);
    const int fd = open_mapped_file(pid, m);
    MAPPED_CHECK(fd >= 0);
    if (fd >= 0) {
      const int fl = fcntl(fd, F_GETFL);
      MAPPED_CHECK_EQ(fl & O_ACCMODE, O_RDONLY);
      MAPPED_CHECK(fl & O_NONBLOCK);
      MAPPED_CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
      close(fd);
    }
    // map_files is root's alone (CAP_SYS_ADMIN in the initial user namespace); a user
    // reaches the file by its path.
    char mf[96];
    std::snprintf(mf, sizeof mf, "/proc/%d/map_files/%lx-%lx", static_cast<int>(pid),
                  static_cast<unsigned long>(m.start), static_cast<unsigned long>(m.end));
    const int direct = open(mf, O_PATH | O_CLOEXEC);
    if (as_user()) {
      MAPPED_CHECK_EQ(direct, -1);
      MAPPED_CHECK_EQ(errno, EPERM);
    } else {
      MAPPED_CHECK(direct >= 0);
    }
    if (direct >= 0) close(direct);
    fails += check_resolve(pid, "probefs_mapped_fn", fn, false);
    return fails;
  });
}

TEST_P(MappedFiles, AFifoAtThePathIsNeverWaitedOn) {
  Target t;
  ASSERT_TRUE(t.start(prog_, "", uid()));
  Mapping m;
  ASSERT_TRUE(code_mapping(t.pid, prog_, &m));
  // Swapped in after the daemon read maps, and where the deleted file was: nobody will
  // ever open the FIFO's other end.
  ASSERT_EQ(unlink(prog_.c_str()), 0);
  ASSERT_EQ(mkfifo(prog_.c_str(), 0666), 0);
  const pid_t pid = t.pid;
  const uintptr_t fn = t.fn;
  run_checker(uid(), [&] {
    std::string fails = check_open(pid, m, as_user());
    fails += check_resolve(pid, "probefs_mapped_fn", fn, as_user());
    return fails;
  });
}

TEST_P(MappedFiles, ADirectoryAtThePathIsRefused) {
  Target t;
  ASSERT_TRUE(t.start(prog_, "", uid()));
  Mapping m;
  ASSERT_TRUE(code_mapping(t.pid, prog_, &m));
  ASSERT_EQ(unlink(prog_.c_str()), 0);
  ASSERT_EQ(mkdir(prog_.c_str(), 0755), 0);
  const pid_t pid = t.pid;
  run_checker(uid(), [&] { return check_open(pid, m, as_user()); });
}

TEST_P(MappedFiles, ASymlinkSwappedInIsNotFollowed) {
  Target t;
  ASSERT_TRUE(t.start(prog_, "", uid()));
  Mapping m;
  ASSERT_TRUE(code_mapping(t.pid, prog_, &m));
  // The link leads to the rebuilt program: followed, it would give the wrong addresses.
  const std::string other = scratch_.path("other");
  ASSERT_TRUE(copy_file(PROBEFS_MAPPED_PROG_B, other));
  ASSERT_EQ(unlink(prog_.c_str()), 0);
  ASSERT_EQ(symlink(other.c_str(), prog_.c_str()), 0);
  const pid_t pid = t.pid;
  run_checker(uid(), [&] { return check_open(pid, m, as_user()); });
}

TEST_P(MappedFiles, ASymlinkedDirectoryOnThePathIsNotFollowed) {
  const std::string dir = scratch_.path("dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  const std::string prog = dir + "/prog";
  ASSERT_TRUE(copy_file(PROBEFS_MAPPED_PROG_A, prog));
  Target t;
  ASSERT_TRUE(t.start(prog, "", uid()));
  Mapping m;
  ASSERT_TRUE(code_mapping(t.pid, prog, &m));
  // The directory moves away and a link to one holding another build takes its name: the
  // last component is a plain file, the link is above it.
  const std::string elsewhere = scratch_.path("elsewhere");
  ASSERT_EQ(mkdir(elsewhere.c_str(), 0755), 0);
  ASSERT_TRUE(copy_file(PROBEFS_MAPPED_PROG_B, elsewhere + "/prog"));
  ASSERT_EQ(rename(dir.c_str(), scratch_.path("moved").c_str()), 0);
  ASSERT_EQ(symlink(elsewhere.c_str(), dir.c_str()), 0);
  const pid_t pid = t.pid;
  run_checker(uid(), [&] { return check_open(pid, m, as_user()); });
}

TEST_P(MappedFiles, AProgramRebuiltWhileItRunsIsReadAsItRunsOrRefused) {
  Target t;
  ASSERT_TRUE(t.start(prog_, "", uid()));
  ASSERT_TRUE(replace_with(PROBEFS_MAPPED_PROG_B, prog_));
  const pid_t pid = t.pid;
  const uintptr_t fn = t.fn;
  run_checker(uid(), [&] {
    std::string fails = check_resolve(pid, "probefs_mapped_fn", fn, as_user());
    int err = 0;
    auto syms = ProcessSymbols::load(pid, &err);
    MAPPED_CHECK(syms != nullptr);
    if (!syms) return fails;
    bool exe_seen = false;
    for (const MappedObject& o : syms->objects()) {
      if (!o.executable) continue;
      exe_seen = true;
      MAPPED_CHECK_EQ(o.error, as_user() ? -ESTALE : 0);
    }
    MAPPED_CHECK(exe_seen);
    // A definition on it: placed on the running code, or refused with the catalogue's
    // error (what the write into kprobe_events returns and error_log shows).
    events::ParseResult r = events::parse_dynamic_command("p:grp/ev probefs_mapped_fn");
    MAPPED_CHECK(r.status == events::ParseStatus::kDefine);
    std::vector<Mapping> maps;
    MAPPED_CHECK_EQ(read_maps(pid, &maps), 0);
    std::vector<ProbePlace> places;
    events::Diagnostic diag;
    const PlaceStatus st = place_probe(r.def, {}, maps, *syms, &places, &diag);
    if (as_user()) {
      MAPPED_CHECK(st == PlaceStatus::kError);
      MAPPED_CHECK_EQ(diag.err, ESTALE);
      MAPPED_CHECK(diag.code == events::ErrorCode::kMappedFileGone);
      MAPPED_CHECK(diag.logged());
    } else {
      MAPPED_CHECK(st == PlaceStatus::kPlaced);
      MAPPED_CHECK_EQ(places.size(), 1u);
      MAPPED_CHECK(!places.empty() && places[0].addr == fn);
    }
    return fails;
  });
}

TEST_P(MappedFiles, ALibraryReplacedUnderARunningProgramIsReadAsMappedOrRefused) {
  Target t;
  ASSERT_TRUE(t.start(prog_, lib_, uid()));
  ASSERT_NE(t.lib_fn, 0u);
  ASSERT_TRUE(replace_with(PROBEFS_MAPPED_LIB_B, lib_));
  const pid_t pid = t.pid;
  const uintptr_t fn = t.fn;
  const uintptr_t lib_fn = t.lib_fn;
  run_checker(uid(), [&] {
    std::string fails = check_resolve(pid, "libmapped:probefs_mapped_lib_fn", lib_fn, as_user());
    // Unqualified, the library is searched too (after libc and the others before it).
    fails += check_resolve(pid, "probefs_mapped_lib_fn", lib_fn, as_user());
    // The program itself is intact and searched first: its symbols stay reachable.
    fails += check_resolve(pid, "probefs_mapped_fn", fn, false);
    return fails;
  });
}

TEST_P(MappedFiles, AFileOnAnOverlayIsReadAsMappedOrRefused) {
  // The program runs from an overlay mounted in a mount namespace of its own (gone with
  // it). maps shows the overlay's device and inode (the lower file's before Linux 6.x);
  // map_files leads to the lower file: where the numbers differ, the build-id decides.
  const std::string lower = scratch_.path("lower"), upper = scratch_.path("upper"),
                    work = scratch_.path("work"), merged = scratch_.path("merged");
  for (const std::string& d : {lower, upper, work, merged})
    ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
  ASSERT_TRUE(copy_file(PROBEFS_MAPPED_PROG_A, lower + "/prog"));
  const std::string opts = "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work;
  auto mount_overlay = [&] {
    return unshare(CLONE_NEWNS) == 0 &&
           mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
           mount("overlay", merged.c_str(), "overlay", 0, opts.c_str()) == 0;
  };
  // A kernel without overlayfs has nothing to test here; any other failure is one.
  const pid_t probe = fork();
  ASSERT_GE(probe, 0);
  if (probe == 0) {
    alarm(30);
    _exit(mount_overlay() ? 0 : errno == ENODEV ? 1 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(probe, &status, 0), probe);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 1) GTEST_SKIP() << "this kernel has no overlayfs (mount gives ENODEV)";
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "overlay mount: " << status;
  Target t;
  ASSERT_TRUE(t.start(merged + "/prog", "", uid(), mount_overlay))
      << "overlayfs in a new mount namespace";
  Mapping m;
  std::vector<Mapping> maps;
  ASSERT_EQ(read_maps(t.pid, &maps), 0);
  for (const Mapping& x : maps)
    if (x.exec && x.path.ends_with("/prog")) m = x;
  ASSERT_NE(m.inode, 0u);
  const pid_t pid = t.pid;
  const uintptr_t fn = t.fn;
  // The daemon's view has no overlay at that path: the user finds it under the target's
  // root, root through map_files.
  run_checker(uid(), [&] {
    std::string fails;
    const int fd = open_mapped_file(pid, m);
    MAPPED_CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    fails += check_resolve(pid, "probefs_mapped_fn", fn, false);
    return fails;
  });
  // Once the file in the overlay is another build (written through the overlay, into its
  // upper layer): root still reads the lower file the process runs, a user is refused.
  ASSERT_TRUE(replace_with(PROBEFS_MAPPED_PROG_B,
                           "/proc/" + std::to_string(pid) + "/root" + merged + "/prog"));
  run_checker(uid(), [&] {
    std::string fails;
    const int fd = open_mapped_file(pid, m);
    if (as_user()) MAPPED_CHECK_EQ(fd, -ESTALE);
    else MAPPED_CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    fails += check_resolve(pid, "probefs_mapped_fn", fn, as_user());
    return fails;
  });
}

TEST_P(MappedFiles, CodeOfNoFileOnDiskIsNoObjectToRefuse) {
  // A JIT's memfd maps as "/memfd:jit (deleted)", executable: no ELF object, so nothing
  // that makes a lookup refuse. A symbol of no object stays absent (-ENOENT), not -ESTALE.
  Target t;
  ASSERT_TRUE(t.start(prog_, "memfd", uid()));
  std::vector<Mapping> maps;
  ASSERT_EQ(read_maps(t.pid, &maps), 0);
  bool jit = false;
  for (const Mapping& m : maps) jit |= m.exec && m.deleted && m.path.starts_with("/memfd:jit");
  ASSERT_TRUE(jit);
  const pid_t pid = t.pid;
  const uintptr_t fn = t.fn;
  run_checker(uid(), [&] {
    std::string fails = check_resolve(pid, "probefs_mapped_fn", fn, false);
    int err = 0;
    auto syms = ProcessSymbols::load(pid, &err);
    MAPPED_CHECK(syms != nullptr);
    ResolvedSymbol rs;
    if (syms) MAPPED_CHECK_EQ(syms->resolve("probefs_no_such_function", &rs), -ENOENT);
    return fails;
  });
}

INSTANTIATE_TEST_SUITE_P(RootAndUser, MappedFiles, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("AsUser") : std::string("AsRoot");
                         });

}  // namespace
}  // namespace probefs::tracee
