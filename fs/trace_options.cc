#include "fs/trace_options.h"

#include <cctype>
#include <cerrno>

#include "events/kstrto.h"

namespace probefs::fs {
namespace {

// The kernel's trace_options takes a write of 63 bytes at most.
constexpr size_t kMaxWrite = 63;

std::string_view strip(std::string_view s) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

TraceOptions::TraceOptions() {
  struct Spec {
    std::string_view name;
    Owner owner;
    Refuses refuses;
    bool on;
  };
  constexpr Owner kInst = Owner::kInstance;
  constexpr Refuses kOk = Refuses::kNothing;
  // The kernel's options, its defaults, in the order it creates them: the instance's
  // (trace_options's order), then function's, nop's and blk's.
  static constexpr Spec kSpecs[] = {
      {"print-parent", kInst, kOk, true},       {"sym-offset", kInst, kOk, false},
      {"sym-addr", kInst, kOk, false},          {"verbose", kInst, kOk, false},
      {"raw", kInst, kOk, false},               {"hex", kInst, kOk, false},
      {"bin", kInst, kOk, false},               {"block", kInst, kOk, false},
      {"fields", kInst, kOk, false},            {"trace_printk", kInst, kOk, true},
      {"annotate", kInst, kOk, true},           {"userstacktrace", kInst, kOk, false},
      {"sym-userobj", kInst, kOk, false},       {"printk-msg-only", kInst, kOk, false},
      {"context-info", kInst, kOk, true},       {"latency-format", kInst, kOk, false},
      {"record-cmd", kInst, kOk, true},         {"record-tgid", kInst, kOk, false},
      {"overwrite", kInst, kOk, true},          {"disable_on_free", kInst, kOk, false},
      {"irq-info", kInst, kOk, true},           {"markers", kInst, kOk, true},
      {"event-fork", kInst, kOk, false},
      {"trace_printk_dest", kInst, Refuses::kClearing, true},
      {"copy_trace_marker", kInst, kOk, true},  {"pause-on-trace", kInst, kOk, false},
      {"hash-ptr", kInst, kOk, true},           {"function-trace", kInst, kOk, true},
      {"function-fork", kInst, kOk, false},     {"stacktrace", kInst, kOk, false},
      {"func_stack_trace", Owner::kOtherTracer, kOk, false},
      {"func-no-repeats", Owner::kOtherTracer, kOk, false},
      {"test_nop_accept", Owner::kCurrentTracer, kOk, false},
      {"test_nop_refuse", Owner::kCurrentTracer, Refuses::kEverything, false},
      {"blk_classic", Owner::kOtherTracer, kOk, false},
      {"blk_cgroup", Owner::kOtherTracer, kOk, false},
      {"blk_cgname", Owner::kOtherTracer, kOk, false},
  };
  for (const Spec& spec : kSpecs)
    options_.push_back(Option{spec.name, spec.owner, spec.refuses, spec.on, {}, {}});
}

TraceOptions::Option* TraceOptions::find(std::string_view name) {
  for (Option& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

const TraceOptions::Option* TraceOptions::find(std::string_view name) const {
  return const_cast<TraceOptions*>(this)->find(name);
}

bool TraceOptions::value(const Option& o) { return o.get ? o.get() : o.on; }

int TraceOptions::change(Option& o, bool on, bool ask_always) {
  if (!ask_always && value(o) == on) return 0;
  if (o.refuses == Refuses::kEverything || (o.refuses == Refuses::kClearing && !on))
    return -EINVAL;
  if (o.set) o.set(on);
  else o.on = on;
  return 0;
}

void TraceOptions::bind(std::string_view name, std::function<bool()> get,
                        std::function<void(bool)> set) {
  std::lock_guard l(mu_);
  if (Option* o = find(name)) {
    o->get = std::move(get);
    o->set = std::move(set);
  }
}

std::optional<bool> TraceOptions::get(std::string_view name) const {
  std::lock_guard l(mu_);
  const Option* o = find(name);
  if (!o) return std::nullopt;
  return value(*o);
}

int TraceOptions::set(std::string_view name, bool on) {
  std::lock_guard l(mu_);
  Option* o = find(name);
  return o ? change(*o, on, false) : -EINVAL;
}

std::string TraceOptions::text() const {
  std::lock_guard l(mu_);
  std::string out;
  for (const Option& o : options_) {
    if (o.owner == Owner::kOtherTracer) continue;
    if (!value(o)) out += "no";
    out += o.name;
    out += '\n';
  }
  return out;
}

// NAME or noNAME, blanks around it ignored: an option of the instance or of the current
// tracer (whose tracer is asked even when nothing changes); anything else is EINVAL.
int64_t TraceOptions::write(std::string_view data) {
  if (data.size() > kMaxWrite) return -EINVAL;
  std::string_view name = strip(data.substr(0, data.find('\0')));
  const bool on = name.substr(0, 2) != "no";
  if (!on) name.remove_prefix(2);
  std::lock_guard l(mu_);
  Option* o = find(name);
  if (!o || o->owner == Owner::kOtherTracer) return -EINVAL;
  if (int err = change(*o, on, o->owner == Owner::kCurrentTracer); err != 0) return err;
  return static_cast<int64_t>(data.size());
}

void TraceOptions::add_files(Tree& tree, const NodePtr& dir, const NodePtr& options_dir) {
  tree.add_file(dir, "trace_options", kModeReadWrite,
                make_text_file([this] { return text(); },
                               [this](const Request&, std::string_view d) { return write(d); }));
  // The kernel lists its newest files first: the reverse of the creation order.
  for (auto it = options_.rbegin(); it != options_.rend(); ++it) {
    const std::string name(it->name);
    auto show = [this, name] { return std::string(get(name).value_or(false) ? "1\n" : "0\n"); };
    auto store = [this, name](const Request&, std::string_view d) -> int64_t {
      uint64_t v;
      if (!events::kstrtoull(d, 10, &v) || v > 1) return -EINVAL;
      if (int err = set(name, v == 1); err != 0) return err;
      return static_cast<int64_t>(d.size());
    };
    tree.add_file(options_dir, name, kModeReadWrite, make_text_file(show, store));
  }
}

}  // namespace probefs::fs
