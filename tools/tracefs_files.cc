// The tracefs's files as the helper uses them: which directory is the tracefs, the events
// its definition files read back, and writes to them with the kernel's account of a refusal.
#include "tools/tracefs_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace probefs::tools {
namespace {

namespace stdfs = std::filesystem;

std::string reason(int err) { return std::generic_category().message(err); }

// The whole of PATH into OUT: 0, or the errno of the failed open or read.
int read_whole(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  out->clear();
  char buf[65536];
  int err = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      err = errno;
      break;
    }
  }
  close(fd);
  return err;
}

// FILE of the tracefs DIR opened for appending (never truncating: that would remove every
// event), or perf's "Failed to open uprobe_events: REASON".
Result<int> open_append(const std::string& dir, const std::string& file) {
  int fd = open((dir + "/" + file).c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return make_error(-err, "Failed to open " + file + ": " + reason(err));
  }
  return fd;
}

// One write(2) of TEXT to FD, which it closes: 0 or the errno.
int write_once(int fd, const std::string& text) {
  ssize_t n = write(fd, text.data(), text.size());
  int err = n < 0 ? errno : 0;
  close(fd);
  // The definition files take a write whole or refuse it; a short count is not theirs.
  if (n >= 0 && static_cast<size_t>(n) != text.size()) err = EIO;
  return err;
}

// mountinfo escapes space, tab, newline and backslash in paths as \ooo.
std::string unescape_mount_path(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string oct = s.substr(i + 1, 3);
      if (oct.find_first_not_of("01234567") == std::string::npos) {
        out += static_cast<char>(std::stoi(oct, nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// Whether DIR (canonical) is the mount point of a probefs mount.
bool is_probefs_mount(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point, opts, field, type;
    fields >> id >> parent >> dev >> root >> point >> opts;
    while (fields >> field && field != "-") {  // the optional fields end at "-"
    }
    fields >> type;
    if (type == "fuse.probefs" && unescape_mount_path(point) == dir) return true;
  }
  return false;
}

bool is_tracefs(const std::string& dir) {
  if (is_probefs_mount(dir)) return true;
  std::error_code ec;
  return stdfs::is_regular_file(stdfs::path(dir) / "uprobe_events", ec) &&
         stdfs::exists(stdfs::path(dir) / "README", ec);
}

// TEXT as a whole unsigned number, hexadecimal with 0x, else decimal.
bool parse_u64(std::string_view text, uint64_t* value) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  const char* end = text.data() + text.size();
  auto [stop, ec] = std::from_chars(text.data(), end, *value, base);
  return ec == std::errc() && stop == end;
}

// PATH:0xOFFSET[(0xREF_CTR)]; PATH may hold ':' itself, the offset cannot.
void parse_uprobe_location(DefinedEvent* ev) {
  const std::string& loc = ev->location;
  size_t colon = loc.rfind(':');
  if (colon == std::string::npos) return;
  std::string_view off = std::string_view(loc).substr(colon + 1);
  uint64_t ref_ctr = 0;
  if (size_t paren = off.find('('); paren != std::string_view::npos) {
    if (off.back() != ')' || !parse_u64(off.substr(paren + 1, off.size() - paren - 2), &ref_ctr))
      return;
    off = off.substr(0, paren);
  }
  uint64_t offset = 0;
  if (!parse_u64(off, &offset)) return;
  ev->path = loc.substr(0, colon);
  ev->file_offset = offset;
  ev->ref_ctr_offset = ref_ctr;
}

// SYMBOL[+OFFSET], the offset in decimal as the kernel prints it.
void parse_kprobe_location(DefinedEvent* ev) {
  const std::string& loc = ev->location;
  size_t plus = loc.rfind('+');
  uint64_t offset = 0;
  if (plus != std::string::npos && plus > 0 &&
      loc.find_first_not_of("0123456789", plus + 1) == std::string::npos &&
      parse_u64(std::string_view(loc).substr(plus + 1), &offset)) {
    ev->symbol = loc.substr(0, plus);
    ev->symbol_offset = offset;
  } else {
    ev->symbol = loc;
  }
}

// "p:GROUP/EVENT LOCATION[ ARGS]" (a kretprobe may carry its maxactive: "r10:"), the
// kernel's read-back with single spaces; nullopt for a line of another form.
std::optional<DefinedEvent> parse_defined_event(std::string_view line, bool uprobe) {
  size_t space = line.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  std::string_view head = line.substr(0, space);
  std::string_view rest = line.substr(space + 1);
  size_t colon = head.find(':');
  size_t slash = head.find('/');
  if (head.empty() || (head[0] != 'p' && head[0] != 'r') || colon == std::string_view::npos ||
      slash == std::string_view::npos || slash < colon || slash == colon + 1 ||
      slash + 1 == head.size())
    return std::nullopt;
  for (size_t i = 1; i < colon; ++i)
    if (!std::isdigit(static_cast<unsigned char>(head[i]))) return std::nullopt;
  DefinedEvent ev;
  ev.kind = head[0];
  ev.group = head.substr(colon + 1, slash - colon - 1);
  ev.event = head.substr(slash + 1);
  size_t args = rest.find(' ');
  ev.location = rest.substr(0, args);
  if (ev.location.empty()) return std::nullopt;
  if (args != std::string_view::npos) ev.args = rest.substr(args + 1);
  ev.line = line;
  ev.uprobe = uprobe;
  if (uprobe)
    parse_uprobe_location(&ev);
  else
    parse_kprobe_location(&ev);
  return ev;
}

// error_log's entries, each with its lines: an entry's first line is the only one that
// does not start with a space.
std::vector<std::string> split_log(const std::string& text) {
  std::vector<std::string> entries;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (entries.empty() || (!line.empty() && line[0] != ' ')) entries.emplace_back();
    entries.back() += line + "\n";
  }
  return entries;
}

// The entry a write added: the last one after it, when it was not there before. (The log
// keeps a few entries only, so counting them would miss an entry that pushed out the
// oldest; the timestamp makes each entry's text its own.)
std::optional<std::string> new_log_entry(const std::string& before, const std::string& after) {
  std::vector<std::string> old_entries = split_log(before), new_entries = split_log(after);
  if (new_entries.empty()) return std::nullopt;
  std::string last = new_entries.back();
  for (const std::string& e : old_entries)
    if (e == last) return std::nullopt;
  last.pop_back();
  return last;
}

}  // namespace

