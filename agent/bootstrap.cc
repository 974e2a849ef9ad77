// How the agent comes to life and finds its daemon, and how it lets go.
//
// Launch (and exec of a launched program): the launcher preloads the agent with
// PROBEFS_AGENT_LINK naming the daemon's link (link::kLinkEnv). The constructor connects,
// says HELLO and serves the daemon's requests on the program's own thread until GO, so
// every probe defined before the launch is in place when main's first instruction runs.
// If the daemon does not send GO in time the program runs on, traced; if the daemon is
// gone, untraced.
//
// Attach: the injector dlopen's the agent (the constructor finds no link to serve: the
// agent is not in LD_PRELOAD) and calls probefs_agent_attach() on a thread it controls.
//
// Then one control thread per process serves the link until it ends. It is an engine
// thread (its hits run no handler) with every asynchronous signal blocked, so the
// program's handlers never run on it. EOF on the link (the daemon detached, exited or was
// killed) removes every probe and the ring area, at once, and the agent goes idle: a new
// daemon can attach again.
//
// fork: the atfork child handler drops what belongs to the parent (its link, its ring
// area, the forking thread's ring) before the child runs any code of its own; its probes
// are the parent's (the code was copied with them). With the spare area the daemon handed
// the parent (SPARE) the child records there from its first instruction: it connects,
// says HELLO kFork naming the spare, starts its control thread and runs on, waiting for
// nothing; the daemon then sends the parent the next spare (the parent's handler only
// marks the spare taken: no system call). Without a spare (none came yet, or another
// fork took it) the child connects with HELLO kFork and serves the daemon until GO like
// a launched program. If no daemon answers, the child removes its probes. A child of
// _Fork, vfork or a raw clone runs no atfork handler: its handlers see a thread id that is
// not the ring's and record nothing (see hit.cc).
//
// exec: the link is CLOEXEC, so the daemon reads EOF; a launched program keeps the
// variables in its environment, so the new image's agent connects with HELLO kExec.
#include <dlfcn.h>
#include <link.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent.h"
#include "agent/symbols.h"
#include "arch/membarrier.h"
#include "arch/syscall.h"
#include "events/ring.h"
#include "link/socket.h"

