#include "bench/tracee/kernel_uprobe.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace probefs::bench {

namespace {
constexpr const char* kGroup = "probefs_bench";
}

KernelUprobes::KernelUprobes() {
  char dir[] = "/tmp/probefs-bench-tracefs-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    why_not_ = std::string("mkdtemp: ") + strerror(errno);
    return;
  }
  if (mount("nodev", dir, "tracefs", 0, nullptr) != 0) {
    why_not_ = std::string("mount tracefs: ") + strerror(errno);
    rmdir(dir);
    return;
  }
  mount_ = dir;
  std::string inst = mount_ + "/instances/probefs_bench";
  if (mkdir(inst.c_str(), 0755) != 0 && errno != EEXIST) {
    why_not_ = std::string("tracefs instance: ") + strerror(errno);
    return;
  }
  root_ = inst;
}

KernelUprobes::~KernelUprobes() {
  clear();
  if (!root_.empty()) rmdir(root_.c_str());
  if (!mount_.empty()) {
    umount2(mount_.c_str(), MNT_DETACH);
    rmdir(mount_.c_str());
  }
}

bool KernelUprobes::write(const std::string& file, const std::string& text, bool append) {
  int fd = open(file.c_str(), O_WRONLY | (append ? O_APPEND : O_TRUNC));
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

bool KernelUprobes::add(const std::string& name, bool ret, const std::string& body) {
  if (!available()) return false;
  std::string line = std::string(ret ? "r:" : "p:") + kGroup + "/" + name + " " + body + "\n";
  if (!write(mount_ + "/uprobe_events", line, true)) {
    why_not_ = "uprobe_events refused: " + line;
    return false;
  }
  events_.push_back(name);
  return write(root_ + "/events/" + kGroup + "/" + name + "/enable", "1", false);
}

void KernelUprobes::clear() {
  for (const std::string& e : events_)
    write(root_ + "/events/" + kGroup + "/" + e + "/enable", "0", false);
  for (const std::string& e : events_)
    write(mount_ + "/uprobe_events", std::string("-:") + kGroup + "/" + e + "\n", true);
  events_.clear();
}

}  // namespace probefs::bench
