// The kernel's trace line, taken apart and put together again: a line is in the kernel's
// layout exactly when rendering what was parsed out of it gives the line back, byte for
// byte ("%16s-%-7d [%03d] %5s %5lu.%06lu: %s: %s", the reference's event line).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace probefs::fs::testing {

struct TraceLine {
  std::string comm;
  long pid = 0;
  int cpu = 0;
  std::string flags;  // the 5 characters of the irq-info column
  unsigned long sec = 0, usec = 0;
  std::string event;
  std::string body;  // after "EVENT: "
};

inline bool parse_trace_line(const std::string& line, TraceLine* out) {
  const size_t lb = line.find(" [");
  if (lb == std::string::npos || lb < 2) return false;
  size_t p = lb;
  while (p > 0 && line[p - 1] == ' ') --p;  // %-7d pads the pid on its right
  const size_t pid_end = p;
  while (p > 0 && line[p - 1] >= '0' && line[p - 1] <= '9') --p;
  if (p == pid_end || p == 0 || line[p - 1] != '-') return false;
  out->pid = std::stol(line.substr(p, pid_end - p));
  size_t c = 0;
  while (c < p - 1 && line[c] == ' ') ++c;
  out->comm = line.substr(c, p - 1 - c);
  int cpu = 0, used = 0;
  char flags[6] = {};
  unsigned long sec = 0, usec = 0;
  if (sscanf(line.c_str() + lb, " [%d] %5c %lu.%lu: %n", &cpu, flags, &sec, &usec, &used) != 4 ||
      used == 0)
    return false;
  out->cpu = cpu;
  out->flags = flags;
  out->sec = sec;
  out->usec = usec;
  const size_t rest = lb + static_cast<size_t>(used);
  const size_t colon = line.find(": ", rest);
  if (colon == std::string::npos) return false;
  out->event = line.substr(rest, colon - rest);
  out->body = line.substr(colon + 2);
  return true;
}

inline std::string render_trace_line(const TraceLine& l) {
  char head[128];
  snprintf(head, sizeof head, "%16s-%-7ld [%03d] %5s %5lu.%06lu: ", l.comm.c_str(), l.pid, l.cpu,
           l.flags.c_str(), l.sec, l.usec);
  return head + l.event + ": " + l.body;
}

// The lines of `text` (without their newlines) that are not header comments.
inline std::vector<std::string> trace_body_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t s = 0;
  while (s < text.size()) {
    size_t nl = text.find('\n', s);
    std::string l = text.substr(s, nl == std::string::npos ? std::string::npos : nl - s);
    s = nl == std::string::npos ? text.size() : nl + 1;
    if (!l.empty() && l[0] != '#') lines.push_back(l);
  }
  return lines;
}

}  // namespace probefs::fs::testing
