#include "tracee/agent_link.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "link/socket.h"
#include "tracee/proc_info.h"

namespace probefs::tracee {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------
// AgentLink

struct AgentLink::Impl {
  // How often a request waiting for its reply looks whether the process is stopped.
  static constexpr std::chrono::milliseconds kStoppedPoll{10};

  int fd = -1;
  link::PeerCred cred;
  lk::Hello hello;

  // The I/O thread completes replies; requesters wait on cv.
  mutable std::mutex mu;
  std::condition_variable cv;
  uint32_t next_seq = 1;                     // mu
  struct Pending {
    bool done = false;
    LinkResult result;
  };
  std::map<uint32_t, Pending> waiting;       // mu
  std::set<uint32_t> deferred;               // mu: requests a stopped process has to do
  bool closed = false;                       // mu
  std::chrono::milliseconds timeout = kDefaultTimeout;  // mu
  lk::ReplyAssembler assembler;              // the I/O thread only

  std::mutex send_mu;  // one sender at a time: a split reply's packets stay together

  // The bounds on what the peer may make the daemon hold (agent_link.h, Bounds).
  std::atomic<int> mapped_in_flight{0};  // MAPPED requests queued or being answered
  int protocol_errors = 0;               // the I/O thread only
  std::atomic<bool> violated{false};     // disconnected for a bound (warned once)
  // The listener's count of such disconnections; shared, since a link may outlive it.
  std::shared_ptr<std::atomic<uint64_t>> disconnections;

  // Ends the link of a peer that went past a bound, with one line on stderr.
  void disconnect(const char* what) {
    if (violated.exchange(true)) return;
    std::fprintf(stderr, "probefs: the agent link of pid %d (uid %u) %s; disconnected\n",
                 static_cast<int>(cred.pid), static_cast<unsigned>(cred.uid), what);
    if (disconnections) disconnections->fetch_add(1);
    mark_closed();
  }

  uint32_t take_seq() {
    std::lock_guard l(mu);
    return next_seq++;
  }

  // The I/O thread, or close(): the link ended.
  void mark_closed() {
    {
      std::lock_guard l(mu);
      if (closed) return;
      closed = true;
    }
    ::shutdown(fd, SHUT_RDWR);
    cv.notify_all();
  }

  // The I/O thread: a complete reply arrived.
  void complete(uint32_t seq, lk::Reply r) {
    std::lock_guard l(mu);
    deferred.erase(seq);  // a stopped process ran again and did it
    auto it = waiting.find(seq);
    if (it == waiting.end()) return;  // timed out already, or never asked
    it->second.done = true;
    it->second.result.error = r.error;
    it->second.result.message = std::move(r.message);
    it->second.result.profile = std::move(r.profile);
    cv.notify_all();
  }

  int send(const lk::Message& m, int pass_fd = -1) {
    std::chrono::milliseconds t;
    {
      std::lock_guard l(mu);
      if (closed) return -ENOTCONN;
      t = timeout;
    }
    int rc;
    {
      std::lock_guard l(send_mu);
      rc = link::send_message(fd, m, t, pass_fd);
    }
    // A socket that stays full for a whole request timeout: the peer does not read, and
    // every later request would wait as long. A stopped process reads nothing either; it
    // keeps its link, to be served when it runs again.
    if (rc == -ETIMEDOUT && !process_stopped(cred.pid))
      disconnect("does not read what the daemon sends");
    return rc;
  }

  // Registers seqs as waiting before their requests leave, so no reply can be missed.
  void expect_replies(const std::vector<uint32_t>& seqs) {
    std::lock_guard l(mu);
    for (uint32_t s : seqs) waiting[s] = Pending{};
  }

  // Waits for the reply to `seq` until `deadline`, looking every kStoppedPoll whether the
  // process is stopped: then the request stays in the link for when it runs again, and
  // the caller goes on (deferred). A stopped target never holds up the daemon for longer.
  LinkResult wait_reply(uint32_t seq, Clock::time_point deadline) {
    std::unique_lock l(mu);
    auto it = waiting.find(seq);
    if (it == waiting.end()) return {-EINVAL, "no such request", {}, false};
    LinkResult r;
    bool stopped = false;
    for (;;) {
      const auto slice = std::min(deadline, Clock::now() + kStoppedPoll);
      if (cv.wait_until(l, slice, [&] { return it->second.done || closed; })) break;
      if (Clock::now() >= deadline) break;
      l.unlock();
      stopped = process_stopped(cred.pid);
      l.lock();
      if (stopped && !it->second.done) break;
      stopped = false;
    }
    if (it->second.done) {
      r = std::move(it->second.result);
    } else if (closed) {
      r.error = -ENOTCONN, r.message = "link closed";
    } else if (stopped) {
      r.deferred = true;
      deferred.insert(seq);
    } else {
      r.error = -ETIMEDOUT, r.message = "no reply in time";
    }
    waiting.erase(it);
    return r;
  }

  void forget(uint32_t seq) {
    std::lock_guard l(mu);
    waiting.erase(seq);
  }

  Clock::time_point deadline() {
    std::lock_guard l(mu);
    return Clock::now() + timeout;
  }

  // kprobes/list of the process may have changed (AgentLink::list_generation).
  std::atomic<uint64_t> list_generation{0};

  // Whether the agent's `kprobes/list` may read otherwise once it has done a request of
  // this type.
  static bool changes_list(lk::MsgType type) {
    switch (type) {
      case lk::MsgType::kDefine:
      case lk::MsgType::kRemove:
      case lk::MsgType::kEnable:
      case lk::MsgType::kDisable:
      case lk::MsgType::kArmAll:
      case lk::MsgType::kDisarmAll:
      case lk::MsgType::kOptimization:
      case lk::MsgType::kDetach:
        return true;
      default:
        return false;
    }
  }

