// Shell one-liners against a mount, as a user types them: `echo LINE >> FILE`,
// `echo LINE > FILE`, `cat FILE`. bash runs them (its echo names the write's errno in its
// message, as the kernel captures show it); the line and the path go in as positional
// parameters, so no quoting of the test's text is involved. Every command is bounded.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"

namespace probefs::fs::testing {

// bash -c SCRIPT bash ARGS... ($1, $2, ... in SCRIPT).
inline CommandResult bash(const std::string& script, const std::vector<std::string>& args = {},
                          int timeout_ms = 30000) {
  std::vector<std::string> argv = {"bash", "-c", script, "bash"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv, timeout_ms);
}

// echo LINE >> FILE
inline CommandResult echo_append(const std::string& file, const std::string& line) {
  return bash("echo \"$1\" >> \"$2\"", {line, file});
}

// echo LINE > FILE (O_TRUNC)
inline CommandResult echo_truncate(const std::string& file, const std::string& line) {
  return bash("echo \"$1\" > \"$2\"", {line, file});
}

// printf %s TEXT >> FILE: TEXT in one write(), without a newline added.
inline CommandResult printf_append(const std::string& file, const std::string& text) {
  return bash("printf %s \"$1\" >> \"$2\"", {text, file});
}

// What bash prints when echo's write() fails with `err`.
inline std::string echo_write_error(int err) {
  return std::string("bash: line 1: echo: write error: ") + strerror(err) + "\n";
}

// What bash prints when the open of a redirection fails with `err`.
inline std::string redirect_error(const std::string& file, int err) {
  return "bash: line 1: " + file + ": " + strerror(err) + "\n";
}

// `cat FILE`: its output, or "<exit N: stderr>" when cat failed.
inline std::string cat(const std::string& file) {
  CommandResult r = run_command({"cat", file}, 30000);
  if (r.exit_code() != 0) return "<exit " + std::to_string(r.exit_code()) + ": " + r.err + ">";
  return r.out;
}

}  // namespace probefs::fs::testing
