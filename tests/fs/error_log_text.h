// error_log's text as the tests compare it: the kernel's entry for a message, command and
// caret position, and a log's text with its timestamps taken out (each checked for the
// kernel's "[%5llu.%06u] " form on the way).
#pragma once

#include <string>
#include <string_view>

namespace probefs::fs::testing {

// The length of the kernel's "[%5llu.%06u] " at the start of an error_log line, or 0.
inline size_t error_log_stamp_length(std::string_view line) {
  auto digit = [&](size_t i) { return i < line.size() && line[i] >= '0' && line[i] <= '9'; };
  if (line.empty() || line[0] != '[') return 0;
  size_t i = 1;
  while (i < line.size() && line[i] == ' ') ++i;
  const size_t first = i;
  while (digit(i)) ++i;
  if (i == first || i - 1 < 5 || i >= line.size() || line[i] != '.') return 0;
  for (int k = 0; k < 6; ++k)
    if (!digit(++i)) return 0;
  return line.substr(i + 1, 2) == "] " ? i + 3 : 0;
}

// The log without the stamps; a line that should start with one and does not is kept
// whole and marked "<no stamp>", so the comparison shows it.
inline std::string error_log_without_stamps(const std::string& log) {
  std::string out;
  size_t start = 0;
  while (start < log.size()) {
    size_t nl = log.find('\n', start);
    std::string line = log.substr(start, nl == std::string::npos ? std::string::npos : nl - start + 1);
    start = nl == std::string::npos ? log.size() : nl + 1;
    if (!line.empty() && line[0] != ' ') {
      const size_t n = error_log_stamp_length(line);
      line = n ? line.substr(n) : "<no stamp>" + line;
    }
    out += line;
  }
  return out;
}

// One entry without its stamp: "<subsystem>: error: <message>\n  Command: <command>\n"
// and the caret under byte `pos` of the command.
inline std::string error_log_entry(std::string_view subsystem, std::string_view message,
                                   std::string_view command, int pos) {
  return std::string(subsystem) + ": error: " + std::string(message) + "\n  Command: " +
         std::string(command) + "\n" + std::string(static_cast<size_t>(11 + pos), ' ') + "^\n";
}

}  // namespace probefs::fs::testing