  // Sends a request and returns at once: its reply is collected with wait_reply().
  Ticket start(lk::MsgType type, lk::Body body, int pass_fd = -1) {
    lk::Message m;
    m.type = type;
    m.seq = take_seq();
    m.body = std::move(body);
    expect_replies({m.seq});
    Ticket t;
    t.deadline = deadline();
    // Before the request leaves: a LIST answered after it must not be taken for current
    // by a reader that looked at the generation before.
    if (changes_list(type)) list_generation.fetch_add(1);
    if (int rc = send(m, pass_fd); rc) {
      forget(m.seq);
      t.failed = {rc, rc == -EINVAL ? "message does not encode" : "send failed", {}, false};
      return t;
    }
    t.seq = m.seq;
    return t;
  }

  LinkResult collect(const Ticket& t, Clock::time_point deadline) {
    if (t.seq == 0) return t.failed;
    return wait_reply(t.seq, std::min(deadline, t.deadline));
  }

  LinkResult request(lk::MsgType type, lk::Body body, int pass_fd = -1) {
    const Ticket t = start(type, std::move(body), pass_fd);
    return collect(t, t.deadline);
  }
};

AgentLink::AgentLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AgentLink::~AgentLink() {
  impl_->mark_closed();
  ::close(impl_->fd);
}

pid_t AgentLink::pid() const { return impl_->cred.pid; }
uid_t AgentLink::uid() const { return impl_->cred.uid; }
const lk::Hello& AgentLink::hello() const { return impl_->hello; }

size_t AgentLink::deferred_requests() const {
  std::lock_guard l(impl_->mu);
  return impl_->closed ? 0 : impl_->deferred.size();
}

bool AgentLink::closed() const {
  std::lock_guard l(impl_->mu);
  return impl_->closed;
}

void AgentLink::set_timeout(std::chrono::milliseconds t) {
  std::lock_guard l(impl_->mu);
  impl_->timeout = t;
}

LinkResult AgentLink::setup(int memfd, uint64_t area_size, uint32_t trace_clock,
                            uint32_t options) {
  if (memfd < 0) return {-EBADF, "no ring area", {}};
  return impl_->request(lk::MsgType::kSetup, lk::Setup{area_size, trace_clock, options},
                        memfd);
}

LinkResult AgentLink::define(const lk::Define& d) {
  return impl_->request(lk::MsgType::kDefine, d);
}

LinkResult AgentLink::remove(uint32_t id) {
  return impl_->request(lk::MsgType::kRemove, lk::ProbeRef{id});
}

LinkResult AgentLink::enable(uint32_t id) {
  return impl_->request(lk::MsgType::kEnable, lk::ProbeRef{id});
}

LinkResult AgentLink::disable(uint32_t id) {
  return impl_->request(lk::MsgType::kDisable, lk::ProbeRef{id});
}

LinkResult AgentLink::set_filter(uint32_t id, const events::CompiledFilter* f) {
  lk::SetFilter s;
  s.probe_id = id;
  if (f) s.filter = *f;
  return impl_->request(lk::MsgType::kSetFilter, std::move(s));
}

LinkResult AgentLink::arm_all() { return impl_->request(lk::MsgType::kArmAll, {}); }
LinkResult AgentLink::disarm_all() { return impl_->request(lk::MsgType::kDisarmAll, {}); }

LinkResult AgentLink::set_optimization(bool on) {
  return impl_->request(lk::MsgType::kOptimization, lk::Optimization{on});
}

AgentLink::Ticket AgentLink::start(lk::MsgType type, lk::Body body) {
  switch (type) {
    case lk::MsgType::kDefine:
    case lk::MsgType::kRemove:
    case lk::MsgType::kEnable:
    case lk::MsgType::kDisable:
    case lk::MsgType::kSetFilter:
    case lk::MsgType::kSetHist:
    case lk::MsgType::kArmAll:
    case lk::MsgType::kDisarmAll:
    case lk::MsgType::kOptimization:
    case lk::MsgType::kList:
    case lk::MsgType::kProfile:
    case lk::MsgType::kBlacklist:
      return impl_->start(type, std::move(body));
    default: {
      Ticket t;
      t.failed = {-EINVAL, "not a request that can be started alone", {}, false};
      return t;
    }
  }
}

AgentLink::Ticket AgentLink::start_setup(int memfd, uint64_t area_size, uint32_t trace_clock,
                                         uint32_t options) {
  if (memfd < 0) {
    Ticket t;
    t.failed = {-EBADF, "no ring area", {}, false};
    return t;
  }
  return impl_->start(lk::MsgType::kSetup, lk::Setup{area_size, trace_clock, options}, memfd);
}

AgentLink::Ticket AgentLink::start_hist_table(const lk::HistTable& h, int memfd) {
  return impl_->start(lk::MsgType::kHistTable, h, h.release ? -1 : memfd);
}

AgentLink::Ticket AgentLink::start_table(lk::MsgType type, lk::Body body, int table_fd) {
  if (table_fd < 0) {
    Ticket t;
    t.failed = {-EBADF, "no table", {}, false};
    return t;
  }
  return impl_->start(type, std::move(body), table_fd);
}

int AgentLink::post_spare(const lk::Spare& s, int memfd) {
  if (memfd < 0) return -EBADF;
  lk::Message m;
  m.type = lk::MsgType::kSpare;
  m.seq = impl_->take_seq();  // not waited for: its REPLY finds nobody and is dropped
  m.body = s;
  return impl_->send(m, memfd);
}

LinkResult AgentLink::collect(const Ticket& t, std::chrono::steady_clock::time_point deadline) {
  return impl_->collect(t, deadline);
}

uint64_t AgentLink::list_generation() const { return impl_->list_generation.load(); }

LinkResult AgentLink::list() { return impl_->request(lk::MsgType::kList, {}); }
LinkResult AgentLink::profile() { return impl_->request(lk::MsgType::kProfile, {}); }
LinkResult AgentLink::blacklist() { return impl_->request(lk::MsgType::kBlacklist, {}); }
LinkResult AgentLink::go() { return impl_->request(lk::MsgType::kGo, {}); }

LinkResult AgentLink::detach() {
  LinkResult r = impl_->request(lk::MsgType::kDetach, {});
  impl_->mark_closed();
  return r;
}

std::vector<LinkResult> AgentLink::answer_mapped(uint32_t mapped_seq,
                                                 const std::vector<lk::Define>& defines) {
  // The request leaves the count the listener bounds (kMaxMappedInFlight).
  int in_flight = impl_->mapped_in_flight.load();
  while (in_flight > 0 && !impl_->mapped_in_flight.compare_exchange_weak(in_flight, in_flight - 1)) {
  }
  std::vector<uint32_t> seqs;
  for (size_t i = 0; i < defines.size(); ++i) seqs.push_back(impl_->take_seq());
  impl_->expect_replies(seqs);
  if (!defines.empty()) impl_->list_generation.fetch_add(1);  // new probes for the list
  const auto dl = impl_->deadline();
  std::vector<LinkResult> out(defines.size());
  std::vector<bool> sent(defines.size(), false);
  for (size_t i = 0; i < defines.size(); ++i) {
    lk::Message m;
    m.type = lk::MsgType::kDefine;
    m.flags = lk::kFlagAnswer;
    m.seq = seqs[i];
    m.body = defines[i];
    if (int rc = impl_->send(m); rc) {
      out[i] = {rc, rc == -EINVAL ? "message does not encode" : "send failed", {}};
      impl_->forget(seqs[i]);
    } else {
      sent[i] = true;
    }
  }
  lk::Message done;
  done.type = lk::MsgType::kReply;
  done.seq = mapped_seq;
  done.body = lk::Reply{};
  const int rc = impl_->send(done);
  for (size_t i = 0; i < defines.size(); ++i) {
    if (!sent[i]) continue;
    if (rc) {
      impl_->forget(seqs[i]);
      out[i] = {rc, "send failed", {}};
    } else {
      out[i] = impl_->wait_reply(seqs[i], dl);
    }
  }
  return out;
}

void AgentLink::close() { impl_->mark_closed(); }

// ---------------------------------------------------------------------------------------
// AgentListener

namespace {

// What /proc/PID/stat says of a process: its parent and its start time (ProcStat, which
// tells a process from a later one that got its pid).
bool proc_stat(pid_t pid, ProcStat* out) { return read_proc_stat(pid, 0, out) == 0; }

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// The effective uid of a process (/proc/PID/status "Uid:", its second number): the uid
// its connections carry. False when it is gone.
bool process_euid(pid_t pid, uid_t* out) {
  ProcStatus status;
  uint64_t eff = 0;
  if (status.read(pid) != 0 || !status.number("Uid", &eff, 1)) return false;
  *out = static_cast<uid_t>(eff);
  return true;
}

// Removes directory `name` in `parent_fd` and what it holds, two levels deep, without
// following a link: the endpoint tree (a uid's directory may hold what that uid put
// there; what cannot be removed stays).
void remove_tree(int parent_fd, const std::string& name, int depth = 2) {
  const int fd = ::openat(parent_fd, name.c_str(),
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    if (DIR* d = ::fdopendir(fd)) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      for (const std::string& n : names) {
        struct stat st;
        if (::fstatat(fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
          if (depth > 1) remove_tree(fd, n, depth - 1);
          else (void)::unlinkat(fd, n.c_str(), AT_REMOVEDIR);
        } else {
          (void)::unlinkat(fd, n.c_str(), 0);
        }
      }
      ::closedir(d);  // closes fd
    } else {
      ::close(fd);
    }
  }
  (void)::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR);
}

// "probefs.<pid>.XXXXXX": the pid of the daemon that made an endpoint tree.
bool tree_owner(const std::string& name, pid_t* pid) {
  if (!name.starts_with("probefs.")) return false;
  const size_t dot = name.find('.', 8);
  if (dot == std::string::npos || dot == 8 || name.size() != dot + 7) return false;
  uint64_t v = 0;
  for (size_t i = 8; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || v > 0x3fffffff) return false;
    v = v * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  *pid = static_cast<pid_t>(v);
  return v > 0;
}

// Whether a socket in tree `name` of `parent` still has a listener: a daemon whose pid
// this pid namespace does not show. A dead one's socket refuses the connection.
bool tree_in_use(const std::string& parent, const std::string& name) {
  const std::string tree = parent + "/" + name;
  std::vector<std::string> sockets;
  if (DIR* d = ::opendir(tree.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string sub = tree + "/" + e->d_name;
      DIR* sd = ::opendir(sub.c_str());
      if (!sd) continue;
      pid_t pid;
      struct stat st;
      while (dirent* f = ::readdir(sd)) {
        const std::string path = sub + "/" + f->d_name;
        // A socket, not a link that its uid put there to have us connect elsewhere.
        if (link::parse_link_name(f->d_name, &pid) && ::lstat(path.c_str(), &st) == 0 &&
            S_ISSOCK(st.st_mode))
          sockets.push_back(path);
      }
      ::closedir(sd);
    }
    ::closedir(d);
  }
  for (const std::string& path : sockets) {
    const int c = link::connect_link(path, std::chrono::milliseconds(0));
    if (c >= 0) ::close(c);
    if (c >= 0 || c == -ETIMEDOUT) return true;  // accepted, or a full backlog
  }
  return false;
}

// Removes the trees of daemons that are gone (killed before they could), of our uid.
void sweep_stale_trees(const std::string& parent) {
  const int pfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0) return;
  DIR* d = ::fdopendir(::dup(pfd));
  std::vector<std::string> stale;
  while (d && stale.size() < 256) {
    dirent* e = ::readdir(d);
    if (!e) break;
    pid_t owner = 0;
    struct stat st;
    if (!tree_owner(e->d_name, &owner)) continue;
    if (::fstatat(pfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid())
      continue;
    if (::kill(owner, 0) != 0 && errno == ESRCH && !tree_in_use(parent, e->d_name))
      stale.push_back(e->d_name);
  }
  if (d) ::closedir(d);
  for (const std::string& n : stale) remove_tree(pfd, n);
  ::close(pfd);
}

// Where the endpoint tree goes: a directory of the system's for root, the user's own
// runtime directory otherwise, /tmp when neither serves. The tree's paths must fit
// sockaddr_un: parent + "/probefs.<pid>.XXXXXX/<uid>/probefs.<pid>.<32 hex>".
std::string run_parent() {
  auto usable = [](const char* dir, bool own) {
    struct stat st;
    // A name without blanks: `probefs exec` reads it back from a line of words.
    if (!dir || dir[0] != '/' || std::strlen(dir) > 40 || std::strpbrk(dir, " \t\n"))
      return false;
    if (::stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    return !own || (st.st_uid == ::geteuid() && (st.st_mode & 077) == 0);
  };
  if (::geteuid() == 0) return usable("/run", false) ? "/run" : "/tmp";
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  return usable(xdg, true) ? xdg : "/tmp";
}

// The epoll tags: what kind of descriptor woke the I/O thread, and which.
constexpr uint64_t kTagStop = 1ull << 32;
constexpr uint64_t kTagListen = 2ull << 32;
constexpr uint64_t kTagConn = 3ull << 32;

}  // namespace

struct AgentListener::Impl {
  int epfd = -1;
  int stop_fd = -1;   // eventfd: wakes the I/O thread to stop
  int queue_fd = -1;  // eventfd: readable while events are queued
  std::string parent;    // where the tree is
  std::string tree;      // its directory's name in parent ("" before it exists)
  int tree_fd = -1;      // the tree's directory
  std::string own_name;  // the endpoint of the daemon's own uid
  std::thread io;

