// The kernel's trace options, two views of one state:
//   options/NAME   one file per option: "0\n" or "1\n"; takes 0 or 1 (kstrtoul, base 10)
//   trace_options  the instance's options, then its tracer's (nop's), one a line,
//                  "noNAME" when off, in the kernel's order; takes NAME or noNAME
//
// Every option the kernel's tracefs lists is here, with the kernel's default. The options
// that change what probefs does are bound to that state (bind()); the rest are stored and
// read back. Options of tracers other than the current one (function's, blk's) have files
// in options/ but are not in trace_options, which refuses them (as the kernel does, since
// only nop is ever current here).
//
// Two options keep the kernel's refusals: trace_printk_dest cannot be cleared on the top
// instance (the only one probefs has), and nop's test_nop_refuse refuses every change its
// tracer is asked for (a write to options/ that changes nothing does not ask it;
// trace_options always does).
//
// Threads: any. One lock orders every change and read; a bound option's own state is
// read and written under it, through its functions.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/vfs.h"

namespace probefs::fs {

class TraceOptions {
 public:
  TraceOptions();
  TraceOptions(const TraceOptions&) = delete;
  TraceOptions& operator=(const TraceOptions&) = delete;

  // From now on `name`'s value is what `get` says, and changes go to `set`. For the
  // kernel's option names only; the stored value is dropped.
  void bind(std::string_view name, std::function<bool()> get, std::function<void(bool)> set);

  // nullopt for a name that is not an option.
  std::optional<bool> get(std::string_view name) const;
  // As a write to options/NAME: 0, or -EINVAL (no such option, or a refused change).
  int set(std::string_view name, bool on);

  // trace_options: what it reads, and one write().
  std::string text() const;
  int64_t write(std::string_view data);

  // options/ (every option, in the kernel's readdir order) under `options_dir`, and
  // trace_options under `dir`.
  void add_files(Tree& tree, const NodePtr& dir, const NodePtr& options_dir);

 private:
  enum class Owner : uint8_t { kInstance, kCurrentTracer, kOtherTracer };
  enum class Refuses : uint8_t { kNothing, kClearing, kEverything };
  struct Option {
    std::string_view name;
    Owner owner;
    Refuses refuses;
    bool on;  // the stored value, when not bound
    std::function<bool()> get;
    std::function<void(bool)> set;
  };

  Option* find(std::string_view name);
  const Option* find(std::string_view name) const;
  static bool value(const Option& o);
  // Sets `o`; `ask_always` asks the owner even when the value does not change (a
  // tracer's option named in trace_options).
  static int change(Option& o, bool on, bool ask_always);

  mutable std::mutex mu_;
  std::vector<Option> options_;  // the kernel's creation order: trace_options's order
};

}  // namespace probefs::fs
