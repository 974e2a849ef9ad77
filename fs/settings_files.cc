#include "fs/settings_files.h"

#include <cctype>
#include <cerrno>
#include <cstdio>

#include "events/kstrto.h"

namespace probefs::fs {
namespace {

// The kernel's pid lists hold pids below 2^30; a number past that fails the whole write.
constexpr uint32_t kPidLimit = uint32_t{1} << 30;
// The longest word the kernel's pid-list parser holds.
constexpr size_t kMaxPidWord = 127;

bool is_blank(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool ends_chunk(char c) { return is_blank(c) || c == ','; }

int hex_value(char c) {
  const int d = events::digit_value(c);
  return d < 16 ? d : -1;
}

int64_t done(std::string_view data) { return static_cast<int64_t>(data.size()); }

// free_buffer: writes are taken and do nothing; it has no read (EINVAL, as the kernel's).
class FreeBufferFile : public File {
 public:
  int open(const Request&, int, std::unique_ptr<Handle>* out) override {
    *out = std::make_unique<Sink>();
    return 0;
  }

 private:
  class Sink : public Handle {
   public:
    int read(const Request&, uint64_t, size_t, std::string*) override { return -EINVAL; }
    int64_t write(const Request&, uint64_t, std::string_view data) override { return done(data); }
  };
};

}  // namespace

// ---- CpuMask -----------------------------------------------------------------------------

CpuMask::CpuMask(int cpus) : cpus_(cpus), chunks_((cpus + 31) / 32, 0) {
  for (int cpu = 0; cpu < cpus; ++cpu) chunks_[cpu / 32] |= uint32_t{1} << (cpu % 32);
}

bool CpuMask::test(int cpu) const {
  if (cpu < 0 || cpu >= cpus_) return false;
  return (chunks_[cpu / 32] >> (cpu % 32)) & 1;
}

bool CpuMask::all() const {
  for (int cpu = 0; cpu < cpus_; ++cpu)
    if (!test(cpu)) return false;
  return true;
}

std::string CpuMask::text() const {
  std::string out;
  const int top_bits = cpus_ % 32 == 0 ? 32 : cpus_ % 32;
  for (size_t i = chunks_.size(); i-- > 0;) {
    const int digits = i + 1 == chunks_.size() ? (top_bits + 3) / 4 : 8;
    char buf[16];
    std::snprintf(buf, sizeof buf, "%0*x", digits, chunks_[i]);
    if (!out.empty()) out += ',';
    out += buf;
  }
  return out + "\n";
}

// Read from the end, chunk by chunk, as the kernel reads it: up to 8 hex digits back from
// a chunk's end; a ninth hex digit is an overflow, a ninth other character is stepped
// over (and what precedes it is the next chunk).
int CpuMask::parse(std::string_view text) {
  text = text.substr(0, text.find_first_of(std::string_view("\n\0", 2)));
  std::vector<uint32_t> got(chunks_.size(), 0);
  size_t at = text.size();  // just past the next character to read
  for (size_t n = 0;; ++n) {
    while (at > 0 && ends_chunk(text[at - 1])) --at;
    if (at == 0) break;
    if (n == got.size()) return -EOVERFLOW;
    for (int digits = 0; digits < 8 && at > 0 && !ends_chunk(text[at - 1]); ++digits) {
      const int d = hex_value(text[--at]);
      if (d < 0) return -EINVAL;
      got[n] |= static_cast<uint32_t>(d) << (4 * digits);
    }
    if (at > 0 && !ends_chunk(text[at - 1]) && hex_value(text[--at]) >= 0) return -EOVERFLOW;
  }
  if (cpus_ % 32 != 0 && (got.back() >> (cpus_ % 32)) != 0) return -EOVERFLOW;
  chunks_ = std::move(got);
  return 0;
}

// ---- PidList -----------------------------------------------------------------------------

std::string PidList::text() const {
  std::string out;
  for (pid_t p : pids_) out += std::to_string(static_cast<uint32_t>(p)) + "\n";
  return out;
}

int64_t PidList::add(std::string_view data) {
  std::set<pid_t> next = pids_;
  size_t i = 0;
  for (;;) {
    while (i < data.size() && (is_blank(data[i]) || data[i] == '\0')) ++i;
    if (i == data.size()) break;
    const size_t start = i;
    while (i < data.size() && !is_blank(data[i]) && data[i] != '\0') ++i;
    const std::string_view word = data.substr(start, i - start);
    uint64_t v;
    if (word.size() > kMaxPidWord || !events::kstrtoull(word, 0, &v)) return -EINVAL;
    const uint32_t pid = static_cast<uint32_t>(v);  // the kernel keeps a pid_t of it
    if (pid >= kPidLimit) return -EPERM;
    next.insert(static_cast<pid_t>(pid));
  }
  pids_ = std::move(next);
  return done(data);
}

// ---- SettingsFiles -------------------------------------------------------------------------

SettingsFiles::SettingsFiles(int cpus) : cpumask_(cpus) {}

bool SettingsFiles::cpu_traced(int cpu) const {
  std::lock_guard l(mu_);
  return cpumask_.test(cpu);
}

bool SettingsFiles::event_pid_refused(pid_t tid) const {
  std::lock_guard l(mu_);
  return notrace_pids_.contains(tid);
}

void SettingsFiles::changed() {
  const bool limited = !cpumask_.all() || !event_pids_.empty() || !notrace_pids_.empty();
  scope_version_.store(limited ? ++changes_ : 0, std::memory_order_release);
}

bool SettingsFiles::event_pid_allowed(pid_t tid) const {
  std::lock_guard l(mu_);
  if (!event_pids_.empty() && !event_pids_.contains(tid)) return false;
  return !notrace_pids_.contains(tid);
}

int64_t SettingsFiles::write_cpumask(std::string_view data) {
  std::lock_guard l(mu_);
  if (int err = cpumask_.parse(data); err != 0) return err;
  changed();
  return done(data);
}

// A pid list's file: every write adds, O_TRUNC empties.
std::shared_ptr<TextFile> SettingsFiles::pid_file(PidList SettingsFiles::*list) {
  return make_text_file(
      [this, list] {
        std::lock_guard l(mu_);
        return (this->*list).text();
      },
      [this, list](const Request&, std::string_view d) {
        std::lock_guard l(mu_);
        const int64_t r = (this->*list).add(d);
        changed();
        return r;
      },
      [this, list](const Request&) {
        std::lock_guard l(mu_);
        (this->*list).clear();
        changed();
        return 0;
      });
}

void SettingsFiles::add_files(Tree& tree, const NodePtr& root, bool instance) {
  auto number = [this](uint64_t SettingsFiles::*field, uint64_t max, uint64_t scale) {
    return make_text_file(
        [this, field, scale] {
          std::lock_guard l(mu_);
          return std::to_string(this->*field / scale) + "\n";
        },
        [this, field, max, scale](const Request&, std::string_view d) -> int64_t {
          uint64_t v;
          if (!events::kstrtoull(d, 10, &v) || v > max) return -EINVAL;
          std::lock_guard l(mu_);
          this->*field = v * scale;
          return done(d);
        });
  };
  tree.add_file(root, "tracing_cpumask", kModeReadWrite,
                make_text_file(
                    [this] {
                      std::lock_guard l(mu_);
                      return cpumask_.text();
                    },
                    [this](const Request&, std::string_view d) { return write_cpumask(d); }));
  tree.add_file(root, "set_event_pid", kModeReadWrite, pid_file(&SettingsFiles::event_pids_));
  tree.add_file(root, "set_event_notrace_pid", kModeReadWrite,
                pid_file(&SettingsFiles::notrace_pids_));
  tree.add_file(root, "buffer_percent", kModeReadWrite,
                number(&SettingsFiles::buffer_percent_, 100, 1));
  tree.add_file(root, "timestamp_mode", kModeRead,
                make_text_file([] { return std::string("[delta] absolute\n"); }));
  tree.add_file(root, "free_buffer", kModeWriteOwner, std::make_shared<FreeBufferFile>());
  if (instance) return;
  // Written in microseconds, kept (and read back) as the kernel keeps it: times 1000, in
  // 64 bits.
  tree.add_file(root, "tracing_thresh", kModeReadWrite,
                number(&SettingsFiles::thresh_ns_, UINT64_MAX, 1000));
  tree.add_file(root, "printk_formats", kModeRead, make_text_file([] { return std::string(); }));
  // instances/ is fs/instances.h's.
}

}  // namespace probefs::fs
