#include "tracee/agent_link.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace probefs::tracee {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------
// AgentLink

struct AgentLink::Impl {
  int fd = -1;
  link::PeerCred cred;
  link::Hello hello;

  // The I/O thread completes replies; requesters wait on cv.
  mutable std::mutex mu;
  std::condition_variable cv;
  uint32_t next_seq = 1;                     // mu
  struct Pending {
    bool done = false;
    LinkResult result;
  };
  std::map<uint32_t, Pending> waiting;       // mu
  bool closed = false;                       // mu
  std::chrono::milliseconds timeout = kDefaultTimeout;  // mu
  link::ReplyAssembler assembler;            // the I/O thread only

  std::mutex send_mu;  // one sender at a time: a split reply's packets stay together

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
  void complete(uint32_t seq, link::Reply r) {
    std::lock_guard l(mu);
    auto it = waiting.find(seq);
    if (it == waiting.end()) return;  // timed out already, or never asked
    it->second.done = true;
    it->second.result.error = r.error;
    it->second.result.message = std::move(r.message);
    it->second.result.profile = std::move(r.profile);
    cv.notify_all();
  }

  int send(const link::Message& m, int pass_fd = -1) {
    std::chrono::milliseconds t;
    {
      std::lock_guard l(mu);
      if (closed) return -ENOTCONN;
      t = timeout;
    }
    std::lock_guard l(send_mu);
    return link::send_message(fd, m, t, pass_fd);
  }

  // Registers seqs as waiting before their requests leave, so no reply can be missed.
  void expect_replies(const std::vector<uint32_t>& seqs) {
    std::lock_guard l(mu);
    for (uint32_t s : seqs) waiting[s] = Pending{};
  }