namespace probefs::agent {

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kConnectTimeout = 2000ms;
constexpr auto kSendTimeout = 5000ms;
// How long a launched (exec'd, fork child) program waits for GO before it runs anyway.
constexpr auto kGoTimeout = 30000ms;
// The variable that tells an exec'd image that a traced process ran before it.
constexpr const char* kStartedEnv = "PROBEFS_AGENT_PID";

std::mutex g_send_mu;
int g_link_fd = -1;                       // g_send_mu to use; g_ctl_mu and g_send_mu to change
// Plain data only in this file: its constructor runs before its own dynamic initialisers.
char g_link_name[108];                    // g_ctl_mu
pid_t g_daemon_pid = 0;                   // g_ctl_mu
std::atomic<bool> g_linked{false};        // a link exists (written under g_ctl_mu)
std::atomic<bool> g_control_running{false};
std::atomic<uint32_t> g_seq{1};
bool g_engine_ready = false;              // g_ctl_mu

// ---------------------------------------------------------------------------------------
// Engine and process setup

// Reads glibc's descriptor of its thread-id field (libthread_db's: bits, count, offset)
// and accepts the offset when it gives this thread's id.
void find_tid_offset() {
  const auto* desc = static_cast<const uint32_t*>(dlsym(RTLD_DEFAULT, "_thread_db_pthread_tid"));
  if (!desc || desc[0] != 32 || desc[1] != 1 || desc[2] > 4096) return;
  uintptr_t self;
  asm volatile("mov %%fs:0x10, %0" : "=r"(self));
  if (self != reinterpret_cast<uintptr_t>(pthread_self())) return;
  int32_t tid;
  std::memcpy(&tid, reinterpret_cast<const void*>(self + desc[2]), 4);
  if (tid != static_cast<int32_t>(arch::raw_syscall(__NR_gettid))) return;
  g_tid_offset = static_cast<long>(desc[2]);
}

void atfork_prepare();
void atfork_parent();
void atfork_child();

// Starts the engine (its trap handler and optimizer thread) and hooks fork, after the
// engine's own fork handlers so that the child's engine is usable when ours run.
// g_ctl_mu held.
int ensure_engine() {
  if (g_engine_ready) return 0;
  probecore::set_symbol_resolver(&defined_symbols());
  (void)probecore::within_kprobe_blacklist(0);  // initialises the engine
  init_thread_exit();
  if (pthread_atfork(atfork_prepare, atfork_parent, atfork_child) != 0) return -ENOMEM;
  g_engine_ready = true;
  return 0;
}

// The thread group of the process tracing the calling thread (0: none).
pid_t tracer_tgid() {
  auto field = [](const char* path, const char* name) -> long {
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[4096];
    ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    const char* at = std::strstr(buf, name);
    return at ? std::strtol(at + std::strlen(name), nullptr, 10) : -1;
  };
  long tracer = field("/proc/thread-self/status", "\nTracerPid:");
  if (tracer < 0) tracer = field("/proc/self/status", "\nTracerPid:");
  if (tracer <= 0) return 0;
  const std::string path = "/proc/" + std::to_string(tracer) + "/status";
  const long tgid = field(path.c_str(), "\nTgid:");
  return static_cast<pid_t>(tgid > 0 ? tgid : tracer);
}

// The peer of a new link is the daemon the name promises, of root's uid or ours; at
// attach, also the process that traces us.
int check_peer(int fd, pid_t daemon_pid, bool must_trace_us) {
  link::PeerCred pc;
  if (int rc = link::peer_cred(fd, &pc); rc) return rc;
  if (pc.pid != daemon_pid) return -EPERM;
  if (pc.uid != 0 && pc.uid != ::getuid() && pc.uid != ::geteuid()) return -EPERM;
  if (must_trace_us && tracer_tgid() != daemon_pid) return -EPERM;
  return 0;
}

// ---------------------------------------------------------------------------------------
// Serving

void send_reply(uint32_t seq, lk::Reply r) {
  lk::Message m;
  m.type = lk::MsgType::kReply;
  m.seq = seq;
  if (r.message.size() > 1 << 20) r.message.resize(1 << 20);
  m.body = std::move(r);
  (void)send_on_link(m);
}

enum class Outcome { kContinue, kGo, kDetached };

// DETACH: everything goes and the agent is idle before the reply leaves, so that the
// daemon may attach again as soon as it has it. The link is closed after the reply; the
// serving thread then ends without touching the agent's state again.
void forget_environment();

void detach_now(uint32_t seq) {
  dl_mailbox_close();
  forget_environment();  // its next exec and its children run without the agent
  int fd;
  {
    std::lock_guard l(g_ctl_mu);
    teardown();
    std::lock_guard s(g_send_mu);
    fd = g_link_fd;
    g_link_fd = -1;
    g_linked.store(false);
    g_control_running.store(false);
  }
  lk::Message m;
  m.type = lk::MsgType::kReply;
  m.seq = seq;
  m.body = lk::Reply{};
  (void)link::send_message(fd, m, kSendTimeout);
  ::close(fd);
}

Outcome serve_packet(const std::vector<uint8_t>& buf, int received_fd) {
  lk::Message m;
  m.type = static_cast<lk::MsgType>(0);  // stays 0 when even the header is unsound
  std::string why;
  if (int rc = lk::decode(buf.data(), buf.size(), &m, &why); rc) {
    if (received_fd >= 0) ::close(received_fd);
    if (m.type != lk::MsgType::kReply) {
      std::string what = m.type == static_cast<lk::MsgType>(0)
                             ? std::string("malformed message")
                             : std::string("malformed ") + lk::type_name(m.type);
      send_reply(m.seq, {rc, what + ": " + why, {}});
    }
    return Outcome::kContinue;
  }
  if (dl_mailbox_offer(m)) {
    if (received_fd >= 0) ::close(received_fd);
    return Outcome::kContinue;
  }
  switch (m.type) {
    case lk::MsgType::kReply:
      if (received_fd >= 0) ::close(received_fd);
      return Outcome::kContinue;  // an answer that came too late
    case lk::MsgType::kGo:
      if (received_fd >= 0) ::close(received_fd);
      send_reply(m.seq, {});
      return Outcome::kGo;
    case lk::MsgType::kDetach:
      if (received_fd >= 0) ::close(received_fd);
      detach_now(m.seq);
      return Outcome::kDetached;
    default: {
      lk::Reply r;
      {
        std::lock_guard l(g_ctl_mu);
        handle_request(m, received_fd, &r);
      }
      send_reply(m.seq, std::move(r));
      return Outcome::kContinue;
    }
  }
}

// The link ended (EOF, an error, a failed handshake): everything goes, the agent idles.
void end_link() {
  dl_mailbox_close();
  std::lock_guard l(g_ctl_mu);
  teardown();
  {
    std::lock_guard s(g_send_mu);
    if (g_link_fd >= 0) ::close(g_link_fd);
    g_link_fd = -1;
  }
  g_linked.store(false);
  g_control_running.store(false);
}

void* control_main(void*) {
  probecore::set_engine_thread(true);
  ::prctl(PR_SET_NAME, "probefs-agent");
  int fd;
  {
    std::lock_guard s(g_send_mu);
    fd = g_link_fd;
  }
  std::vector<uint8_t> buf;
  bool torn_down = false;
  for (;;) {
    int received = -1;
    const long n = link::recv_packet(fd, &buf, -1ms, &received);
    if (n == -EMSGSIZE) {
      send_reply(0, {-EMSGSIZE, "message longer than the link allows", {}});
      continue;
    }
    if (n <= 0) break;  // EOF: the daemon is gone (or an error on the socket)
    if (serve_packet(buf, received) == Outcome::kDetached) {
      torn_down = true;
      break;
    }
  }
  if (!torn_down) end_link();  // after DETACH, detach_now() has done it all
  return nullptr;
}

// Starts the control thread with every asynchronous signal blocked: the program's
// handlers must not run on it. Synchronous signals stay open (a probe's int3 on this
// thread, a fault), and so does the engine's thread-fixup signal.
//
// It runs on a stack of the agent's own, made once: a fork child starts its control thread
// on the region its parent's ran on, which no thread of the child uses. With a stack of
// glibc's, the child's pthread_create would take glibc's cached-stack path, whose first
// call in a process binds a libc symbol lazily: every fork child walked every loaded
// object's symbol table, a dozen page faults.
constexpr size_t kControlStackBytes = size_t{8} << 20;
constexpr size_t kControlStackGuard = 4096;
void* g_ctl_stack = nullptr;    // the thread starting the control thread (one at a time)
bool g_ctl_stack_busy = false;  // a thread of this process runs on it (or ran, and may still)

void* control_stack() {
  if (g_ctl_stack_busy) return nullptr;  // a control thread that ended may still be on it
  if (!g_ctl_stack) {
    void* p = ::mmap(nullptr, kControlStackBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    (void)::mprotect(p, kControlStackGuard, PROT_NONE);
    g_ctl_stack = p;
  }
  return g_ctl_stack;
}

int start_control_thread() {
  sigset_t all, old;
  sigfillset(&all);
  for (int s : {SIGTRAP, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGSYS, SIGRTMAX - 1}) sigdelset(&all, s);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  void* stack = control_stack();
  if (stack) pthread_attr_setstack(&attr, stack, kControlStackBytes);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  g_control_running.store(true);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, control_main, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    g_control_running.store(false);
  } else {
    if (stack) g_ctl_stack_busy = true;
    dl_mailbox_reader_created();
  }
  return -rc;
}

// A fork child says which of its parent's probes it holds (the daemon then need not ask):
// as many as fit in one message; with more, none, and the daemon asks (PROFILE).
constexpr size_t kHelloMaxProbes = 32768;

int send_hello(lk::HelloReason reason, std::vector<uint32_t> held, uint32_t spare_id = 0) {
  lk::Message m;
  m.type = lk::MsgType::kHello;
  m.seq = next_agent_seq();
  lk::Hello h;
  h.pid = static_cast<int32_t>(::getpid());
  h.ppid = static_cast<int32_t>(::getppid());
  h.reason = reason;
  h.probe_ids = std::move(held);
  h.spare_id = spare_id;
  m.body = std::move(h);
  return send_on_link(m);
}

// Takes fd as the link: g_ctl_mu held. At attach the guards go in now, on a thread of the
// program's (they adopt its mask); a process that starts gets them at GO, with its probes
// (control.cc, end_startup).
void adopt_link(int fd, std::string_view name, pid_t daemon_pid, bool guards) {
  {
    std::lock_guard s(g_send_mu);
    g_link_fd = fd;
  }
  if (name.data() != g_link_name)  // a fork child's is its parent's, in place
    std::snprintf(g_link_name, sizeof g_link_name, "%.*s", static_cast<int>(name.size()),
                  name.data());
  g_daemon_pid = daemon_pid;
  g_linked.store(true);
  dl_mailbox_open();
  // Without the guards the program could displace the engine's signals, and fetch reads
  // go through system calls (AreaState::fault_tolerant stays off); tracing goes on.
  if (guards) (void)install_guards();
}

// The membarrier commands the engine and the rings use, registered while the program has
// one thread: the kernel registers a process with more threads only after an RCU grace
// period, 10-20 ms each on our VMs, and every exec'd program and fork child paid three of them
// before it ran on (the engine's first probe starts its optimizer thread). Registering again
// later is free.
void register_barriers() {
  (void)arch::membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
  (void)arch::membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE);
  (void)events::ring_register_producer_process();
}