Result<std::string> find_tracefs(const std::string& target_option) {
  std::error_code ec;
  if (!target_option.empty()) {
    stdfs::path dir = stdfs::canonical(target_option, ec);
    if (ec) return make_error(-ec.value(), "--target " + target_option + ": " + reason(ec.value()));
    if (is_tracefs(dir)) return dir.string();
    return make_error(-ENOENT, "--target " + target_option +
                                   ": not a tracefs (neither a probefs mount nor a directory "
                                   "with uprobe_events and README)");
  }
  if (const char* env = getenv("TRACEFS_PATH"); env && *env) return std::string(env);
  stdfs::path cwd = stdfs::current_path(ec);
  if (!ec && is_tracefs(cwd)) return cwd.string();
  return make_error(-ENOENT, "No tracefs given: use --target MOUNTPOINT or TRACEFS_PATH");
}

std::optional<LogEntry> parse_log_entry(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  size_t nl1 = text.find('\n');
  size_t nl2 = nl1 == std::string_view::npos ? nl1 : text.find('\n', nl1 + 1);
  if (nl2 == std::string_view::npos || text.find('\n', nl2 + 1) != std::string_view::npos)
    return std::nullopt;
  std::string_view head = text.substr(0, nl1);
  std::string_view command = text.substr(nl1 + 1, nl2 - nl1 - 1);
  std::string_view caret = text.substr(nl2 + 1);
  if (!head.empty() && head[0] == '[') {
    size_t end = head.find("] ");
    if (end == std::string_view::npos) return std::nullopt;
    head.remove_prefix(end + 2);
  }
  constexpr std::string_view kError = ": error: ", kCommand = "  Command: ";
  size_t error = head.find(kError);
  if (error == std::string_view::npos || command.substr(0, kCommand.size()) != kCommand)
    return std::nullopt;
  size_t col = caret.find_first_not_of(' ');
  if (col == std::string_view::npos || col < kCommand.size() || caret.substr(col) != "^")
    return std::nullopt;
  LogEntry entry;
  entry.source = head.substr(0, error);
  entry.message = head.substr(error + kError.size());
  entry.command = command.substr(kCommand.size());
  entry.caret = static_cast<int>(col - kCommand.size());
  return entry;
}

Result<std::vector<DefinedEvent>> Tracefs::events() const {
  std::vector<DefinedEvent> events;
  for (bool uprobe : {true, false}) {
    const std::string file = uprobe ? "uprobe_events" : "kprobe_events";
    std::string text;
    if (int err = read_whole(dir_ + "/" + file, &text); err == ENOENT) {
      continue;
    } else if (err) {
      return make_error(-err, "Failed to open " + file + ": " + reason(err));
    }
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
      if (auto ev = parse_defined_event(line, uprobe)) events.push_back(std::move(*ev));
  }
  return events;
}

Status Tracefs::add(const std::string& definition, bool kprobe) {
  const std::string log = dir_ + "/error_log";
  std::string before, after;
  const bool have_log = read_whole(log, &before) == 0;
  Result<int> fd = open_append(dir_, kprobe ? "kprobe_events" : "uprobe_events");
  if (!fd) return fd.error();
  std::string text = definition;
  if (text.empty() || text.back() != '\n') text += '\n';
  int err = write_once(*fd, text);
  if (err == 0) return Ok{};
  if (have_log && read_whole(log, &after) == 0)
    if (auto entry = new_log_entry(before, after)) return make_error(-err, *entry);
  return make_error(-err, "Failed to write event: " + reason(err));
}

Status Tracefs::remove(const DefinedEvent& event) {
  Result<int> fd = open_append(dir_, event.uprobe ? "uprobe_events" : "kprobe_events");
  if (!fd) return fd.error();
  if (int err = write_once(*fd, "-:" + event.group + "/" + event.event + "\n"))
    return make_error(-err, "Failed to delete event: " + reason(err));
  return Ok{};
}

Status Tracefs::attach(int pid) const {
  const std::string path = dir_ + "/targets";
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return make_error(-errno, "Failed to open " + path + ": " + reason(errno) +
                                  " (only a probefs mount can attach a process)");
  const std::string cmd = "attach " + std::to_string(pid);
  int err = 0;
  std::string why;
  if (::write(fd, cmd.data(), cmd.size()) != static_cast<ssize_t>(cmd.size())) {
    err = errno;
    char answer[512];
    const ssize_t n = ::pread(fd, answer, sizeof answer - 1, 0);
    if (n > 0) why.assign(answer, static_cast<size_t>(n));
    while (!why.empty() && why.back() == '\n') why.pop_back();
  }
  ::close(fd);
  if (err == 0 || err == EEXIST) return Ok{};  // traced already: the probes are in it
  return make_error(-err, "Failed to attach " + std::to_string(pid) + ": " +
                              (why.empty() ? reason(err) : why));
}

std::string Tracefs::readme() const {
  std::string text;
  return read_whole(dir_ + "/README", &text) == 0 ? text : std::string();
}

}  // namespace probefs::tools
