#include "tracee/untraceable.h"

#include <elf.h>
#include <sys/auxv.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "link/socket.h"
#include "tracee/proc_info.h"
#include "tracee/unique_fd.h"

namespace probefs::tracee {
namespace {

// The kernel follows this many interpreters ("#!") before it gives up (ELOOP).
constexpr int kMaxInterpreters = 4;
// Program headers read at most: far more than any program has.
constexpr size_t kMaxPhdrs = 256;

bool read_at(int fd, void* out, size_t n, off_t at) {
  return pread(fd, out, n, at) == static_cast<ssize_t>(n);
}

// What an ELF file (open as `fd`) says of itself: "" for an x86-64 ELF64 program with a
// dynamic loader (PT_INTERP).
Untraceable judge_elf(int fd, const std::string& name) {
  Elf64_Ehdr eh;
  Untraceable u;
  if (!read_at(fd, &eh, sizeof eh, 0) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_machine != EM_X86_64) {
    u.state = "foreign";
    u.why = untraceable_text(u.state, name);
    return u;
  }
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN) return u;
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > kMaxPhdrs) return u;
  Elf64_Phdr dynamic{};
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    if (!read_at(fd, &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + uint64_t{i} * sizeof ph)))
      return u;
    if (ph.p_type == PT_INTERP) return u;
    if (ph.p_type == PT_DYNAMIC) dynamic = ph;
  }
  // A shared object run as a program (the dynamic loader itself: `ld.so ./prog` honours
  // LD_PRELOAD) has a DT_SONAME; a static-pie program has none.
  for (uint64_t at = 0; dynamic.p_filesz != 0 && at + sizeof(Elf64_Dyn) <= dynamic.p_filesz &&
                        at < 512 * sizeof(Elf64_Dyn);
       at += sizeof(Elf64_Dyn)) {
    Elf64_Dyn d;
    if (!read_at(fd, &d, sizeof d, static_cast<off_t>(dynamic.p_offset + at)) || d.d_tag == DT_NULL)
      break;
    if (d.d_tag == DT_SONAME) return u;
  }
  u.state = "static";
  u.why = untraceable_text(u.state, name);
  return u;
}

// Whether running the file open as `fd` changes the ids or capabilities of a process
// with real ids uid and gid, which puts its loader in secure-execution mode.
bool secure_exec(int fd, uid_t uid, gid_t gid) {
  struct stat st;
  struct statvfs vfs;
  if (fstat(fd, &st) != 0) return false;
  const bool nosuid = fstatvfs(fd, &vfs) == 0 && (vfs.f_flag & ST_NOSUID) != 0;
  if (!nosuid && (st.st_mode & S_ISUID) && st.st_uid != uid) return true;
  if (!nosuid && (st.st_mode & S_ISGID) && (st.st_mode & S_IXGRP) && st.st_gid != gid)
    return true;
  // File capabilities raise a non-root process's: secure.
  return uid != 0 && fgetxattr(fd, "security.capability", nullptr, 0) > 0;
}

Untraceable judge_program(const std::string& path, uid_t uid, gid_t gid, int depth) {
  Untraceable u;
  // Non-blocking: a FIFO named as an interpreter would hold the open (its reads fail).
  const UniqueFd file(open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  const int fd = file.get();
  if (fd < 0) return u;
  char head[256];
  const ssize_t n = pread(fd, head, sizeof head, 0);
  if (n >= 4 && std::memcmp(head, ELFMAG, SELFMAG) == 0) {
    u = judge_elf(fd, path);
    if (u.state.empty() && secure_exec(fd, uid, gid)) {
      u.state = "secure-exec";
      u.why = untraceable_text(u.state, path);
    }
    return u;
  }
  if (n < 3 || head[0] != '#' || head[1] != '!' || depth >= kMaxInterpreters) return u;
  // "#! /path/to/interpreter [arg]": the interpreter runs, with the script's set-id bits
  // ignored (the kernel's rule for scripts).
  const std::string line(head + 2, static_cast<size_t>(n) - 2);
  size_t start = line.find_first_not_of(" \t");
  if (start == std::string::npos) return u;
  const size_t end = line.find_first_of(" \t\n", start);
  const std::string interpreter = line.substr(start, end == std::string::npos ? end : end - start);
  if (interpreter.empty() || (end == std::string::npos && static_cast<size_t>(n) == sizeof head))
    return u;  // an interpreter line longer than we read: not judged
  return judge_program(interpreter, uid, gid, depth + 1);
}

}  // namespace

