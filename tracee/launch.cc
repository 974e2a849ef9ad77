#include "tracee/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "link/socket.h"

extern char** environ;

namespace probefs::tracee {

namespace {

using Clock = std::chrono::steady_clock;

std::string env_name(const std::string& entry) { return entry.substr(0, entry.find('=')); }

void set_env(std::vector<std::string>* env, const std::string& entry) {
  const std::string name = env_name(entry);
  for (std::string& e : *env) {
    if (env_name(e) == name) {
      e = entry;
      return;
    }
  }
  env->push_back(entry);
}

const std::string* find_env(const std::vector<std::string>& env, const std::string& name) {
  for (const std::string& e : env)
    if (env_name(e) == name && e.size() > name.size()) return &e;
  return nullptr;
}

// argv[0] as execve needs it: as given when it names a path, else the first executable
// file of that name in the child's PATH.
std::string find_program(const std::string& arg0, const std::vector<std::string>& env) {
  if (arg0.find('/') != std::string::npos) return arg0;
  const std::string* path = find_env(env, "PATH");
  std::string dirs = path ? path->substr(5) : "/usr/local/bin:/usr/bin:/bin";
  size_t at = 0;
  while (at <= dirs.size()) {
    size_t colon = dirs.find(':', at);
    if (colon == std::string::npos) colon = dirs.size();
    std::string dir = dirs.substr(at, colon - at);
    std::string cand = (dir.empty() ? "." : dir) + "/" + arg0;
    struct stat st;
    if (::stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(cand.c_str(), X_OK) == 0)
      return cand;
    at = colon + 1;
  }
  return {};
}

// Reaps the child after killing it, so no zombie outlives a failed launch.
void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

std::vector<std::string> agent_environment(const std::string& agent_path,
                                           const std::string& link_name,
                                           const char* ld_preload) {
  std::string preload = "LD_PRELOAD=" + agent_path;
  if (ld_preload && *ld_preload) preload += std::string(":") + ld_preload;
  return {preload, std::string(link::kLinkEnv) + "=" + link_name};
}

int launch(AgentListener& listener, const LaunchOptions& opts, Launched* out,
           std::string* error) {
  auto fail = [&](int e, std::string why) {
    if (error) *error = std::move(why);
    return e;
  };
  if (opts.argv.empty()) return fail(-EINVAL, "no program");
  if (opts.agent_path.empty() || opts.agent_path.find(':') != std::string::npos ||
      opts.agent_path.find(' ') != std::string::npos)
    return fail(-EINVAL, "the agent's path is empty or has a ':' or ' '");

  // Everything the child needs is built before the fork: after it, the child of a threaded
  // daemon may call only async-signal-safe functions.
  std::vector<std::string> env;
  if (opts.replace_env) {
    env = opts.env_replace;
  } else {
    for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  }
  for (const std::string& e : opts.env_add) {
    if (e.find('=') == std::string::npos) return fail(-EINVAL, "environment entry without '='");
    set_env(&env, e);
  }
  const std::string* old_preload = find_env(env, "LD_PRELOAD");
  for (const std::string& e : agent_environment(
           opts.agent_path, listener.name(),
           old_preload ? old_preload->c_str() + std::strlen("LD_PRELOAD=") : nullptr))
    set_env(&env, e);

  const std::string program = find_program(opts.argv[0], env);
  if (program.empty()) return fail(-ENOENT, opts.argv[0] + ": command not found");

  std::vector<char*> argv, envp;
  for (const std::string& a : opts.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  // go: the parent lets the child exec once it expects its HELLO. err: the child reports
  // a failed execve; closed (CLOEXEC) when execve succeeds.
  int go[2], err[2];
  if (::pipe2(go, O_CLOEXEC) != 0) return fail(-errno, "pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) {
    int e = errno;
    ::close(go[0]);
    ::close(go[1]);
    return fail(-e, "pipe");
  }

  const pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {go[0], go[1], err[0], err[1]}) ::close(fd);
    return fail(-e, "fork");
  }
  if (pid == 0) {
    // The child: async-signal-safe calls only.
    char byte;
    while (::read(go[0], &byte, 1) < 0 && errno == EINTR) {
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl{};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s)
      if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, nullptr);
    const int fds[3] = {opts.stdin_fd, opts.stdout_fd, opts.stderr_fd};
    for (int i = 0; i < 3; ++i)
      if (fds[i] >= 0 && fds[i] != i && ::dup2(fds[i], i) < 0) goto failed;
    if (!opts.cwd.empty() && ::chdir(opts.cwd.c_str()) != 0) goto failed;
    if (opts.nofile_soft != 0) {
      rlimit rl;
      if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && opts.nofile_soft < rl.rlim_cur) {
        rl.rlim_cur = opts.nofile_soft;
        (void)::setrlimit(RLIMIT_NOFILE, &rl);
      }
    }
    ::execve(program.c_str(), argv.data(), envp.data());
  failed:
    int e = errno;
    (void)!::write(err[1], &e, sizeof e);
    ::_exit(127);
  }

  ::close(go[0]);
  ::close(err[1]);
  listener.expect(pid);
  (void)!::write(go[1], "g", 1);
  ::close(go[1]);

  auto give_up = [&](int e, std::string why) {
    listener.unexpect(pid);
    kill_and_reap(pid);
    return fail(e, std::move(why));
  };

  const auto deadline = Clock::now() + opts.timeout;
  // The exec's outcome: EOF when it succeeded, an errno when it failed.
  {
    int child_errno = 0;
    size_t got = 0;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{err[0], POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        ::close(err[0]);
        return give_up(-ETIMEDOUT, "the child did not exec in time");
      }
      ssize_t n = ::read(err[0], reinterpret_cast<char*>(&child_errno) + got,
                         sizeof child_errno - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
      if (got == sizeof child_errno) break;
    }
    ::close(err[0]);
    if (got == sizeof child_errno)
      return give_up(-child_errno, program + ": " + std::strerror(child_errno));
  }

  // The agent's HELLO, watching for the child's death meanwhile.
  for (;;) {
    int e = 0;
    auto lk = listener.wait_for(pid, std::chrono::milliseconds(20), &e);
    if (lk) {
      out->pid = pid;
      out->link = std::move(lk);
      return 0;
    }
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        si.si_pid == pid)
      return give_up(-ECHILD, "the program ended before its agent connected");
    if (Clock::now() >= deadline)
      return give_up(-ETIMEDOUT, "the agent did not connect (static program, or setuid, or "
                                 "the agent could not load)");
  }
}

}  // namespace probefs::tracee
