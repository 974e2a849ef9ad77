// The agent link's transport (link/socket.h): link names parse as they are made, and a
// socket pair carries a message with a descriptor, bounds its waits, drops a packet too
// long for the link and reads EOF.
#include "link/socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace probefs::link {
namespace {

using namespace std::chrono_literals;
namespace lk = events::link;

TEST(LinkSocket, NamesParse) {
  const std::string n = make_link_name(4321);
  pid_t pid = 0;
  ASSERT_TRUE(parse_link_name(n, &pid)) << n;
  EXPECT_EQ(pid, 4321);
  EXPECT_NE(make_link_name(4321), n);  // random
  for (const char* bad : {"", "probefs.", "probefs.12", "probefs.12.", "probefs.x.0123",
                          "probefs.0.0123456789abcdef0123456789abcdef",
                          "probefs.12.0123456789ABCDEF0123456789abcdef",
                          "probefs.12.0123456789abcdef0123456789abcde",
                          "other.12.0123456789abcdef0123456789abcdef"})
    EXPECT_FALSE(parse_link_name(bad, &pid)) << bad;
  // Socket paths: absolute, the name as the last component, short enough for sockaddr_un.
  ASSERT_TRUE(parse_link_name("/run/probefs.4321.abcdef/0/" + n, &pid));
  EXPECT_EQ(pid, 4321);
  for (const std::string& bad : {"/" + n, "dir/" + n, "/run/x/" + n + "/",
                                 "/run/" + std::string(60, 'd') + "/" + n,
                                 std::string("/run/other.12.0123456789abcdef0123456789abcdef")})
    EXPECT_FALSE(parse_link_name(bad, &pid)) << bad;
}

TEST(LinkSocket, CarriesMessagesAndDescriptors) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  PeerCred pc;
  ASSERT_EQ(peer_cred(sv[0], &pc), 0);
  EXPECT_EQ(pc.pid, getpid());
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  lk::Message m;
  m.type = lk::MsgType::kSetup;
  m.seq = 1;
  m.body = lk::Setup{4096, 0, 0};
  ASSERT_EQ(send_message(sv[0], m, 1s, pipefd[0]), 0);
  std::vector<uint8_t> buf;
  int fd = -1;
  ASSERT_GT(recv_packet(sv[1], &buf, 1s, &fd), 0);
  ASSERT_GE(fd, 0);
  EXPECT_NE(fd, pipefd[0]);
  ASSERT_EQ(write(pipefd[1], "z", 1), 1);
  char c = 0;
  EXPECT_EQ(read(fd, &c, 1), 1);
  EXPECT_EQ(c, 'z');
  close(fd);
  lk::Message got;
  ASSERT_EQ(lk::decode(buf.data(), buf.size(), &got), 0);
  EXPECT_EQ(got.type, lk::MsgType::kSetup);
  // Nothing to read: a bounded wait.
  EXPECT_EQ(recv_packet(sv[1], &buf, 10ms), -ETIMEDOUT);
  // A packet too long for the link is dropped with its descriptor.
  std::vector<uint8_t> big(lk::kMaxMessageSize + 1, 0);
  int bigbuf = 1 << 20;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &bigbuf, sizeof bigbuf);
  if (send(sv[0], big.data(), big.size(), 0) == static_cast<ssize_t>(big.size())) {
    EXPECT_EQ(recv_packet(sv[1], &buf, 1s), -EMSGSIZE);
  }
  close(sv[0]);
  EXPECT_EQ(recv_packet(sv[1], &buf, 1s), 0);  // EOF
  close(sv[1]);
  close(pipefd[0]);
  close(pipefd[1]);
}

// A packet encoded elsewhere (a fork child's HELLO) goes as one packet; a closed peer is
// -EPIPE, never SIGPIPE.
TEST(LinkSocket, SendsAnEncodedPacket) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  lk::Hello h;
  h.pid = 11;
  h.ppid = 10;
  h.reason = lk::HelloReason::kFork;
  h.spare_id = 5;
  const uint32_t ids[] = {3, 4};
  uint8_t packet[128];
  const size_t n = lk::encode_hello(packet, sizeof packet, 2, h, ids, 2);
  ASSERT_GT(n, 0u);
  ASSERT_EQ(send_packet(sv[0], packet, n, 1s), 0);
  std::vector<uint8_t> buf;
  ASSERT_EQ(recv_packet(sv[1], &buf, 1s), static_cast<long>(n));
  lk::Message got;
  ASSERT_EQ(lk::decode(buf.data(), buf.size(), &got), 0);
  ASSERT_EQ(got.type, lk::MsgType::kHello);
  const auto& gh = std::get<lk::Hello>(got.body);
  EXPECT_EQ(gh.spare_id, 5u);
  EXPECT_EQ(gh.probe_ids, (std::vector<uint32_t>{3, 4}));
  close(sv[1]);
  EXPECT_EQ(send_packet(sv[0], packet, n, 1s), -EPIPE);
  close(sv[0]);
}

}  // namespace
}  // namespace probefs::link