  mutable std::mutex mu;
  std::condition_variable cv;

  // One listening socket per uid served.
  struct Endpoint {
    uid_t uid = 0;
    std::string name;        // its path
    bool accepting = true;   // registered for EPOLLIN
  };
  std::map<int, Endpoint> endpoints;                       // mu, by listening fd

  std::map<pid_t, uid_t> expected;                         // mu: pid -> its uid
  struct ExecExpectation {
    uid_t uid;
    Clock::time_point deadline;
  };
  std::map<pid_t, ExecExpectation> exec_expected;          // mu
  // Announced processes whose expectation lapsed with no connection, for lapsed_execs().
  std::vector<pid_t> lapsed;                                // mu
  static constexpr size_t kLapsedKept = 1024;
  // Moves the expectations past their deadline to `lapsed`. mu held.
  void lapse_execs(Clock::time_point now) {
    for (auto it = exec_expected.begin(); it != exec_expected.end();) {
      if (it->second.deadline >= now) {
        ++it;
        continue;
      }
      if (lapsed.size() < kLapsedKept) lapsed.push_back(it->first);
      it = exec_expected.erase(it);
    }
  }
  std::map<pid_t, std::shared_ptr<AgentLink>> arrived;     // mu: for wait_for()
  std::deque<LinkEvent> events;                            // mu
  // Processes that had a link: their uid and start time (a recycled pid is not ours).
  struct Known {
    uid_t uid;
    uint64_t start;
  };
  std::map<pid_t, Known> known;                            // mu
  std::map<uint32_t, pid_t> spare_owner;                   // mu: offer_spare
  // Processes detached (forget()): a new image of one is refused even where its parent
  // has a link. Pruned with `known`.
  std::map<pid_t, Known> detached;                         // mu
  std::map<int, std::shared_ptr<AgentLink>> links;         // mu (written by the I/O thread)

