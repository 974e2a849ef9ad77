// One line at a time from a pipe, every wait bounded: the tests' drivers of the traced
// program (tests/tracee/traced_prog.c) read its answers through this.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace probefs::fs::testing {

// The next line of `fd` without its newline; `buf` keeps what was read past it. "" after
// `timeout_ms` or at end of file.
inline std::string read_line(int fd, std::string* buf, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    size_t nl = buf->find('\n');
    if (nl != std::string::npos) {
      std::string l = buf->substr(0, nl);
      buf->erase(0, nl + 1);
      return l;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0 || fd < 0) return "";
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char b[4096];
    ssize_t n = read(fd, b, sizeof b);
    if (n <= 0) return "";
    buf->append(b, static_cast<size_t>(n));
  }
}

}  // namespace probefs::fs::testing
