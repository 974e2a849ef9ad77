// The kernel's own uprobe events on the benchmark's function, for the table's reference
// column: a private tracefs mount, an instance of its own (so the top-level buffer is left
// alone), the definitions removed and the mount undone whatever happens. Needs root and a
// kernel with uprobe events; otherwise available() is false and the column says so.
#pragma once

#include <string>
#include <vector>

namespace probefs::bench {

class KernelUprobes {
 public:
  KernelUprobes();
  ~KernelUprobes();
  KernelUprobes(const KernelUprobes&) = delete;
  KernelUprobes& operator=(const KernelUprobes&) = delete;

  bool available() const { return !root_.empty(); }
  const std::string& why_not() const { return why_not_; }

  // Adds `p:probefs_bench/NAME BODY` (or r: when `ret`) to uprobe_events and enables it in
  // the instance. false when the kernel refused it.
  bool add(const std::string& name, bool ret, const std::string& body);
  // Disables and removes every event added.
  void clear();

 private:
  bool write(const std::string& file, const std::string& text, bool append);

  std::string mount_;    // the private tracefs mount
  std::string root_;     // its instance
  std::vector<std::string> events_;
  std::string why_not_;
};

}  // namespace probefs::bench
