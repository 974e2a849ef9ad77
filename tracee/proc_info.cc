#include "tracee/proc_info.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>

namespace probefs::tracee {
namespace {

// `s` as a whole number of type T in `base`: no sign for an unsigned T, nothing after it.
template <typename T>
bool whole_number(std::string_view s, T* out, int base = 10) {
  if (s.empty()) return false;
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (ec != std::errc() || end != s.data() + s.size()) return false;
  *out = v;
  return true;
}

// The next word of `*rest` (after any of the blanks in `blanks`), which is taken off it;
// empty when there is none.
std::string_view next_word(std::string_view* rest, std::string_view blanks) {
  const size_t b = rest->find_first_not_of(blanks);
  if (b == std::string_view::npos) {
    *rest = {};
    return {};
  }
  rest->remove_prefix(b);
  const size_t e = std::min(rest->find_first_of(blanks), rest->size());
  const std::string_view word = rest->substr(0, e);
  rest->remove_prefix(e);
  return word;
}

}  // namespace

std::string proc_path(pid_t pid, pid_t tid, const char* leaf) {
  std::string path = "/proc/" + std::to_string(pid) + "/";
  if (tid > 0) path += "task/" + std::to_string(tid) + "/";
  return path + leaf;
}

int read_proc_text(const char* path, std::string* out, size_t max) {
  out->clear();
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  // Until the end: a seq_file hands out what does not fit one read in the next.
  char buf[4096];
  int err = 0;
  while (out->size() < max) {
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, max - out->size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = -errno;
      break;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return err;
}

int read_proc_file(pid_t pid, pid_t tid, const char* leaf, std::string* out, size_t max) {
  if (pid <= 0 || tid < 0) {
    out->clear();
    return -ESRCH;
  }
  return read_proc_text(proc_path(pid, tid, leaf).c_str(), out, max);
}

// ---- stat ------------------------------------------------------------------------------

bool parse_proc_stat(std::string_view text, ProcStat* out) {
  // The name is the process's to choose, ')' and "(" and newlines included; the kernel
  // prints it raw, so only the last ')' of the line is surely its end.
  const size_t open = text.find('(');
  const size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    return false;
  out->comm.assign(text.substr(open + 1, close - open - 1));
  // ") S PPID ...": the state, then fields 4 to 22 one blank apart.
  std::string_view rest = text.substr(close + 1);
  if (rest.size() < 2 || rest[0] != ' ') return false;
  out->state = rest[1];
  rest.remove_prefix(2);
  if (!rest.empty() && rest[0] != ' ') return false;  // a state is one letter
  for (int field = 4; field <= 22; ++field) {
    const std::string_view word = next_word(&rest, " \n");
    if (word.empty()) return false;
    if (field == 4 && (!whole_number(word, &out->ppid) || out->ppid < 0)) return false;
    if (field == 22 && !whole_number(word, &out->start)) return false;
  }
  return true;
}

int read_proc_stat(pid_t pid, pid_t tid, ProcStat* out) {
  if (pid <= 0 || tid < 0) return -ESRCH;
  // One read() into a fixed buffer: the kernel makes the line whole at open and hands it
  // out in one read when it fits, and it always does (52 numbers and a name of at most 64
  // bytes). This runs for each connection of an agent, on the way of a fork child to its
  // GO, and for each look at whether a target is stopped.
  const int fd = ::open(proc_path(pid, tid, "stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) < 0 && errno == EINTR) {
  }
  const int err = n < 0 ? -errno : 0;
  ::close(fd);
  if (err != 0) return err;
  return parse_proc_stat(std::string_view(buf, static_cast<size_t>(n)), out) ? 0 : -EINVAL;
}

char proc_state(pid_t pid, pid_t tid) {
  ProcStat stat;
  return read_proc_stat(pid, tid, &stat) == 0 ? stat.state : 0;
}

bool process_running(pid_t pid) {
  const char state = proc_state(pid);
  return state != 0 && state != 'Z' && state != 'X';
}

bool process_stopped(pid_t pid) {
  const char state = proc_state(pid);
  return state == 'T' || state == 't';
}

// ---- status ----------------------------------------------------------------------------

int ProcStatus::read(pid_t pid, pid_t tid, size_t max) {
  return read_proc_file(pid, tid, "status", &text_, max);
}

std::string_view ProcStatus::field(std::string_view name) const {
  std::string_view rest = text_;
  while (!rest.empty()) {
    const size_t end = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, end);
    if (line.size() > name.size() && line.starts_with(name) && line[name.size()] == ':') {
      std::string_view value = line.substr(name.size() + 1);
      const size_t b = value.find_first_not_of(" \t");
      return b == std::string_view::npos ? std::string_view() : value.substr(b);
    }
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return {};
}

bool ProcStatus::number(std::string_view name, uint64_t* out, int index, int base) const {
  if (index < 0) return false;
  std::string_view rest = field(name);
  std::string_view word;
  for (int i = 0; i <= index; ++i) word = next_word(&rest, " \t");
  return whole_number(word, out, base);
}

pid_t proc_tgid(pid_t tid) {
  ProcStatus status;
  uint64_t tgid = 0;
  if (status.read(tid) != 0 || !status.number("Tgid", &tgid)) return 0;
  return tgid <= static_cast<uint64_t>(std::numeric_limits<pid_t>::max())
             ? static_cast<pid_t>(tgid)
             : 0;
}

// ---- comm and links --------------------------------------------------------------------

int read_proc_comm(pid_t pid, pid_t tid, std::string* out) {
  // 64 bytes at most (a kernel worker's name; a process's own has 15).
  if (int err = read_proc_file(pid, tid, "comm", out, 256); err != 0) return err;
  out->resize(std::min(out->find('\n'), out->size()));
  return 0;
}

std::string proc_comm(pid_t pid, pid_t tid) {
  std::string comm;
  return read_proc_comm(pid, tid, &comm) == 0 ? comm : std::string();
}

std::string proc_link(pid_t pid, pid_t tid, const char* leaf) {
  if (pid <= 0 || tid < 0) return {};
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(proc_path(pid, tid, leaf).c_str(), buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) return {};
  return std::string(buf, static_cast<size_t>(n));
}

std::string proc_exe(pid_t pid) { return proc_link(pid, 0, "exe"); }

}  // namespace probefs::tracee