  // Admitted connections that have not said HELLO yet.
  struct PendingConn {
    Clock::time_point deadline;
    link::PeerCred cred;
    ProcStat stat;  // the process's, read at admission
    bool gone = false;  // no such process at admission: only a spare's child passes
  };
  std::map<int, PendingConn> pending;            // the I/O thread only
  std::vector<uint8_t> rbuf;                     // the I/O thread only: each packet read
  std::map<uid_t, size_t> pending_per_uid;       // the I/O thread only
  bool paused = false;                           // the I/O thread only: accept paused
  Clock::time_point paused_until;                // the I/O thread only

  std::atomic<size_t> pending_count{0};
  std::atomic<uint64_t> refused{0}, accept_failures{0}, accept_pauses{0};
  std::shared_ptr<std::atomic<uint64_t>> disconnections =
      std::make_shared<std::atomic<uint64_t>>(0);
  std::atomic<bool> warned_fds{false}, warned_pending{false};

  static void warn(std::atomic<bool>& once, const std::string& what) {
    if (!once.exchange(true)) std::fprintf(stderr, "probefs: %s\n", what.c_str());
  }

  // The eventfd is written and drained under mu, so it is readable exactly while the
  // queue holds something.
  void push_event(LinkEvent ev) {
    {
      std::lock_guard l(mu);
      if (events.empty()) {
        uint64_t one = 1;
        (void)!::write(queue_fd, &one, sizeof one);
      }
      events.push_back(std::move(ev));
    }
    cv.notify_all();
  }

  // ---- endpoints ----