// Launch, exec, fork child: connect, HELLO, serve until GO, then the control thread. The
// caller's thread is marked as the engine's meanwhile. False when the program runs on
// untraced; *unreached then holds the error when the daemon could not be reached at all.
bool serve_start(const std::string& name, pid_t daemon_pid, lk::HelloReason reason,
                 int* unreached = nullptr) {
  const bool fork_child = reason == lk::HelloReason::kFork;  // its engine is its parent's
  int fd = link::connect_link(name, kConnectTimeout);
  if (fd < 0) {
    if (unreached) *unreached = fd;
    return false;
  }
  std::vector<uint32_t> held;  // a fork child's probes, its parent's
  {
    std::lock_guard l(g_ctl_mu);
    if (int e = check_peer(fd, daemon_pid, false); e != 0) {
      ::close(fd);
      if (unreached) *unreached = e;
      return false;
    }
    adopt_link(fd, name, daemon_pid, false);
    begin_startup();
    if (fork_child) held = probe_ids(kHelloMaxProbes);
  }
  // Every way out: what was defined meanwhile is enabled (GO, or none in time) or gone.
  struct StartupEnd {
    ~StartupEnd() {
      std::lock_guard l(g_ctl_mu);
      end_startup();
    }
  } startup_end;
  if (send_hello(reason, std::move(held)) != 0) {
    end_link();
    return false;
  }
  if (!fork_child) {
    // While the daemon reads the new image's symbols, what needs no answer: the
    // membarrier registrations (still one thread here; a fork child's came with its
    // parent's memory) and the engine with its thread. (Not the guards: their probes
    // may not take an int3, and to tell whether their jmps fit the engine needs the
    // daemon's branch table of libc, which comes with SETUP, else it sweeps libc.)
    register_barriers();
    int rc;
    {
      std::lock_guard l(g_ctl_mu);
      rc = ensure_engine();
    }
    if (rc != 0) {
      end_link();
      return false;
    }
  }
  const auto deadline = Clock::now() + kGoTimeout;
  std::vector<uint8_t> buf;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;  // no GO in time: run on, traced
    int received = -1;
    const long n = link::recv_packet(fd, &buf, left, &received);
    if (n == -ETIMEDOUT) break;
    if (n == -EMSGSIZE) {
      send_reply(0, {-EMSGSIZE, "message longer than the link allows", {}});
      continue;
    }
    if (n <= 0) {
      end_link();
      return false;
    }
    const Outcome o = serve_packet(buf, received);
    if (o == Outcome::kDetached) return false;
    if (o == Outcome::kGo) break;
  }
  {
    std::lock_guard l(g_ctl_mu);
    end_startup();
    (void)install_dl_hook();
  }
  if (start_control_thread() != 0) {
    end_link();
    return false;
  }
  return true;
}

