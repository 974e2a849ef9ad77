// Why a program cannot become a target (tracee/untraceable.h), judged from files and from
// this process: a static program, scripts whose interpreter is one, a 32-bit ELF, a
// set-user-ID program of another user, and a process started without the agent.
#include "tracee/untraceable.h"

#include <elf.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace probefs::tracee {
namespace {

const std::string kStatic = PROBEFS_UNTRACEABLE_STATIC;

class UntraceableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "probefs-untr-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text, mode_t mode = 0755) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(UntraceableTest, StaticProgramsAndScriptsRunByThem) {
  Untraceable u = untraceable_program(kStatic, getuid(), getgid());
  EXPECT_EQ(u.state, "static");
  EXPECT_EQ(u.why, kStatic + " is statically linked: no dynamic loader runs in it to preload "
                             "the agent");
  // A script is its interpreter's, through as many interpreters as the kernel follows.
  const std::string script = file("s1", "#!" + kStatic + " -x\nping\n");
  EXPECT_EQ(untraceable_program(script, getuid(), getgid()).state, "static");
  const std::string nested = file("s2", "#! " + script + "\n");
  EXPECT_EQ(untraceable_program(nested, getuid(), getgid()).state, "static");
  // What probefs can enter, and what it does not judge.
  EXPECT_EQ(untraceable_program("/proc/self/exe", getuid(), getgid()).state, "");
  // The dynamic loader run as a program (ld.so ./prog) reads LD_PRELOAD itself.
  if (access("/lib64/ld-linux-x86-64.so.2", R_OK) == 0) {
    EXPECT_EQ(untraceable_program("/lib64/ld-linux-x86-64.so.2", getuid(), getgid()).state, "");
  }
  EXPECT_EQ(untraceable_program(file("sh", "#!/bin/sh\necho\n"), getuid(), getgid()).state, "");
  EXPECT_EQ(untraceable_program(file("text", "hello\n"), getuid(), getgid()).state, "");
  // An interpreter that is a FIFO is not judged, and does not hold the judge (the open
  // would wait for a writer).
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(untraceable_program(file("onfifo", "#!" + fifo + "\n"), getuid(), getgid()).state, "");
  EXPECT_EQ(untraceable_program(dir_ + "/none", getuid(), getgid()).state, "");
}

TEST_F(UntraceableTest, AnotherArchitecturesProgramIsForeign) {
  Elf32_Ehdr eh{};
  memcpy(eh.e_ident, ELFMAG, SELFMAG);
  eh.e_ident[EI_CLASS] = ELFCLASS32;
  eh.e_ident[EI_DATA] = ELFDATA2LSB;
  eh.e_type = ET_EXEC;
  eh.e_machine = EM_386;
  const std::string path =
      file("i386", std::string(reinterpret_cast<const char*>(&eh), sizeof eh));
  const Untraceable u = untraceable_program(path, getuid(), getgid());
  EXPECT_EQ(u.state, "foreign");
  EXPECT_EQ(u.why, path + " is no x86-64 ELF64 program: the agent cannot enter it");
}

// A set-user-ID program of another user makes its exec a secure one: its loader ignores
// LD_PRELOAD. Its owner running it, or a filesystem mounted nosuid, does not.
TEST_F(UntraceableTest, SetUserIdProgramOfAnotherUser) {
  const std::string copy = dir_ + "/suid";
  std::filesystem::copy_file("/proc/self/exe", copy);
  ASSERT_EQ(chmod(copy.c_str(), 04755), 0);
  EXPECT_EQ(untraceable_program(copy, getuid(), getgid()).state, "");  // its own owner's
  struct statvfs vfs;
  ASSERT_EQ(statvfs(dir_.c_str(), &vfs), 0);
  const uid_t other = getuid() == 65534 ? 65533 : 65534;
  const Untraceable u = untraceable_program(copy, other, getgid());
  if (vfs.f_flag & ST_NOSUID) {
    EXPECT_EQ(u.state, "") << "set-user-ID bits mean nothing on a nosuid filesystem";
  } else {
    EXPECT_EQ(u.state, "secure-exec");
    EXPECT_NE(u.why.find(" runs with other ids or capabilities"), std::string::npos) << u.why;
  }
}

// Set-group-ID for another group, and file capabilities for a non-root user: secure
// executions too. (Run as root, which may set both on a file of its own.)
TEST_F(UntraceableTest, SetGroupIdAndFileCapabilities) {
  if (geteuid() != 0) GTEST_SKIP() << "not root: cannot give a file another group or capabilities";
  struct statvfs vfs;
  ASSERT_EQ(statvfs(dir_.c_str(), &vfs), 0);
  if (vfs.f_flag & ST_NOSUID) GTEST_SKIP() << "the temporary directory is on a nosuid mount";
  const std::string sgid = dir_ + "/sgid";
  std::filesystem::copy_file("/proc/self/exe", sgid);
  ASSERT_EQ(chown(sgid.c_str(), 0, 65534), 0);
  ASSERT_EQ(chmod(sgid.c_str(), 02755), 0);
  EXPECT_EQ(untraceable_program(sgid, 1000, 1000).state, "secure-exec");
  EXPECT_EQ(untraceable_program(sgid, 1000, 65534).state, "");  // its own group
  // security.capability, revision 2: cap_net_raw (13) permitted and effective.
  const std::string caps = dir_ + "/caps";
  std::filesystem::copy_file("/proc/self/exe", caps);
  const uint32_t data[5] = {0x02000000u | 1u, 1u << 13, 0, 0, 0};
  if (setxattr(caps.c_str(), "security.capability", data, sizeof data, 0) != 0)
    GTEST_SKIP() << "no file capabilities here: " << strerror(errno);
  EXPECT_EQ(untraceable_program(caps, 1000, 1000).state, "secure-exec");
  EXPECT_EQ(untraceable_program(caps, 0, 0).state, "");  // root gains nothing it lacks
}

// This test runs without the agent in its environment: a process probefs would call
// no-agent, had it been started for it.
TEST_F(UntraceableTest, AProcessStartedWithoutTheAgent) {
  const Untraceable u = untraceable_process(getpid(), "/opt/probefs/libprobefs-agent.so");
  EXPECT_TRUE(u.settled);
  if (getenv("PROBEFS_AGENT_LINK") == nullptr) {
    EXPECT_EQ(u.state, "no-agent");
    EXPECT_NE(u.why.find("started without the agent in its environment"), std::string::npos);
  }
  EXPECT_EQ(untraceable_process(0x3ffffffe, "x").state, "");  // no such process
}

TEST(UntraceableText, StatesAndTheirLines) {
  EXPECT_EQ(untraceable_text("static", "/bin/a\nb"),
            "/bin/a?b is statically linked: no dynamic loader runs in it to preload the agent");
  EXPECT_EQ(untraceable_text("no-agent", "/bin/a"), "");
  EXPECT_EQ(untraceable_text("bogus", "/bin/a"), "");
  EXPECT_EQ(untraceable_text("foreign", std::string(1000, 'x')).size(),
            256 + std::string(" is no x86-64 ELF64 program: the agent cannot enter it").size());
}

}  // namespace
}  // namespace probefs::tracee