  // The endpoint of `uid`, made on first use. mu held.
  int endpoint_locked(uid_t uid, std::string* name) {
    for (const auto& [fd, ep] : endpoints) {
      if (ep.uid == uid) {
        *name = ep.name;
        return 0;
      }
    }
    const uid_t self = ::geteuid();
    if (self != 0 && uid != self) return -EPERM;
    const std::string sub = std::to_string(uid);
    const std::string path = parent + "/" + tree + "/" + sub + "/" + link::make_link_name(::getpid());
    if (path.size() >= sizeof(sockaddr_un::sun_path)) return -ENAMETOOLONG;
    if (::mkdirat(tree_fd, sub.c_str(), 0700) != 0) return -errno;
    auto fail = [&](int fd) {
      const int e = errno;
      if (fd >= 0) ::close(fd);
      remove_tree(tree_fd, sub);
      return -e;
    };
    const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fail(-1);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    // Bound, opened to all and listening while the directory is still the daemon's alone;
    // only then may the uid enter it.
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) return fail(fd);
    if (::chmod(path.c_str(), 0666) != 0) return fail(fd);
    if (::listen(fd, 128) != 0) return fail(fd);
    if (uid != self && ::fchownat(tree_fd, sub.c_str(), uid, static_cast<gid_t>(-1),
                                  AT_SYMLINK_NOFOLLOW) != 0)
      return fail(fd);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kTagListen | static_cast<uint32_t>(fd);
    if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) return fail(fd);
    endpoints[fd] = {uid, path, true};
    *name = path;
    return 0;
  }

  // Whether the endpoint should be accepted from now, and epoll told so. mu held; the
  // I/O thread only.
  void update_interest(int lfd, Endpoint& ep) {
    auto it = pending_per_uid.find(ep.uid);
    const bool want = !paused && (it == pending_per_uid.end() || it->second < kMaxPendingPerUid);
    if (want == ep.accepting) return;
    epoll_event ev{};
    ev.events = want ? static_cast<uint32_t>(EPOLLIN) : 0u;
    ev.data.u64 = kTagListen | static_cast<uint32_t>(lfd);
    if (::epoll_ctl(epfd, EPOLL_CTL_MOD, lfd, &ev) == 0) ep.accepting = want;
  }

  void update_all_interest() {
    std::lock_guard l(mu);
    for (auto& [lfd, ep] : endpoints) update_interest(lfd, ep);
  }

  // accept() found no descriptor or memory: the connection stays in the backlog and epoll
  // would report it again at once, so every endpoint rests for kAcceptPause.
  void pause_accepting(int err) {
    accept_failures.fetch_add(1);
    accept_pauses.fetch_add(1);
    paused = true;
    paused_until = Clock::now() + kAcceptPause;
    update_all_interest();
    warn(warned_fds, std::string("cannot accept agent links: ") + std::strerror(err) +
                         "; trying again every " + std::to_string(kAcceptPause.count()) + " ms");
  }

  // ---- admission ----

  // The process `pid` as known, if it is the very process that had a link (not a later
  // one with its pid). mu held.
  const Known* known_process(pid_t pid, const ProcStat* stat = nullptr) {
    auto it = known.find(pid);
    if (it == known.end()) return nullptr;
    ProcStat own;
    if (!stat && proc_stat(pid, &own)) stat = &own;
    if (stat && stat->start == it->second.start) return &it->second;
    known.erase(it);
    return nullptr;
  }

  // Whether a connection with these credentials may say HELLO at all (agent_link.h,
  // Admission). mu held.
  bool admit_locked(const link::PeerCred& c, const ProcStat& self) {
    if (auto e = expected.find(c.pid); e != expected.end()) return e->second == c.uid;
    if (auto x = exec_expected.find(c.pid); x != exec_expected.end() &&
                                           x->second.deadline >= Clock::now())
      return x->second.uid == c.uid;
    if (const Known* k = known_process(c.pid, &self)) return k->uid == c.uid;
    const Known* parent = known_process(self.ppid);
    if (parent) return parent->uid == c.uid;
    const int waiting = pending_of(self.ppid);
    return waiting >= 0 && pending.at(waiting).cred.uid == c.uid;
  }

  // The connection of process `pid` that waits for its HELLO, or -1. The I/O thread only.
  int pending_of(pid_t pid) const {
    if (pid <= 0) return -1;
    for (const auto& [fd, pc] : pending)
      if (pc.cred.pid == pid && !pc.gone) return fd;
    return -1;
  }

  // Counted before the peer can see the end: whoever it tells finds it counted.
  void refuse(int fd) {
    refused.fetch_add(1);
    ::close(fd);
  }

  void accept_on(int lfd) {
    uid_t uid;
    {
      std::lock_guard l(mu);
      auto it = endpoints.find(lfd);
      if (it == endpoints.end() || !it->second.accepting) return;
      uid = it->second.uid;
    }
    // At most kAcceptBatch connections per wake-up: a peer that connects again as soon as
    // it is refused would otherwise keep this loop on its endpoint, and the other
    // endpoints and links would wait (epoll reports this one again while it has more).
    for (int taken = 0, other_errors = 0; taken < kAcceptBatch && other_errors < 64;) {
      if (pending_per_uid[uid] >= kMaxPendingPerUid) {
        // The rest wait in the kernel's backlog until a HELLO or a timeout frees a place.
        warn(warned_pending, "more than " + std::to_string(kMaxPendingPerUid) +
                                 " agents of uid " + std::to_string(uid) +
                                 " connected without a HELLO; accepting their links more slowly");
        std::lock_guard l(mu);
        if (auto it = endpoints.find(lfd); it != endpoints.end()) update_interest(lfd, it->second);
        return;
      }
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          pause_accepting(errno);
          return;
        }
        ++other_errors;  // a connection that went away before we took it (ECONNABORTED)
        continue;
      }
      ++taken;
      link::PeerCred cred;
      ProcStat stat;
      bool ok = link::peer_cred(fd, &cred) == 0 && cred.uid == uid;
      // A process gone already is judged by its HELLO alone (a spare's fork child), and so
      // is one whose /proc entry is gone while kill() still finds its pid: seen under load,
      // a spare's fork child at its exit, refused for want of a parent until this. So is
      // one its parent is reaping: its stat still reads, but with parent 0 (the kernel
      // fills that field in only while the process has its signal handlers, which it has
      // let go of); a live process whose parent is outside our pid namespace reads 0 too,
      // and is still running.
      const bool gone = ok && (!proc_stat(cred.pid, &stat) ||
                               (stat.ppid == 0 && !process_running(cred.pid)));
      if (ok && !gone) {
        std::lock_guard l(mu);
        ok = admit_locked(cred, stat);
      }
      if (!ok) {
        refuse(fd);  // not a byte read, not a moment waited
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = kTagConn | static_cast<uint32_t>(fd);
      if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        refuse(fd);
        continue;
      }
      pending[fd] = {Clock::now() + kHelloTimeout, cred, stat, gone};
      ++pending_per_uid[uid];
      pending_count.store(pending.size());
      on_pending_readable(fd);  // the HELLO often came with the connection
    }
  }

  // The connection leaves the pending set (a link now, or closed with `close_it`).
  void leave_pending(int fd, bool close_it) {
    auto it = pending.find(fd);
    if (it == pending.end()) return;
    const uid_t uid = it->second.cred.uid;
    pending.erase(it);
    pending_count.store(pending.size());
    if (auto c = pending_per_uid.find(uid); c != pending_per_uid.end() && --c->second == 0)
      pending_per_uid.erase(c);
    if (close_it) {
      ::epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
      refuse(fd);
    }
    std::lock_guard l(mu);
    for (auto& [lfd, ep] : endpoints)
      if (ep.uid == uid) update_interest(lfd, ep);
  }

  // Decides whether a HELLO may become a link: see the header.
  enum class Verdict { kRefuse, kExpected, kEvent, kPrepared };
  Verdict judge(const link::PeerCred& cred, const ProcStat& self, bool gone,
                const lk::Hello& h) {
    if (h.pid != cred.pid) return Verdict::kRefuse;
    if (h.abi_version != lk::kAgentAbiVersion) return Verdict::kRefuse;
    std::lock_guard l(mu);
    if (gone) {
      // Only a fork child that recorded into the spare its parent was handed: the
      // parent's uid, and the parent a process with a link.
      auto s = spare_owner.find(h.spare_id);
      if (h.reason != lk::HelloReason::kFork || h.spare_id == 0 || s == spare_owner.end() ||
          s->second != h.ppid)
        return Verdict::kRefuse;
      const Known* parent = known_process(h.ppid);
      return parent && parent->uid == cred.uid ? Verdict::kEvent : Verdict::kRefuse;
    }
    if (auto e = expected.find(cred.pid); e != expected.end())
      return e->second == cred.uid ? Verdict::kExpected : Verdict::kRefuse;
    const auto now = Clock::now();
    lapse_execs(now);
    if (auto ex = exec_expected.find(cred.pid); ex != exec_expected.end()) {
      const bool ok = ex->second.uid == cred.uid && (h.reason == lk::HelloReason::kLaunch ||
                                                     h.reason == lk::HelloReason::kExec);
      exec_expected.erase(ex);
      return ok ? Verdict::kPrepared : Verdict::kRefuse;
    }
    // Forget processes that are gone (cheaply: a recycled pid is caught by its start
    // time where it is looked up).
    std::erase_if(known, [](const auto& k) { return !process_exists(k.first); });
    std::erase_if(detached, [](const auto& k) { return !process_exists(k.first); });
    if (auto d = detached.find(cred.pid); d != detached.end()) {
      if (d->second.start == self.start) return Verdict::kRefuse;  // detached: stays so
      detached.erase(d);  // a later process with its pid
    }
    auto from_parent = [&] {
      const Known* parent = known_process(h.ppid);
      if (!parent || parent->uid != cred.uid) return Verdict::kRefuse;
      if (self.ppid != h.ppid) return Verdict::kRefuse;
      return Verdict::kEvent;
    };
    if (h.reason == lk::HelloReason::kFork) return from_parent();
    if (h.reason == lk::HelloReason::kExec || h.reason == lk::HelloReason::kLaunch) {
      // The new image of a process with a link, or of a child that a traced process
      // started without fork's handlers (posix_spawn, vfork) and that exec'd.
      if (const Known* me = known_process(cred.pid, &self))
        return me->uid == cred.uid ? Verdict::kEvent : Verdict::kRefuse;
      return from_parent();
    }
    return Verdict::kRefuse;
  }

  void on_pending_readable(int fd) {
    auto pit = pending.find(fd);
    if (pit == pending.end()) return;
    const PendingConn pc = pit->second;
    std::vector<uint8_t>& buf = rbuf;
    long n = link::recv_packet(fd, &buf, 0ms);
    if (n == -ETIMEDOUT) return;  // not there yet
    lk::Message m;
    if (n <= 0 || lk::decode(buf.data(), buf.size(), &m) != 0 ||
        m.type != lk::MsgType::kHello) {
      leave_pending(fd, true);
      return;
    }
    const auto& h = std::get<lk::Hello>(m.body);
    // A fork child's parent may have connected and not yet been heard (it ran on at once
    // and forked): its HELLO first, so that it is known when the child is judged. Each
    // level leaves `pending`, so this ends.
    if (h.reason == lk::HelloReason::kFork)
      if (const int parent_fd = pending_of(h.ppid); parent_fd >= 0 && parent_fd != fd)
        on_pending_readable(parent_fd);
    const Verdict v = judge(pc.cred, pc.stat, pc.gone, h);
    if (v == Verdict::kRefuse) {
      leave_pending(fd, true);
      return;
    }
    leave_pending(fd, false);
    auto impl = std::make_unique<AgentLink::Impl>();
    impl->fd = fd;
    impl->cred = pc.cred;
    impl->hello = h;
    impl->disconnections = disconnections;
    std::shared_ptr<AgentLink> lk(new AgentLink(std::move(impl)));
    {
      std::lock_guard l(mu);
      links[fd] = lk;
      known[pc.cred.pid] = {pc.cred.uid, pc.stat.start};
      if (v == Verdict::kExpected) {
        expected.erase(pc.cred.pid);
        arrived[pc.cred.pid] = lk;
      }
    }
    if (v == Verdict::kExpected) cv.notify_all();
    else push_event({LinkEvent::kConnected, lk, v == Verdict::kPrepared, 0, {}});
    // Packets that came right behind the HELLO.
    on_link_readable(fd, lk);
  }

  // ---- links ----

  void end_link(int fd, const std::shared_ptr<AgentLink>& lk) {
    ::epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    lk->impl_->mark_closed();
    {
      std::lock_guard l(mu);
      if (!links.erase(fd)) return;  // ended already
    }
    push_event({LinkEvent::kClosed, lk, false, 0, {}});
  }

  // A packet the daemon cannot use. True when that was one too many (the link ended).
  static bool protocol_error(AgentLink::Impl& li) {
    if (++li.protocol_errors <= kMaxProtocolErrors) return false;
    li.disconnect(("sent more than " + std::to_string(kMaxProtocolErrors) +
                   " messages the daemon cannot use").c_str());
    return true;
  }

  void on_link_readable(int fd, const std::shared_ptr<AgentLink>& lk) {
    AgentLink::Impl& li = *lk->impl_;
    std::vector<uint8_t>& buf = rbuf;  // one buffer for all: no allocation per wake-up
    for (int budget = 0; budget < 64; ++budget) {
      // Closed by the daemon (close(), detach, a bound): what the peer still queued is
      // not read.
      if (li.violated.load() || lk->closed()) {
        end_link(fd, lk);
        return;
      }
      long n = link::recv_packet(fd, &buf, 0ms);
      if (n == -ETIMEDOUT || n == -EAGAIN) return;
      if (n == -EMSGSIZE) {  // dropped
        if (protocol_error(li)) {
          end_link(fd, lk);
          return;
        }
        continue;
      }
      if (n <= 0) {
        end_link(fd, lk);
        return;
      }
      lk::Message m;
      std::string why;
      if (lk::decode(buf.data(), buf.size(), &m, &why) != 0) {
        // A request we cannot read still gets an answer, so its sender does not wait.
        if (m.type == lk::MsgType::kMapped) reply_error(li, m.seq, -EBADMSG, why);
        if (protocol_error(li)) {
          end_link(fd, lk);
          return;
        }
        continue;
      }
      switch (m.type) {
        case lk::MsgType::kReply: {
          int r = li.assembler.add(m);
          if (r == -EBADMSG) {  // another reply began before the last one ended
            li.assembler = lk::ReplyAssembler{};
            if (protocol_error(li)) {
              end_link(fd, lk);
              return;
            }
            r = li.assembler.add(m);
          }
          if (r == -E2BIG) {
            li.disconnect(("sent a reply longer than " +
                           std::to_string(lk::kMaxReplySize >> 20) + " MiB").c_str());
            end_link(fd, lk);
            return;
          }
          if (r == 1) {
            const uint32_t seq = li.assembler.seq();
            li.complete(seq, li.assembler.take());
          }
          break;
        }
        case lk::MsgType::kMapped: {
          if (li.mapped_in_flight.fetch_add(1) >= kMaxMappedInFlight) {
            li.disconnect(("sent more than " + std::to_string(kMaxMappedInFlight) +
                           " MAPPED requests without waiting for their answers").c_str());
            end_link(fd, lk);
            return;
          }
          // Objects unloaded: their probes are [GONE] in the list from now on.
          li.list_generation.fetch_add(1);
          LinkEvent ev{LinkEvent::kMapped, lk, false, m.seq, std::get<lk::Mapped>(m.body)};
          push_event(std::move(ev));
          break;
        }
        case lk::MsgType::kListChanged:
          // A notice (no reply): the agent's optimizer changed a probe on its own. What a
          // flood of them costs is a count going up.
          li.list_generation.fetch_add(1);
          break;

        default:
          reply_error(li, m.seq, -EOPNOTSUPP, "not a request the daemon serves");
          if (protocol_error(li)) {
            end_link(fd, lk);
            return;
          }
          break;
      }
    }
  }

  static void reply_error(AgentLink::Impl& li, uint32_t seq, int err, const std::string& why) {
    lk::Message r;
    r.type = lk::MsgType::kReply;
    r.seq = seq;
    r.body = lk::Reply{err, why.substr(0, 256), {}};
    std::lock_guard l(li.send_mu);
    (void)link::send_message(li.fd, r, 0ms);  // never waits: a full socket drops it
  }

  // ---- the I/O thread ----

  void run() {
    epoll_event evs[32];
    for (;;) {
      int timeout_ms = 1000;
      auto now = Clock::now();
      auto until = [&](Clock::time_point t) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t - now);
        timeout_ms = std::min<int>(timeout_ms, std::max<int>(0, static_cast<int>(left.count()) + 1));
      };
      for (const auto& [fd, pc] : pending) until(pc.deadline);
      if (paused) until(paused_until);
      int n = ::epoll_wait(epfd, evs, 32, timeout_ms);
      if (n < 0 && errno != EINTR) return;
      for (int i = 0; i < n; ++i) {
        const uint64_t tag = evs[i].data.u64 & ~0xffffffffull;
        const int fd = static_cast<int>(evs[i].data.u64 & 0xffffffffu);
        if (tag == kTagStop) return;
        if (tag == kTagListen) {
          if (!paused) accept_on(fd);
          continue;
        }
        if (pending.count(fd)) {
          on_pending_readable(fd);
          continue;
        }
        std::shared_ptr<AgentLink> lk;
        {
          std::lock_guard l(mu);
          auto it = links.find(fd);
          if (it != links.end()) lk = it->second;
        }
        if (lk) on_link_readable(fd, lk);
      }
      now = Clock::now();
      std::vector<int> late;
      for (const auto& [fd, pc] : pending)
        if (pc.deadline <= now) late.push_back(fd);
      for (int fd : late) leave_pending(fd, true);
      if (paused && paused_until <= now) {
        paused = false;
        update_all_interest();
      }
    }
  }

  ~Impl() {
    if (io.joinable()) {
      uint64_t one = 1;
      (void)!::write(stop_fd, &one, sizeof one);
      io.join();
    }
    for (auto& [fd, pc] : pending) ::close(fd);
    std::map<int, std::shared_ptr<AgentLink>> ls;
    {
      std::lock_guard l(mu);
      ls.swap(links);
      arrived.clear();
      events.clear();
    }
    for (auto& [fd, lk] : ls) lk->impl_->mark_closed();
    for (auto& [fd, ep] : endpoints) ::close(fd);
    if (tree_fd >= 0) ::close(tree_fd);
    if (!tree.empty()) {
      const int pfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (pfd >= 0) {
        remove_tree(pfd, tree);
        ::close(pfd);
      }
    }
    for (int fd : {epfd, stop_fd, queue_fd})
      if (fd >= 0) ::close(fd);
  }
};

