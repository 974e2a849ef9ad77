#include "link/socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>

namespace probefs::link {

std::string make_link_name(pid_t daemon_pid) {
  uint8_t rnd[16];
  size_t got = 0;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    while (got < sizeof rnd) {
      ssize_t r = ::read(fd, rnd + got, sizeof rnd - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    ::close(fd);
  }
  if (got < sizeof rnd) {  // no /dev/urandom: the name is still unique, only guessable
    std::random_device rd;
    for (uint8_t& b : rnd) b = static_cast<uint8_t>(rd());
  }
  static const char kHex[] = "0123456789abcdef";
  std::string name = "probefs." + std::to_string(daemon_pid) + ".";
  for (uint8_t b : rnd) {
    name += kHex[b >> 4];
    name += kHex[b & 15];
  }
  return name;
}

bool parse_link_name(std::string_view name, pid_t* daemon_pid) {
  if (name.starts_with('/')) {
    // A socket path: it must fit sockaddr_un with its NUL, and name a file in a directory.
    if (name.size() >= sizeof(sockaddr_un::sun_path)) return false;
    const size_t slash = name.rfind('/');
    if (slash == 0) return false;
    name.remove_prefix(slash + 1);
  } else if (name.find('/') != std::string_view::npos) {
    return false;
  }
  constexpr std::string_view kPrefix = "probefs.";
  if (!name.starts_with(kPrefix)) return false;
  name.remove_prefix(kPrefix.size());
  size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 10) return false;
  uint64_t pid = 0;
  for (char c : name.substr(0, dot)) {
    if (c < '0' || c > '9') return false;
    pid = pid * 10 + static_cast<uint64_t>(c - '0');
  }
  if (pid == 0 || pid > 0x3fffffff) return false;
  std::string_view hex = name.substr(dot + 1);
  if (hex.size() != 32) return false;
  for (char c : hex)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  *daemon_pid = static_cast<pid_t>(pid);
  return true;
}

int peer_cred(int fd, PeerCred* out) {
  struct ucred uc{};
  socklen_t len = sizeof uc;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0) return -errno;
  if (len != sizeof uc) return -EPROTO;
  out->pid = uc.pid;
  out->uid = uc.uid;
  out->gid = uc.gid;
  return 0;
}

namespace {

int wait_fd(int fd, short events, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int ms = -1;
    if (timeout.count() >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      ms = left.count() < 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
    }
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms);
    if (r > 0) return 0;
    if (r == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
  }
}

}  // namespace

int connect_link(std::string_view name, std::chrono::milliseconds timeout) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof addr.sun_path) return -EINVAL;
  // A path is NUL-terminated; an abstract name starts with a NUL and has none after.
  const bool path = name.front() == '/';
  std::memcpy(addr.sun_path + (path ? 0 : 1), name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len);
  if (rc != 0 && (errno == EINPROGRESS || errno == EAGAIN)) {
    // A full backlog: AF_UNIX reports EAGAIN and does not complete later; retry until the
    // deadline.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (rc != 0 && (errno == EAGAIN || errno == EINPROGRESS)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::close(fd);
        return -ETIMEDOUT;
      }
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 10);
      rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len);
      if (rc != 0 && errno == EISCONN) rc = 0;
    }
  }
  if (rc != 0) {
    int e = errno;
    ::close(fd);
    return -e;
  }
  // Blocking from here on; every wait is bounded with poll.
  int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

namespace {

// One packet, waiting at most `timeout` for room in the socket buffer.
int send_one(int fd, const msghdr& mh, std::chrono::milliseconds timeout) {
  for (;;) {
    if (::sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return -errno;
    if (int w = wait_fd(fd, POLLOUT, timeout); w) return w;
  }
}

}  // namespace

int send_packet(int fd, const uint8_t* data, size_t n, std::chrono::milliseconds timeout) {
  iovec iov{const_cast<uint8_t*>(data), n};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  return send_one(fd, mh, timeout);
}

int send_message(int fd, const events::link::Message& m, std::chrono::milliseconds timeout,
                 int pass_fd) {
  std::vector<std::vector<uint8_t>> packets = events::link::encode(m);
  if (packets.empty()) return -EINVAL;
  for (size_t i = 0; i < packets.size(); ++i) {
    iovec iov{packets[i].data(), packets[i].size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))];
    if (i == 0 && pass_fd >= 0) {
      std::memset(ctl, 0, sizeof ctl);
      mh.msg_control = ctl;
      mh.msg_controllen = sizeof ctl;
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    if (int rc = send_one(fd, mh, timeout); rc != 0) return rc;
  }
  return 0;
}

long recv_packet(int fd, std::vector<uint8_t>* buf, std::chrono::milliseconds timeout,
                 int* received_fd) {
  if (received_fd) *received_fd = -1;
  for (;;) {
    // The packet's own length first (a peek takes no descriptor): the buffer is made as
    // long as the packet, not as the longest the link allows. Zeroing that much was
    // 48 pages, each a fault in a fork child or a new image, where they cost most.
    const ssize_t len = ::recv(fd, nullptr, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    if (len < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return -errno;
      if (int w = wait_fd(fd, POLLIN, timeout); w) return w;
      continue;
    }
    buf->resize(std::clamp<size_t>(static_cast<size_t>(len), 1, events::link::kMaxMessageSize + 1));
    iovec iov{buf->data(), buf->size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 8)];
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    ssize_t r = ::recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return -errno;
      if (int w = wait_fd(fd, POLLIN, timeout); w) return w;
      continue;
    }
    // Take every descriptor that came, keep at most the first one asked for.
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfd; ++i) {
        int got;
        std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (received_fd && *received_fd < 0) *received_fd = got;
        else ::close(got);
      }
    }
    if (r == 0) {
      buf->clear();
      return 0;
    }
    if ((mh.msg_flags & MSG_TRUNC) || static_cast<size_t>(r) > events::link::kMaxMessageSize) {
      if (received_fd && *received_fd >= 0) {
        ::close(*received_fd);
        *received_fd = -1;
      }
      buf->clear();
      return -EMSGSIZE;
    }
    buf->resize(static_cast<size_t>(r));
    return r;
  }
}

}  // namespace probefs::link