// A fork child's HELLO naming the spare it took, encoded on the stack: in a fork child
// every heap page written is a copy, a fault that costs more than the rest of the HELLO.
// A process with more probes than fit says HELLO the allocating way.
constexpr size_t kStackHelloProbes = 256;

int send_spare_hello(uint32_t spare_id) {
  uint32_t ids[kStackHelloProbes];
  size_t n = 0;
  if (!probe_ids_into(ids, kStackHelloProbes, &n))
    return send_hello(lk::HelloReason::kFork, probe_ids(kHelloMaxProbes), spare_id);
  lk::Hello h;
  h.pid = static_cast<int32_t>(::getpid());
  h.ppid = static_cast<int32_t>(::getppid());
  h.reason = lk::HelloReason::kFork;
  h.spare_id = spare_id;
  uint8_t packet[lk::kHeaderSize + 32 + 4 * kStackHelloProbes];
  const size_t len = lk::encode_hello(packet, sizeof packet, next_agent_seq(), h, ids, n);
  if (len == 0) return -EINVAL;
  std::lock_guard s(g_send_mu);
  if (g_link_fd < 0) return -ENOTCONN;
  return link::send_packet(g_link_fd, packet, len, kSendTimeout);
}

// A fork child that took its parent's spare area (already its own): connect, HELLO naming
// the spare, the control thread; the daemon's requests are served as they come, the
// program runs on at once. False when the child runs on untraced.
bool join_with_spare(const char* name, pid_t daemon_pid, uint32_t spare_id) {
  int fd = link::connect_link(name, kConnectTimeout);
  if (fd < 0) return false;
  {
    std::lock_guard l(g_ctl_mu);
    if (check_peer(fd, daemon_pid, false) != 0) {
      ::close(fd);
      return false;
    }
    adopt_link(fd, name, daemon_pid, false);
  }
  if (send_spare_hello(spare_id) != 0 || start_control_thread() != 0) {
    end_link();
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// fork

void atfork_prepare() {
  g_ctl_mu.lock();
  g_send_mu.lock();
  dl_mailbox_lock_for_fork();
}

void atfork_parent() {
  take_spare_in_parent();
  dl_mailbox_unlock_after_fork();
  g_send_mu.unlock();
  g_ctl_mu.unlock();
}

void atfork_child() {
  dl_mailbox_unlock_after_fork();
  g_send_mu.unlock();
  g_ctl_mu.unlock();
  forget_thread_ring();
  if (!g_linked.load()) return;
  const bool was = probecore::set_engine_thread(true);
  uint32_t spare;
  {
    std::lock_guard l(g_ctl_mu);
    {
      std::lock_guard s(g_send_mu);
      ::close(g_link_fd);  // the parent's: never a byte from the child on it
      g_link_fd = -1;
    }
    g_linked.store(false);
    g_control_running.store(false);  // threads do not survive fork
    g_ctl_stack_busy = false;
    spare = adopt_spare_in_child();
  }
  dl_mailbox_open();
  const bool joined =
      spare != 0 ? join_with_spare(g_link_name, g_daemon_pid, spare)
                 : serve_start(std::string(g_link_name), g_daemon_pid, lk::HelloReason::kFork);
  if (!joined) {
    std::lock_guard l(g_ctl_mu);
    teardown();  // nobody to report to: the child runs untraced
  } else if (!std::getenv(kStartedEnv)) {  // a launched program's children have it
    ::setenv(kStartedEnv, std::to_string(::getpid()).c_str(), 1);
  }
  probecore::set_engine_thread(was);
}

// ---------------------------------------------------------------------------------------
// The constructor

// The path this object was loaded from, as the dynamic loader has it; nullptr if not
// found. (dladdr would say it too, after a search of our symbol table for the nearest
// symbol: a tenth of a millisecond of every traced program's start.)
const char* own_file_name() {
  struct Find {
    uintptr_t addr;
    const char* name;
  } find{reinterpret_cast<uintptr_t>(&own_file_name), nullptr};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* f = static_cast<Find*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
          if (f->addr - start < ph.p_memsz) {
            f->name = info->dlpi_name;
            return 1;
          }
        }
        return 0;
      },
      &find);
  return find.name != nullptr && find.name[0] != 0 ? find.name : nullptr;
}