std::string untraceable_text(const std::string& state, const std::string& path) {
  std::string name = path.substr(0, 256);
  for (char& c : name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  if (state == "static")
    return name + " is statically linked: no dynamic loader runs in it to preload the agent";
  if (state == "secure-exec")
    return name + " runs with other ids or capabilities than its user's (set-user-ID, "
                  "set-group-ID or file capabilities): its loader ignores the preloaded agent";
  if (state == "foreign") return name + " is no x86-64 ELF64 program: the agent cannot enter it";
  return {};
}

Untraceable untraceable_program(const std::string& path, uid_t uid, gid_t gid) {
  return judge_program(path, uid, gid, 0);
}

// Whether the environment `pid` was started with preloads the agent (by its file name)
// and names a link; true when it cannot be read whole (not judged).
bool environ_carries_agent(pid_t pid, const std::string& agent_path) {
  constexpr size_t kMaxEnviron = 1 << 20;
  std::string env;
  if (read_proc_file(pid, 0, "environ", &env, kMaxEnviron) != 0 || env.size() >= kMaxEnviron)
    return true;
  const size_t slash = agent_path.rfind('/');
  const std::string agent = agent_path.substr(slash == std::string::npos ? 0 : slash + 1);
  const std::string link_var = std::string(link::kLinkEnv) + "=";
  bool preloaded = false, linked = false;
  for (size_t at = 0; at < env.size();) {
    size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    const std::string_view var(env.data() + at, end - at);
    if (var.rfind("LD_PRELOAD=", 0) == 0 && !agent.empty() &&
        var.find(agent) != std::string_view::npos)
      preloaded = true;
    if (var.rfind(link_var, 0) == 0) linked = true;
    at = end + 1;
  }
  return preloaded && linked;
}

Untraceable untraceable_process(pid_t pid, const std::string& agent_path) {
  Untraceable u;
  std::string name = proc_exe(pid);
  if (name.empty()) name = "the program";
  auto secure = [&] {
    u.state = "secure-exec";
    u.why = untraceable_text(u.state, name);
    return u;
  };
  {
    const UniqueFd exe(open(proc_path(pid, 0, "exe").c_str(), O_RDONLY | O_CLOEXEC));
    if (exe.get() < 0) {
      if (errno == EACCES || errno == EPERM) return secure();  // undumpable: ids changed
      return u;  // gone
    }
    u = judge_elf(exe.get(), name);
    if (!u.state.empty()) return u;
  }
  // The auxiliary vector of the new image: written last in an exec, so an empty one is
  // an exec still under way. AT_SECURE is the loader's own secure-execution mode.
  std::string auxv;
  const int err = read_proc_file(pid, 0, "auxv", &auxv, 4096);
  if (err == -EACCES || err == -EPERM) return secure();
  if (err != 0) return u;
  if (auxv.size() < 16) {
    u.settled = false;
    return u;
  }
  for (size_t at = 0; at + 16 <= auxv.size(); at += 16) {
    uint64_t type = 0, value = 0;
    std::memcpy(&type, auxv.data() + at, 8);
    std::memcpy(&value, auxv.data() + at + 8, 8);
    if (type == AT_NULL) break;
    if (type == AT_SECURE && value != 0) return secure();
  }
  if (!environ_carries_agent(pid, agent_path)) {
    u.state = "no-agent";
    u.why = name + " started without the agent in its environment (LD_PRELOAD or " +
            std::string(link::kLinkEnv) + " taken out of it)";
  }
  return u;
}

}  // namespace probefs::tracee