AgentListener::AgentListener(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AgentListener::~AgentListener() = default;

std::unique_ptr<AgentListener> AgentListener::create(int* err) {
  auto impl = std::make_unique<Impl>();
  auto fail = [&](int e) {
    if (err) *err = e;
    return nullptr;
  };
  impl->epfd = ::epoll_create1(EPOLL_CLOEXEC);
  impl->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  impl->queue_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->epfd < 0 || impl->stop_fd < 0 || impl->queue_fd < 0) return fail(-errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagStop;
  if (::epoll_ctl(impl->epfd, EPOLL_CTL_ADD, impl->stop_fd, &ev) != 0) return fail(-errno);

  impl->parent = run_parent();
  sweep_stale_trees(impl->parent);
  std::string tmpl = impl->parent + "/probefs." + std::to_string(::getpid()) + ".XXXXXX";
  if (!::mkdtemp(tmpl.data())) return fail(-errno);
  impl->tree = tmpl.substr(impl->parent.size() + 1);
  // Entered by every uid served, listed by none: 0711.
  impl->tree_fd = ::open(tmpl.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (impl->tree_fd < 0 || ::fchmod(impl->tree_fd, 0711) != 0) return fail(-errno);
  {
    std::lock_guard l(impl->mu);
    if (int e = impl->endpoint_locked(::geteuid(), &impl->own_name); e != 0) return fail(e);
  }
  Impl* raw = impl.get();
  impl->io = std::thread([raw] { raw->run(); });
  return std::unique_ptr<AgentListener>(new AgentListener(std::move(impl)));
}

const std::string& AgentListener::name() const { return impl_->own_name; }

int AgentListener::endpoint(uid_t uid, std::string* name) {
  std::lock_guard l(impl_->mu);
  return impl_->endpoint_locked(uid, name);
}

int AgentListener::expect(pid_t pid, std::string* name) {
  uid_t uid = 0;
  if (!process_euid(pid, &uid)) return -ESRCH;
  std::lock_guard l(impl_->mu);
  impl_->expected[pid] = uid;
  impl_->detached.erase(pid);  // attached again
  if (name) return impl_->endpoint_locked(uid, name);
  return 0;
}

void AgentListener::expect_exec(pid_t pid, uid_t uid, Clock::time_point deadline) {
  std::lock_guard l(impl_->mu);
  impl_->exec_expected[pid] = {uid, deadline};
}

std::vector<pid_t> AgentListener::lapsed_execs() {
  std::lock_guard l(impl_->mu);
  impl_->lapse_execs(Clock::now());
  std::vector<pid_t> out;
  out.swap(impl_->lapsed);
  return out;
}

void AgentListener::forget(pid_t pid) {
  std::lock_guard l(impl_->mu);
  auto it = impl_->known.find(pid);
  if (it == impl_->known.end()) return;
  impl_->detached[pid] = it->second;
  impl_->known.erase(it);
}

void AgentListener::offer_spare(uint32_t id, pid_t owner) {
  std::lock_guard l(impl_->mu);
  impl_->spare_owner[id] = owner;
}

void AgentListener::withdraw_spare(uint32_t id) {
  std::lock_guard l(impl_->mu);
  impl_->spare_owner.erase(id);
}

void AgentListener::unexpect(pid_t pid) {
  std::shared_ptr<AgentLink> late;
  {
    std::lock_guard l(impl_->mu);
    impl_->expected.erase(pid);
    auto it = impl_->arrived.find(pid);
    if (it != impl_->arrived.end()) {
      late = std::move(it->second);
      impl_->arrived.erase(it);
    }
  }
  // A link that came after its waiter gave up is ended, so that the agent sees EOF and
  // goes idle (a later attach would otherwise find it linked to nobody).
  if (late) late->close();
}

std::shared_ptr<AgentLink> AgentListener::wait_for(pid_t pid, std::chrono::milliseconds timeout,
                                                   int* err) {
  std::unique_lock l(impl_->mu);
  const bool got = impl_->cv.wait_for(l, timeout, [&] { return impl_->arrived.count(pid) > 0; });
  if (!got) {
    if (err) *err = -ETIMEDOUT;
    return nullptr;
  }
  auto lk = impl_->arrived[pid];
  impl_->arrived.erase(pid);
  if (err) *err = 0;
  return lk;
}

bool AgentListener::next_event(LinkEvent* out, std::chrono::milliseconds timeout) {
  std::unique_lock l(impl_->mu);
  if (!impl_->cv.wait_for(l, timeout, [&] { return !impl_->events.empty(); })) return false;
  *out = std::move(impl_->events.front());
  impl_->events.pop_front();
  if (impl_->events.empty()) {
    uint64_t v;
    (void)!::read(impl_->queue_fd, &v, sizeof v);
  }
  return true;
}

int AgentListener::event_fd() const { return impl_->queue_fd; }

std::vector<std::shared_ptr<AgentLink>> AgentListener::links() const {
  std::lock_guard l(impl_->mu);
  std::vector<std::shared_ptr<AgentLink>> out;
  for (const auto& [fd, lk] : impl_->links)
    if (!lk->closed()) out.push_back(lk);
  return out;
}

ListenerStats AgentListener::stats() const {
  ListenerStats s;
  {
    std::lock_guard l(impl_->mu);
    s.queued_events = impl_->events.size();
    s.links = impl_->links.size();
    s.endpoints = impl_->endpoints.size();
  }
  s.pending = impl_->pending_count.load();
  s.refused = impl_->refused.load();
  s.disconnected = impl_->disconnections->load();
  s.accept_failures = impl_->accept_failures.load();
  s.accept_pauses = impl_->accept_pauses.load();
  return s;
}

}  // namespace probefs::tracee
