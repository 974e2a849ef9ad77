// The agent link's transport: its names and sockets, shared by both ends (the daemon's
// tracee/agent_link.h and the agent's bootstrap). The messages it carries are
// events/link.h's (their formats, encoding and strict decoding: pure data, with the fetch
// programs and filters of the events language inside); this layer moves them between
// processes and tells each end who is at the other.
//
// AF_UNIX SOCK_SEQPACKET, one message per packet, so a message is never split or merged
// by the socket and a dead peer reads as EOF. The daemon listens on a socket file in a
// directory that only the uid it serves can enter (tracee/agent_link.h): an abstract name
// would be listed in /proc/net/unix and open to every local user. Each agent connects
// once. Both ends check the other with SO_PEERCRED (uid and pid) before they trust a byte.
//
// Threads: every function here may be called from any thread; none keeps state.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "events/link.h"

namespace probefs::link {

// The environment variable that tells a preloaded agent the link name (set by the
// launcher, tracee/launch.h; inherited by fork children and exec'd images).
inline constexpr const char* kLinkEnv = "PROBEFS_AGENT_LINK";

// Link names end in `probefs.<daemon pid>.<32 hex digits>` (the digits random), so an
// agent learns which process it must find at the other end. The daemon's names are
// socket paths, `/DIR/probefs.<pid>.<hex>` (absolute, shorter than sockaddr_un's path);
// a name without a '/' is an abstract name (a test's daemon written by hand).
std::string make_link_name(pid_t daemon_pid);
// The daemon's pid from a link name; false when the name is not of a form above.
bool parse_link_name(std::string_view name, pid_t* daemon_pid);

// Credentials of the peer of a connected AF_UNIX socket (SO_PEERCRED): the process that
// connected (or listened) at that time. 0 or a negative errno.
struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
[[nodiscard]] int peer_cred(int fd, PeerCred* out);

// Connects a new SOCK_SEQPACKET | SOCK_CLOEXEC socket to the link name (a path, or an
// abstract name). The fd, or a negative errno (-EACCES: a directory on the path is not
// ours to enter). Blocks at most `timeout` (a full backlog).
[[nodiscard]] int connect_link(std::string_view name, std::chrono::milliseconds timeout);

// Sends all packets of m, the first with `pass_fd` attached when >= 0 (SETUP). MSG_NOSIGNAL:
// a closed peer gives -EPIPE, not SIGPIPE. 0 or a negative errno; blocks at most
// `timeout` per packet on a full socket buffer.
[[nodiscard]] int send_message(int fd, const events::link::Message& m,
                               std::chrono::milliseconds timeout, int pass_fd = -1);

// Sends one packet already encoded (events::link::encode_hello), as send_message does;
// allocates nothing.
[[nodiscard]] int send_packet(int fd, const uint8_t* data, size_t n,
                              std::chrono::milliseconds timeout);

// Receives one packet into *buf (resized to its length). A file descriptor that came with
// it is stored in *received_fd (CLOEXEC) when received_fd is not null, and closed
// otherwise; -1 when none came. Returns the packet length (> 0), 0 at EOF, -ETIMEDOUT
// after `timeout` (negative: wait for ever), -EMSGSIZE for a packet longer than
// events::link::kMaxMessageSize (it is dropped), or another negative errno.
[[nodiscard]] long recv_packet(int fd, std::vector<uint8_t>* buf,
                               std::chrono::milliseconds timeout, int* received_fd = nullptr);

}  // namespace probefs::link