// Whether this object was loaded through LD_PRELOAD (launch), rather than by dlopen
// (attach) in a process that merely inherited the variables.
bool preloaded() {
  const char* pre = std::getenv("LD_PRELOAD");
  const char* own = pre ? own_file_name() : nullptr;
  if (!own) return false;
  auto base = [](std::string_view p) {
    size_t slash = p.rfind('/');
    return slash == std::string_view::npos ? p : p.substr(slash + 1);
  };
  const std::string_view self = own;
  std::string_view list = pre;
  while (!list.empty()) {
    size_t end = list.find_first_of(": ");
    std::string_view item = list.substr(0, end);
    if (!item.empty() && (item == self || base(item) == base(self))) return true;
    if (end == std::string_view::npos) break;
    list.remove_prefix(end + 1);
  }
  return false;
}

// After DETACH: the process's environment stops carrying the agent, so that a program it
// execs (and its children's) loads no agent: this object leaves LD_PRELOAD (the rest of
// it stays) and the link's variables go. Only unsetenv, and a setenv of a variable that
// exists (its pointer replaced in place): glibc never moves the environment's array for
// either, so a getenv on another thread meanwhile reads valid strings.
void forget_environment() {
  if (const char* pre = std::getenv("LD_PRELOAD")) {
    if (const char* own = own_file_name()) {
      auto base = [](std::string_view p) {
        const size_t slash = p.rfind('/');
        return slash == std::string_view::npos ? p : p.substr(slash + 1);
      };
      const std::string_view self = own;
      std::string kept;
      std::string_view list = pre;
      while (!list.empty()) {
        const size_t end = list.find_first_of(": ");
        const std::string_view item = list.substr(0, end);
        if (!item.empty() && item != self && base(item) != base(self)) {
          if (!kept.empty()) kept.push_back(':');
          kept.append(item);
        }
        if (end == std::string_view::npos) break;
        list.remove_prefix(end + 1);
      }
      if (kept.empty()) ::unsetenv("LD_PRELOAD");
      else ::setenv("LD_PRELOAD", kept.c_str(), 1);
    }
  }
  ::unsetenv(link::kLinkEnv);
  ::unsetenv(kStartedEnv);
}