  LinkResult wait_reply(uint32_t seq, Clock::time_point deadline) {
    std::unique_lock l(mu);
    auto it = waiting.find(seq);
    if (it == waiting.end()) return {-EINVAL, "no such request", {}};
    cv.wait_until(l, deadline, [&] { return it->second.done || closed; });
    LinkResult r;
    if (it->second.done) r = std::move(it->second.result);
    else if (closed) r.error = -ENOTCONN, r.message = "link closed";
    else r.error = -ETIMEDOUT, r.message = "no reply in time";
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

  LinkResult request(link::MsgType type, link::Body body, int pass_fd = -1) {
    link::Message m;
    m.type = type;
    m.seq = take_seq();
    m.body = std::move(body);
    expect_replies({m.seq});
    const auto dl = deadline();
    if (int rc = send(m, pass_fd); rc) {
      forget(m.seq);
      return {rc, rc == -EINVAL ? "message does not encode" : "send failed", {}};
    }
    return wait_reply(m.seq, dl);
  }
};

AgentLink::AgentLink(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AgentLink::~AgentLink() {
  impl_->mark_closed();
  ::close(impl_->fd);
}

pid_t AgentLink::pid() const { return impl_->cred.pid; }
uid_t AgentLink::uid() const { return impl_->cred.uid; }
const link::Hello& AgentLink::hello() const { return impl_->hello; }

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
  return impl_->request(link::MsgType::kSetup, link::Setup{area_size, trace_clock, options},
                        memfd);
}

LinkResult AgentLink::define(const link::Define& d) {
  return impl_->request(link::MsgType::kDefine, d);
}

LinkResult AgentLink::remove(uint32_t id) {
  return impl_->request(link::MsgType::kRemove, link::ProbeRef{id});
}

LinkResult AgentLink::enable(uint32_t id) {
  return impl_->request(link::MsgType::kEnable, link::ProbeRef{id});
}

LinkResult AgentLink::disable(uint32_t id) {
  return impl_->request(link::MsgType::kDisable, link::ProbeRef{id});
}

LinkResult AgentLink::set_filter(uint32_t id, const events::CompiledFilter* f) {
  link::SetFilter s;
  s.probe_id = id;
  if (f) s.filter = *f;
  return impl_->request(link::MsgType::kSetFilter, std::move(s));
}

LinkResult AgentLink::arm_all() { return impl_->request(link::MsgType::kArmAll, {}); }
LinkResult AgentLink::disarm_all() { return impl_->request(link::MsgType::kDisarmAll, {}); }

LinkResult AgentLink::set_optimization(bool on) {
  return impl_->request(link::MsgType::kOptimization, link::Optimization{on});
}

LinkResult AgentLink::list() { return impl_->request(link::MsgType::kList, {}); }
LinkResult AgentLink::profile() { return impl_->request(link::MsgType::kProfile, {}); }
LinkResult AgentLink::blacklist() { return impl_->request(link::MsgType::kBlacklist, {}); }
LinkResult AgentLink::go() { return impl_->request(link::MsgType::kGo, {}); }

LinkResult AgentLink::detach() {
  LinkResult r = impl_->request(link::MsgType::kDetach, {});
  impl_->mark_closed();
  return r;
}

std::vector<LinkResult> AgentLink::answer_mapped(uint32_t mapped_seq,
                                                 const std::vector<link::Define>& defines) {
  std::vector<uint32_t> seqs;
  for (size_t i = 0; i < defines.size(); ++i) seqs.push_back(impl_->take_seq());
  impl_->expect_replies(seqs);
  const auto dl = impl_->deadline();
  std::vector<LinkResult> out(defines.size());
  std::vector<bool> sent(defines.size(), false);
  for (size_t i = 0; i < defines.size(); ++i) {
    link::Message m;
    m.type = link::MsgType::kDefine;
    m.flags = link::kFlagAnswer;
    m.seq = seqs[i];
    m.body = defines[i];
    if (int rc = impl_->send(m); rc) {
      out[i] = {rc, rc == -EINVAL ? "message does not encode" : "send failed", {}};
      impl_->forget(seqs[i]);
    } else {
      sent[i] = true;
    }
  }
  link::Message done;
  done.type = link::MsgType::kReply;
  done.seq = mapped_seq;
  done.body = link::Reply{};
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

// The parent pid in /proc/PID/stat, or -1.
pid_t proc_ppid(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t close_paren = s.rfind(')');
  if (close_paren == std::string::npos || close_paren + 4 >= s.size()) return -1;
  // ") S PPID ..."
  size_t at = s.find(' ', close_paren + 2);
  if (at == std::string::npos) return -1;
  return static_cast<pid_t>(std::strtol(s.c_str() + at + 1, nullptr, 10));
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

struct AgentListener::Impl {
  int listen_fd = -1;
  int epfd = -1;
  int stop_fd = -1;   // eventfd: wakes the I/O thread to stop
  int queue_fd = -1;  // eventfd: readable while events are queued
  std::string name;
  std::thread io;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::set<pid_t> expected;                                // mu
  struct ExecExpectation {
    uid_t uid;
    Clock::time_point deadline;
  };
  std::map<pid_t, ExecExpectation> exec_expected;          // mu
  std::map<pid_t, std::shared_ptr<AgentLink>> arrived;     // mu: for wait_for()
  std::deque<LinkEvent> events;                            // mu
  std::map<pid_t, uid_t> known;                            // mu: pids that had a link
  std::map<int, std::shared_ptr<AgentLink>> links;         // mu (written by the I/O thread)

  struct PendingConn {
    Clock::time_point deadline;
    link::PeerCred cred;
  };
  std::map<int, PendingConn> pending;  // the I/O thread only

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

  void drop_pending(int fd) {
    ::epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    pending.erase(fd);
  }

  void accept_all() {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;  // EAGAIN, or a transient error (EMFILE): try again at the next event
      }
      link::PeerCred cred;
      if (link::peer_cred(fd, &cred) != 0 ||
          (geteuid() != 0 && cred.uid != geteuid())) {
        ::close(fd);  // another user: not even a HELLO is read
        continue;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = fd;
      if (::epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        ::close(fd);
        continue;
      }
      pending[fd] = {Clock::now() + kHelloTimeout, cred};
    }
  }

  // Decides whether a HELLO may become a link: see the header.
  enum class Verdict { kRefuse, kExpected, kEvent, kPrepared };
  Verdict judge(const link::PeerCred& cred, const link::Hello& h) {
    if (h.pid != cred.pid) return Verdict::kRefuse;
    if (h.abi_version != link::kAgentAbiVersion) return Verdict::kRefuse;
    std::lock_guard l(mu);
    if (expected.count(cred.pid)) return Verdict::kExpected;
    const auto now = Clock::now();
    std::erase_if(exec_expected, [&](const auto& e) { return e.second.deadline < now; });
    if (auto ex = exec_expected.find(cred.pid); ex != exec_expected.end()) {
      const bool ok = ex->second.uid == cred.uid && (h.reason == link::HelloReason::kLaunch ||
                                                     h.reason == link::HelloReason::kExec);
      exec_expected.erase(ex);
      return ok ? Verdict::kPrepared : Verdict::kRefuse;
    }
    // Forget processes that are gone, so a recycled pid is not taken for one of ours.
    for (auto it = known.begin(); it != known.end();)
      it = process_exists(it->first) ? std::next(it) : known.erase(it);
    if (h.reason == link::HelloReason::kFork) {
      auto parent = known.find(h.ppid);
      if (parent == known.end() || parent->second != cred.uid) return Verdict::kRefuse;
      if (proc_ppid(cred.pid) != h.ppid) return Verdict::kRefuse;
      return Verdict::kEvent;
    }
    if (h.reason == link::HelloReason::kExec || h.reason == link::HelloReason::kLaunch) {
      // The new image of a process with a link, or of a child that a traced process
      // started without fork's handlers (posix_spawn, vfork) and that exec'd.
      auto self = known.find(cred.pid);
      if (self != known.end()) return self->second == cred.uid ? Verdict::kEvent : Verdict::kRefuse;
      auto parent = known.find(h.ppid);
      if (parent == known.end() || parent->second != cred.uid) return Verdict::kRefuse;
      if (proc_ppid(cred.pid) != h.ppid) return Verdict::kRefuse;
      return Verdict::kEvent;
    }
    return Verdict::kRefuse;
  }

  void on_pending_readable(int fd) {
    PendingConn pc = pending[fd];
    std::vector<uint8_t> buf;
    long n = link::recv_packet(fd, &buf, 0ms);
    if (n == -ETIMEDOUT) return;  // spurious wake-up
    link::Message m;
    if (n <= 0 || link::decode(buf.data(), buf.size(), &m) != 0 ||
        m.type != link::MsgType::kHello) {
      drop_pending(fd);
      return;
    }
    const auto& h = std::get<link::Hello>(m.body);
    const Verdict v = judge(pc.cred, h);
    if (v == Verdict::kRefuse) {
      drop_pending(fd);
      return;
    }
    pending.erase(fd);
    auto impl = std::make_unique<AgentLink::Impl>();
    impl->fd = fd;
    impl->cred = pc.cred;
    impl->hello = h;
    std::shared_ptr<AgentLink> lk(new AgentLink(std::move(impl)));
    {
      std::lock_guard l(mu);
      links[fd] = lk;
      known[pc.cred.pid] = pc.cred.uid;
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

  void end_link(int fd, const std::shared_ptr<AgentLink>& lk) {
    ::epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    lk->impl_->mark_closed();
    {
      std::lock_guard l(mu);
      links.erase(fd);
    }
    push_event({LinkEvent::kClosed, lk, false, 0, {}});
  }

  void on_link_readable(int fd, const std::shared_ptr<AgentLink>& lk) {
    AgentLink::Impl& li = *lk->impl_;
    std::vector<uint8_t> buf;
    for (int budget = 0; budget < 64; ++budget) {
      long n = link::recv_packet(fd, &buf, 0ms);
      if (n == -ETIMEDOUT || n == -EAGAIN) return;
      if (n == -EMSGSIZE) continue;  // dropped
      if (n <= 0) {
        end_link(fd, lk);
        return;
      }
      link::Message m;
      std::string why;
      if (link::decode(buf.data(), buf.size(), &m, &why) != 0) {
        // A request we cannot read still gets an answer, so its sender does not wait.
        if (m.type == link::MsgType::kMapped) reply_error(li, m.seq, -EBADMSG, why);
        continue;
      }
      switch (m.type) {
        case link::MsgType::kReply: {
          int r = li.assembler.add(m);
          if (r < 0) {
            li.assembler = link::ReplyAssembler{};
            r = li.assembler.add(m);
          }
          if (r == 1) {
            const uint32_t seq = li.assembler.seq();
            li.complete(seq, li.assembler.take());
          }
          break;
        }
        case link::MsgType::kMapped: {
          LinkEvent ev{LinkEvent::kMapped, lk, false, m.seq, std::get<link::Mapped>(m.body)};
          push_event(std::move(ev));
          break;
        }
        default:
          reply_error(li, m.seq, -EOPNOTSUPP, "not a request the daemon serves");
          break;
      }
    }
  }

  static void reply_error(AgentLink::Impl& li, uint32_t seq, int err, const std::string& why) {
    link::Message r;
    r.type = link::MsgType::kReply;
    r.seq = seq;
    r.body = link::Reply{err, why.substr(0, 256), {}};
    std::lock_guard l(li.send_mu);
    (void)link::send_message(li.fd, r, 0ms);
  }

  void run() {
    epoll_event evs[32];
    for (;;) {
      int timeout_ms = 1000;
      auto now = Clock::now();
      for (const auto& [fd, pc] : pending) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(pc.deadline - now);
        timeout_ms = std::min<int>(timeout_ms, std::max<int>(0, static_cast<int>(left.count()) + 1));
      }
      int n = ::epoll_wait(epfd, evs, 32, timeout_ms);
      if (n < 0 && errno != EINTR) return;
      for (int i = 0; i < n; ++i) {
        const int fd = evs[i].data.fd;
        if (fd == stop_fd) return;
        if (fd == listen_fd) {
          accept_all();
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
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->second.deadline <= now) {
          const int fd = it->first;
          ++it;
          drop_pending(fd);
        } else {
          ++it;
        }
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
    for (int fd : {listen_fd, epfd, stop_fd, queue_fd})
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
  impl->name = link::make_link_name(::getpid());
  impl->listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (impl->listen_fd < 0) return fail(-errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, impl->name.data(), impl->name.size());
  const socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + impl->name.size());
  if (::bind(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) return fail(-errno);
  if (::listen(impl->listen_fd, 128) != 0) return fail(-errno);
  impl->epfd = ::epoll_create1(EPOLL_CLOEXEC);
  impl->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  impl->queue_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->epfd < 0 || impl->stop_fd < 0 || impl->queue_fd < 0) return fail(-errno);
  for (int fd : {impl->listen_fd, impl->stop_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(impl->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) return fail(-errno);
  }
  Impl* raw = impl.get();
  impl->io = std::thread([raw] { raw->run(); });
  return std::unique_ptr<AgentListener>(new AgentListener(std::move(impl)));
}

const std::string& AgentListener::name() const { return impl_->name; }

void AgentListener::expect(pid_t pid) {
  std::lock_guard l(impl_->mu);
  impl_->expected.insert(pid);
}

void AgentListener::expect_exec(pid_t pid, uid_t uid, Clock::time_point deadline) {
  std::lock_guard l(impl_->mu);
  impl_->exec_expected[pid] = {uid, deadline};
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

}  // namespace probefs::tracee