// One line on the program's stderr when its agent cannot reach the daemon it was started
// for (gone, or not the process the link names): the program runs on untraced, and
// nothing else would tell its user. No stdio: the program's own buffers stay untouched.
void say_untraced(int err) {
  char line[160];
  const int n = std::snprintf(line, sizeof line,
                              "probefs: agent: cannot reach the daemon (%s): pid %d runs "
                              "untraced\n",
                              std::strerror(-err), static_cast<int>(::getpid()));
  if (n > 0) (void)!::write(2, line, std::min(static_cast<size_t>(n), sizeof line - 1));
}

__attribute__((constructor)) void agent_constructor() {
  find_tid_offset();
  const char* name = std::getenv(link::kLinkEnv);
  pid_t daemon_pid = 0;
  if (!name || !link::parse_link_name(name, &daemon_pid) || !preloaded()) return;
  const bool was = probecore::set_engine_thread(true);
  const lk::HelloReason reason =
      std::getenv(kStartedEnv) ? lk::HelloReason::kExec : lk::HelloReason::kLaunch;
  int unreached = 0;
  if (serve_start(name, daemon_pid, reason, &unreached))
    ::setenv(kStartedEnv, std::to_string(::getpid()).c_str(), 1);
  else if (unreached != 0)
    say_untraced(unreached);
  probecore::set_engine_thread(was);
}

}  // namespace

int send_on_link(const lk::Message& m) {
  std::lock_guard s(g_send_mu);
  if (g_link_fd < 0) return -ENOTCONN;
  return link::send_message(g_link_fd, m, kSendTimeout);
}

int send_on_link_now(const lk::Message& m) {
  std::lock_guard s(g_send_mu);
  if (g_link_fd < 0) return -ENOTCONN;
  return link::send_message(g_link_fd, m, 0ms);
}

uint32_t next_agent_seq() { return g_seq.fetch_add(1, std::memory_order_relaxed); }

bool control_thread_running() { return g_control_running.load(); }

}  // namespace probefs::agent

// The injector's entry point (events/link.h, kAttachSymbol): connect, check the peer,
// HELLO, start the control thread, return. Never waits for the daemon's requests.
extern "C" __attribute__((visibility("default"))) int probefs_agent_attach(const char* link_name) {
  using namespace probefs::agent;
  pid_t daemon_pid = 0;
  if (!link_name || !probefs::link::parse_link_name(link_name, &daemon_pid))
    return -EINVAL;
  const bool was = probefs::probecore::set_engine_thread(true);
  int rc = 0;
  {
    std::unique_lock l(g_ctl_mu, std::try_to_lock);
    if (!l.owns_lock() || g_linked.load() || g_control_running.load()) {
      rc = -EBUSY;  // linked already, or still letting go of the previous daemon
    } else if ((rc = ensure_engine()) == 0) {
      const int fd = probefs::link::connect_link(link_name, kConnectTimeout);
      if (fd < 0) {
        rc = fd;
      } else if ((rc = check_peer(fd, daemon_pid, true)) != 0) {
        ::close(fd);
      } else {
        adopt_link(fd, link_name, daemon_pid, true);
      }
    }
  }
  // The r_brk hook goes in before HELLO: whatever the daemon reads of the process's
  // mappings after it, a library loaded later reaches it as MAPPED.
  if (rc == 0) {
    std::lock_guard l(g_ctl_mu);
    (void)install_dl_hook();
  }
  if (rc == 0) rc = send_hello(probefs::events::link::HelloReason::kAttach, {});
  if (rc == 0) rc = start_control_thread();
  if (rc != 0 && g_linked.load() && !g_control_running.load()) end_link();
  probefs::probecore::set_engine_thread(was);
  return rc;
}
