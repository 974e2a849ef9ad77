// events/ and the files that show or steer the dynamic events: per event enable, filter,
// trigger, format and id; per group enable and filter; events/enable, header_page and
// header_event; available_events and set_event. events/ftrace/ holds the kernel's own
// events beside them (fs/ftrace_events.cc).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>

#include "events/kstrto.h"
#include "fs/dynamic_events_impl.h"

namespace probefs::fs {
namespace {

// The kernel reads these files' writes into a page at most.
constexpr size_t kMaxWrite = 4096;

// What the kernel's events/header_page and events/header_event read: its ring buffer's
// page and entry headers. probefs's own records have no such headers; tools read these
// to parse the raw buffers, per_cpu/cpuN/trace_pipe_raw, whose pages have this layout.
// The data's size is the sub-buffer's (buffer_subbuf_size_kb) less the 16 bytes before it.
std::string header_page(uint32_t subbuf_bytes) {
  return "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
         "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
         "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
         "\tfield: char data;\toffset:16;\tsize:" +
         std::to_string(subbuf_bytes - 16) + ";\tsigned:0;\n";
}
constexpr std::string_view kHeaderEvent =
    "# compressed entry header\n"
    "\ttype_len    :    5 bits\n"
    "\ttime_delta  :   27 bits\n"
    "\tarray       :   32 bits\n"
    "\n"
    "\tpadding     : type == 29\n"
    "\ttime_extend : type == 30\n"
    "\ttime_stamp : type == 31\n"
    "\tdata max type_len  == 28\n";

constexpr std::string_view kGroupFilterBanner =
    "### global filter ###\n"
    "# Use this to set filters for multiple events.\n"
    "# Only events with the given fields will be affected.\n"
    "# If no events are modified, an error message will be displayed here\n";

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

// An enable file's value: kstrtoul in base 10 (one trailing newline, nothing else), 0 or 1.
bool parse_enable(std::string_view data, bool* on) {
  uint64_t v;
  if (!events::kstrtoull(data, 10, &v) || v > 1) return false;
  *on = v == 1;
  return true;
}

int64_t done(std::string_view data) { return static_cast<int64_t>(data.size()); }

// A group's (or, for no group, every event's) enable: "0", "1", "X" when mixed, and the
// kernel's "?" when there is no event at all.
std::string aggregate_enable(const std::vector<std::shared_ptr<DynEvent>>& events,
                             std::optional<std::string_view> group, uint32_t buffer = 0) {
  int set = 0;
  for (const auto& ev : events)
    if (!group || ev->group == *group)
      set |= 1 << (DynamicEvents::Impl::enabled_in(*ev, buffer) ? 1 : 0);
  return std::string(1, "?01X"[set]) + "\n";
}

}  // namespace

// ---- the tree ----------------------------------------------------------------------------

void DynamicEvents::Impl::add_events_dir() {
  events_dir = tree.mkdir(tree.root(), "events", kModeDir);
  add_events_root(0, events_dir);
}

// events/ of buffer `buffer` (0: the top level's): its enable, the headers, ftrace/.
void DynamicEvents::Impl::add_events_root(uint32_t buffer, const NodePtr& edir) {
  tree.add_file(edir, "enable", kModeReadWrite,
                make_text_file(
                    [this, buffer] {
                      std::lock_guard l(mu);
                      return aggregate_enable(events, {}, buffer);
                    },
                    [this, buffer, self = std::weak_ptr<Node>(edir)](
                        const Request&, std::string_view data) -> int64_t {
                      bool on;
                      if (!parse_enable(data, &on)) return -EINVAL;
                      std::lock_guard l(mu);
                      if (!instance_live(buffer, self)) return -ENODEV;
                      // With no event at all there is nothing to change: the reset every
                      // script writes first succeeds (a kernel's events/ is never empty).
                      int first = 0;
                      for (const auto& ev : events)
                        if (int err = set_buffer_enable(*ev, buffer, on); err != 0 && first == 0)
                          first = err;
                      return first != 0 ? first : done(data);
                    }));
  tree.add_file(edir, "header_page", kModeRead,
                make_text_file([this, buffer] { return header_page(fs.subbuf_bytes(buffer)); }));
  tree.add_file(edir, "header_event", kModeRead,
                make_text_file([] { return std::string(kHeaderEvent); }));
  add_ftrace_events(tree, edir,
                    [&](const NodePtr& dir) { add_marker_files(buffer, edir, dir); });
}

bool DynamicEvents::Impl::names_free(std::string_view group, std::string_view name) {
  NodePtr gdir = tree.lookup(events_dir, group);
  if (!gdir) return group != "." && group != "..";
  return gdir->is_dir() && !tree.lookup(gdir, name);
}

void DynamicEvents::Impl::add_event_nodes(const std::shared_ptr<DynEvent>& ev) {
  add_event_files(0, events_dir, ev);
  for (const auto& [buffer, dir] : instance_events) add_event_files(buffer, dir, ev);
}

// The directories and files of `ev` under `edir`, the events/ of buffer `buffer`: its
// group's (with its first event: filter, enable) and its own (enable, filter, trigger,
// hist, format, id). The files of an instance removed since change nothing
// (instance_live).
void DynamicEvents::Impl::add_event_files(uint32_t buffer, const NodePtr& edir,
                                          const std::shared_ptr<DynEvent>& ev) {
  const std::weak_ptr<Node> self = edir;
  NodePtr gdir = tree.lookup(edir, ev->group);
  if (!gdir) {
    // A group's directory: filter, enable, then its events oldest first.
    gdir = tree.mkdir(edir, ev->group, kModeDir);
    const std::string group = ev->group;
    tree.add_file(gdir, "filter", kModeReadWrite,
                  make_text_file([] { return std::string(kGroupFilterBanner); },
                                 [this, group, buffer, self](const Request&, std::string_view data) {
                                   return write_group_filter(group, data, buffer, self);
                                 }));
    tree.add_file(
        gdir, "enable", kModeReadWrite,
        make_text_file(
            [this, group, buffer] {
              std::lock_guard l(mu);
              return aggregate_enable(events, group, buffer);
            },
            [this, group, buffer, self](const Request&, std::string_view data) -> int64_t {
              bool on;
              if (!parse_enable(data, &on)) return -EINVAL;
              std::lock_guard l(mu);
              if (!instance_live(buffer, self)) return -ENODEV;
              bool any = false;
              int first = 0;
              for (const auto& e : events) {
                if (e->group != group) continue;
                any = true;
                if (int err = set_buffer_enable(*e, buffer, on); err != 0 && first == 0)
                  first = err;
              }
              if (!any) return -EINVAL;
              return first != 0 ? first : done(data);
            }));
  }
  NodePtr dir = tree.mkdir(gdir, ev->name, kModeDir);
  tree.add_file(dir, "enable", kModeReadWrite,
                make_text_file(
                    [this, ev, buffer] {
                      std::lock_guard l(mu);
                      if (ev->removed) return std::string();
                      return enable_text(*ev, buffer);
                    },
                    [this, ev, buffer, self](const Request&, std::string_view data) -> int64_t {
                      bool on;
                      if (!parse_enable(data, &on)) return -EINVAL;
                      std::lock_guard l(mu);
                      if (ev->removed || !instance_live(buffer, self)) return -ENODEV;
                      int err = set_buffer_enable(*ev, buffer, on);
                      return err != 0 ? err : done(data);
                    }));
  tree.add_file(dir, "filter", kModeReadWrite,
                make_text_file(
                    [this, ev, buffer] {
                      std::lock_guard l(mu);
                      return ev->removed ? std::string() : filter_text(*ev, buffer);
                    },
                    [this, ev, buffer, self](const Request&, std::string_view data) {
                      return write_filter(*ev, data, buffer, self);
                    }));
  tree.add_file(dir, "trigger", kModeReadWrite,
                make_text_file(
                    [this, ev, buffer] {
                      std::lock_guard l(mu);
                      return ev->removed ? std::string() : trigger_text(*ev, buffer);
                    },
                    [this, ev, buffer, self](const Request&, std::string_view data) -> int64_t {
                      {
                        std::lock_guard l(mu);
                        if (!instance_live(buffer, self)) return -ENODEV;
                      }
                      return write_trigger(*ev, data, buffer);
                    }));
  tree.add_file(dir, "hist", kModeRead, make_text_file([this, ev, buffer] {
                  std::lock_guard l(mu);
                  return ev->removed ? std::string() : hist_text(*ev, buffer);
                }));
  tree.add_file(dir, "format", kModeRead, make_text_file([ev] {
                  return events::format_file(ev->compiled, ev->id);
                }));
  tree.add_file(dir, "id", kModeRead,
                make_text_file([ev] { return std::to_string(ev->id) + "\n"; }));
}

namespace {

void remove_event_node(Tree& tree, const NodePtr& events_dir, const DynEvent& ev) {
  NodePtr gdir = tree.lookup(events_dir, ev.group);
  if (!gdir) return;
  tree.remove(gdir, ev.name);
  for (const NodePtr& c : tree.children(gdir))
    if (c->is_dir()) return;
  tree.remove(events_dir, ev.group);
}

}  // namespace

void DynamicEvents::Impl::remove_event_nodes(const DynEvent& ev) {
  remove_event_node(tree, events_dir, ev);
  for (const auto& [buffer, dir] : instance_events) remove_event_node(tree, dir, ev);
}

// ---- instances ---------------------------------------------------------------------------

// An instance's events/: the top-level enable, the headers and ftrace/ as the top level's;
// per group and per event the enable files of this instance's buffer, and each event's
// format and id. mu held.
void DynamicEvents::Impl::add_instance(uint32_t buffer, const NodePtr& dir) {
  NodePtr edir = tree.mkdir(dir, "events", kModeDir);
  add_events_root(buffer, edir);
  std::lock_guard l(mu);
  instance_events[buffer] = edir;
  for (const auto& ev : events) add_event_files(buffer, edir, ev);
  tree.add_file(dir, "set_event", kModeReadWrite,
                make_text_file([this, buffer] { return set_event_text(buffer); },
                               [this, buffer, self = std::weak_ptr<Node>(edir)](
                                   const Request&, std::string_view data) -> int64_t {
                                 return write_set_event(data, buffer, self);
                               },
                               [this, buffer, self = std::weak_ptr<Node>(edir)](const Request&) {
                                 return clear_set_event(buffer, self);
                               }));
}

bool DynamicEvents::Impl::instance_live(uint32_t buffer, const std::weak_ptr<Node>& edir) const {
  if (buffer == 0) return true;
  auto it = instance_events.find(buffer);
  return it != instance_events.end() && it->second == edir.lock();
}

// The instance goes: its events are disabled in its buffer; its files go with its
// directory (the caller's). Its files still open change nothing from here (instance_live).
void DynamicEvents::Impl::remove_instance(uint32_t buffer) {
  std::lock_guard l(mu);
  // Triggers first (of every event: an enable_event there holds its target in soft mode
  // there), then what is left enabled there.
  drop_buffer_triggers(*marker, buffer);
  for (const auto& ev : events) drop_buffer_triggers(*ev, buffer);
  for (const auto& ev : events) {
    (void)set_buffer_enable(*ev, buffer, false);
    if (ev->instance_filters.count(buffer)) (void)set_filters(*ev, nullptr, "none\n", buffer);
    tracer.set_soft_disabled(ev->id, false, buffer);
  }
  instance_events.erase(buffer);
}

// ---- enable ----------------------------------------------------------------------------------

namespace {

// A uprobe-syntax probe whose offset lies past the end of its file: the kernel's
// uprobe_register() refuses it ("just to catch the obvious mistakes"), so enabling its
// event is EINVAL. A file gone since the definition is not refused here (the kernel holds
// the file it found at definition).
bool past_end_of_file(const DynProbe& p) {
  if (p.def.syntax != events::ProbeSyntax::kUprobe) return false;
  struct stat st;
  return stat(p.file.c_str(), &st) == 0 && p.def.offset > static_cast<uint64_t>(st.st_size);
}

}  // namespace

namespace {

// Enables ev's probes in the tracer, all or none.
int enable_probes(tracee::Tracer& tracer, DynEvent& ev) {
  for (const DynProbe* p : ev.probes)
    if (past_end_of_file(*p)) return -EINVAL;
  for (size_t i = 0; i < ev.probes.size(); ++i) {
    if (int err = tracer.enable_probe(ev.probes[i]->id); err != 0) {
      for (size_t j = 0; j < i; ++j) (void)tracer.disable_probe(ev.probes[j]->id);
      return err;
    }
  }
  return 0;
}

void disable_probes(tracee::Tracer& tracer, DynEvent& ev) {
  for (DynProbe* p : ev.probes) (void)tracer.disable_probe(p->id);
}

}  // namespace

void DynamicEvents::Impl::tell_buffers(DynEvent& ev) {
  const uint32_t buffers = (ev.registered ? 1u : 0u) | ev.instance_on;
  for (DynProbe* p : ev.probes) (void)tracer.set_probe_buffers(p->id, buffers);
}

// The top level wants the event's records (enable, or soft mode). The probes learn where
// their records go before they are enabled.
int DynamicEvents::Impl::register_event(DynEvent& ev) {
  ev.registered = true;
  tell_buffers(ev);
  if (ev.instance_on == 0) {
    if (int err = enable_probes(tracer, ev); err != 0) {
      ev.registered = false;
      return err;
    }
  }
  if (ev.synthetic) apply_hits(ev);  // its records are written from now
  return 0;
}

void DynamicEvents::Impl::unregister_event(DynEvent& ev) {
  ev.registered = false;
  // Enabled in an instance still: the probes stay, and record there alone. (A disabled
  // probe's buffers mean nothing: they are told again before it is enabled.)
  if (ev.instance_on != 0) tell_buffers(ev);
  else disable_probes(tracer, ev);
  if (ev.synthetic) apply_hits(ev);
}

int DynamicEvents::Impl::turn_on(DynEvent& ev, uint32_t buffer) {
  if (buffer == 0) return ev.registered ? 0 : register_event(ev);
  const uint32_t bit = 1u << buffer;
  if (ev.instance_on & bit) return 0;
  const bool was_on = in_use(ev);
  ev.instance_on |= bit;
  tell_buffers(ev);
  if (!was_on) {
    if (int err = enable_probes(tracer, ev); err != 0) {
      ev.instance_on &= ~bit;
      return err;
    }
  }
  return 0;
}

void DynamicEvents::Impl::turn_off(DynEvent& ev, uint32_t buffer) {
  if (buffer == 0) {
    if (ev.registered) unregister_event(ev);
    return;
  }
  const uint32_t bit = 1u << buffer;
  if (!(ev.instance_on & bit)) return;
  ev.instance_on &= ~bit;
  if (in_use(ev)) tell_buffers(ev);
  else disable_probes(tracer, ev);
}

// In soft mode (the event has triggers in the buffer, or a trigger there targets it) the
// probes stay enabled and only the soft-disabled bit follows, as in the kernel.
int DynamicEvents::Impl::set_buffer_enable(DynEvent& ev, uint32_t buffer, bool on) {
  if (buffer >= events::kRingMaxBuffers) return -EINVAL;
  if (on) {
    tracer.set_soft_disabled(ev.id, false, buffer);
    if (ev.synthetic) apply_hits(ev);
    return turn_on(ev, buffer);
  }
  if (soft_mode(ev, buffer)) {
    tracer.set_soft_disabled(ev.id, true, buffer);
    if (ev.synthetic) apply_hits(ev);
    return 0;
  }
  turn_off(ev, buffer);
  tracer.set_soft_disabled(ev.id, false, buffer);
  return 0;
}

bool DynamicEvents::Impl::soft_mode(const DynEvent& ev, uint32_t buffer) {
  if (buffer >= events::kRingMaxBuffers) return false;
  if (ev.soft_refs[buffer] > 0) return true;
  for (const HistTrigger& t : ev.hists)
    if (t.buffer == buffer) return true;
  return false;
}

uint32_t DynamicEvents::Impl::soft_mask(const DynEvent& ev) {
  uint32_t mask = 0;
  for (uint32_t b = 0; b < events::kRingMaxBuffers; ++b)
    if (soft_mode(ev, b)) mask |= 1u << b;
  return mask;
}

// A trigger of buffer `buffer` now holds `ev` in soft mode there: its probes run, and an
// event that was off there stays off (soft-disabled) until a trigger or a write enables
// it. The probes learn of the soft mode and the triggers before they are enabled: their
// first hits obey.
int DynamicEvents::Impl::soft_on(DynEvent& ev, uint32_t buffer) {
  const bool was_soft = soft_mode(ev, buffer);
  ++ev.soft_refs[buffer];
  if (was_soft) return 0;
  const bool was_on = enabled_in(ev, buffer);
  if (!was_on) tracer.set_soft_disabled(ev.id, true, buffer);
  apply_hits(ev);
  if (was_on) return 0;
  if (int err = turn_on(ev, buffer); err != 0) {
    --ev.soft_refs[buffer];
    tracer.set_soft_disabled(ev.id, false, buffer);
    apply_hits(ev);
    return err;
  }
  return 0;
}

// A trigger that held `ev` in soft mode in `buffer` is gone: with the last, it leaves soft
// mode there, enabled if it was soft-enabled, else off.
void DynamicEvents::Impl::soft_off(DynEvent& ev, uint32_t buffer) {
  if (ev.soft_refs[buffer] == 0 || --ev.soft_refs[buffer] > 0 || soft_mode(ev, buffer)) return;
  if (tracer.soft_disabled(ev.id, buffer)) turn_off(ev, buffer);
  tracer.set_soft_disabled(ev.id, false, buffer);
  apply_hits(ev);
}

// "0" or "1", with '*' in soft mode: "0*" soft-disabled, "1*" soft-enabled.
std::string DynamicEvents::Impl::enable_text(const DynEvent& ev, uint32_t buffer) {
  const bool disabled = soft_disabled(ev, buffer);
  std::string s = enabled_in(ev, buffer) && !disabled ? "1" : "0";
  if (soft_mode(ev, buffer)) s += "*";
  return s + "\n";
}

// ---- filters -----------------------------------------------------------------------------------

namespace {

int set_probe_filters(tracee::Tracer& tracer, DynEvent& ev,
                      std::shared_ptr<const events::CompiledFilter> f, std::string text) {
  ev.filter = f;
  ev.filter_text = std::move(text);

  int first = 0;
  for (DynProbe* p : ev.probes)
    if (int err = tracer.set_filter(p->id, f); err != 0 && first == 0) first = err;
  return first;
}

}  // namespace

// The event's filter, in its probes; a synthetic event's runs where hist actions write it,
// told with the rest of what they need.
int DynamicEvents::Impl::set_filters(DynEvent& ev,
                                     std::shared_ptr<const events::CompiledFilter> f,
                                     std::string text, uint32_t buffer) {
  if (buffer != 0) {  // an instance's: its probes filter their records there
    int first = 0;
    for (DynProbe* p : ev.probes)
      if (int err = tracer.set_instance_filter(p->id, buffer, f); err != 0 && first == 0)
        first = err;
    if (f) ev.instance_filters[buffer] = {std::move(f), std::move(text)};
    else if (text == "none\n") ev.instance_filters.erase(buffer);
    else ev.instance_filters[buffer] = {nullptr, std::move(text)};
    return first;
  }
  const int err = set_probe_filters(tracer, ev, std::move(f), std::move(text));
  if (ev.synthetic) apply_hits(ev);
  return err;
}

// `0` clears; a filter that does not compile leaves the event unfiltered, its text and
// the error in the file, and an entry in error_log.
int64_t DynamicEvents::Impl::write_filter(DynEvent& ev, std::string_view data, uint32_t buffer,
                                          const std::weak_ptr<Node>& instance) {
  if (data.size() >= kMaxWrite) return -EINVAL;
  std::lock_guard l(mu);
  if (ev.removed || (buffer != 0 && !instance_live(buffer, instance))) return -ENODEV;
  if (trim(data) == "0") {
    int err = set_filters(ev, nullptr, "none\n", buffer);
    return err != 0 ? err : done(data);
  }
  events::CompiledFilter f;
  events::Diagnostic d;
  if (!events::compile_filter(data, ev.compiled, &f, &d)) {
    (void)set_filters(ev, nullptr, events::filter_error_text(d), buffer);
    error_log.add(d);
    return -(d.err ? d.err : EINVAL);
  }
  auto shared = std::make_shared<const events::CompiledFilter>(std::move(f));
  std::string text = shared->text + "\n";
  int err = set_filters(ev, std::move(shared), std::move(text), buffer);
  return err != 0 ? err : done(data);
}

std::string DynamicEvents::Impl::filter_text(const DynEvent& ev, uint32_t buffer) const {
  if (buffer == 0) return ev.filter_text;
  auto it = ev.instance_filters.find(buffer);
  return it == ev.instance_filters.end() ? "none\n" : it->second.text;
}

// A group filter goes to every event of the group that has its fields; the others get
// the kernel's subsystem error (in their filter file and in error_log) and no filter.
// The write itself succeeds either way, as the kernel's does.
int64_t DynamicEvents::Impl::write_group_filter(const std::string& group,
                                                std::string_view data, uint32_t buffer,
                                                const std::weak_ptr<Node>& instance) {
  if (data.size() >= kMaxWrite) return -EINVAL;
  std::lock_guard l(mu);
  if (buffer != 0 && !instance_live(buffer, instance)) return -ENODEV;
  const bool clear = trim(data) == "0";
  for (const auto& ev : events) {
    if (ev->group != group) continue;
    if (clear) {
      (void)set_filters(*ev, nullptr, "none\n", buffer);
      continue;
    }
    events::CompiledFilter f;
    events::Diagnostic d;
    if (events::compile_filter(data, ev->compiled, &f, &d)) {
      auto shared = std::make_shared<const events::CompiledFilter>(std::move(f));
      std::string text = shared->text + "\n";
      (void)set_filters(*ev, std::move(shared), std::move(text), buffer);
    } else {
      events::Diagnostic sub = events::subsystem_filter_error(data);
      (void)set_filters(*ev, nullptr, events::filter_error_text(sub), buffer);
      error_log.add(sub);
    }
  }
  return done(data);
}

// ---- triggers ----------------------------------------------------------------------------------

// A trigger's `if FILTER`, compiled against the event; one that does not compile is logged.
int DynamicEvents::Impl::compile_trigger_filter(const DynEvent& ev, std::string_view text,
                                                std::shared_ptr<const events::CompiledFilter>* out) {
  events::CompiledFilter f;
  events::Diagnostic d;
  if (!events::compile_filter(text, ev.compiled, &f, &d)) {
    error_log.add(d);
    return -(d.err ? d.err : EINVAL);
  }
  *out = std::make_shared<const events::CompiledFilter>(std::move(f));
  return 0;
}

int64_t DynamicEvents::Impl::write_trigger(DynEvent& ev, std::string_view data, uint32_t buffer) {
  if (data.size() >= kMaxWrite) return -EINVAL;
  {
    size_t i = 0;
    while (i < data.size() && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n')) ++i;
    if (i < data.size() && data[i] == '!') ++i;
    if (data.substr(i, 4) == "hist" &&
        (i + 4 == data.size() || data[i + 4] == ':' || data[i + 4] == ' ' ||
         data[i + 4] == '\t' || data[i + 4] == '\n'))
      return write_hist(ev, data, buffer);
  }
  TriggerCommand c;
  if (parse_trigger(data, &c) != 0) return -EINVAL;
  // The marker's are the daemon's to run: a stack is not one (the writer's is in another
  // process).
  if (ev.marker && c.kind == TriggerKind::kStackTrace) return -EINVAL;
  std::lock_guard l(mu);
  if (ev.removed) return -ENODEV;
  DynEvent* target = nullptr;
  if (c.kind == TriggerKind::kEnableEvent || c.kind == TriggerKind::kDisableEvent) {
    target = find_event(c.system, c.event);
    if (!target) return -EINVAL;
  }
  auto place = std::find_if(ev.triggers.begin(), ev.triggers.end(), [&](const Trigger& t) {
    return t.buffer == buffer && same_place(t, c.kind, target);
  });
  if (c.remove) {
    if (place == ev.triggers.end()) return done(data);
    const Trigger gone = *place;
    ev.triggers.erase(place);
    if (gone.count >= 0) tracer.destroy_trigger_count(gone.count_slot);
    apply_hits(ev);
    if (!ev.marker) soft_off(ev, buffer);
    if (gone.target) soft_off(*gone.target, buffer);
    update_marker_armed();
    return done(data);
  }
  std::shared_ptr<const events::CompiledFilter> filter;
  if (c.has_filter)
    if (int err = compile_trigger_filter(ev, c.filter, &filter); err != 0) return err;
  if (place != ev.triggers.end()) return -EEXIST;
  if (ev.triggers.size() >= events::kMaxHitTriggers) return -ENOSPC;
  Trigger t;
  t.kind = c.kind;
  t.count = c.count;
  t.has_filter = c.has_filter;
  t.filter_text = c.filter;
  t.filter = std::move(filter);
  t.buffer = buffer;
  if (t.count >= 0)
    if (int err = tracer.create_trigger_count(t.count, &t.count_slot); err != 0) return err;
  // The target first: in soft mode, so that the first hit of this trigger finds it so.
  if (target) {
    if (int err = soft_on(*target, buffer); err != 0) {
      if (t.count >= 0) tracer.destroy_trigger_count(t.count_slot);
      return err;
    }
    t.target = target;
    t.target_name = c.system + ":" + c.event;
  }
  ev.triggers.insert(ev.triggers.begin(), std::move(t));
  apply_hits(ev);
  if (int err = ev.marker ? 0 : soft_on(ev, buffer); err != 0) {
    const Trigger gone = ev.triggers.front();
    ev.triggers.erase(ev.triggers.begin());
    if (gone.count >= 0) tracer.destroy_trigger_count(gone.count_slot);
    apply_hits(ev);
    if (gone.target) soft_off(*gone.target, buffer);
    return err;
  }
  if (c.kind == TriggerKind::kSnapshot) fs.allocate_snapshot(buffer);
  update_marker_armed();
  return done(data);
}

void DynamicEvents::Impl::drop_triggers(DynEvent& ev) {
  std::vector<Trigger> gone = std::move(ev.triggers);
  ev.triggers.clear();
  for (const Trigger& t : gone) {
    if (t.count >= 0) tracer.destroy_trigger_count(t.count_slot);
    if (t.target && t.target != &ev) soft_off(*t.target, t.buffer);
  }
  for (int& n : ev.soft_refs) n = 0;
  // Triggers of other events that target it (none can while it is held: it cannot be
  // removed while enabled) let it go too.
  for (DynEvent* other : hist_events())
    for (Trigger& t : other->triggers)
      if (t.target == &ev) t.target = nullptr;
  if (!ev.marker) tracer.clear_soft_disabled(ev.id);
}

void DynamicEvents::Impl::drop_buffer_triggers(DynEvent& ev, uint32_t buffer) {
  std::vector<Trigger> gone;
  for (auto it = ev.triggers.begin(); it != ev.triggers.end();) {
    if (it->buffer != buffer) {
      ++it;
      continue;
    }
    gone.push_back(*it);
    it = ev.triggers.erase(it);
  }
  const bool had_hists = std::erase_if(ev.hists, [&](const HistTrigger& t) {
    return t.buffer == buffer;
  }) != 0;
  if (gone.empty() && !had_hists) return;
  apply_hits(ev);
  for (const Trigger& t : gone) {
    if (t.count >= 0) tracer.destroy_trigger_count(t.count_slot);
    if (!ev.marker) soft_off(ev, buffer);
    if (t.target) soft_off(*t.target, buffer);
  }
  if (had_hists) hists_gone(ev, buffer);
  update_marker_armed();
}

// ---- available_events and set_event ----------------------------------------------------------

// "GROUP:EVENT" lines, the newest event first (the kernel puts a new dynamic event at the
// top).
std::string DynamicEvents::Impl::available_events() {
  std::lock_guard l(mu);
  std::string out;
  for (auto it = events.rbegin(); it != events.rend(); ++it)
    out += (*it)->group + ":" + (*it)->name + "\n";
  return out;
}

// The enabled events (soft mode included, as the kernel counts them), in the same order.
std::string DynamicEvents::Impl::set_event_text(uint32_t buffer) {
  std::lock_guard l(mu);
  std::string out;
  for (auto it = events.rbegin(); it != events.rend(); ++it)
    if (enabled_in(**it, buffer)) out += (*it)->group + ":" + (*it)->name + "\n";
  return out;
}

// One word per write() (the caller writes the rest again): `[!]GROUP:EVENT`, `[!]EVENT`
// or `[!]GROUP` (a word alone matches an event or a group name), `GROUP:*`, `*:EVENT`,
// `*:*`; an empty or `*` part matches all. EINVAL when nothing matches, but for a word
// that names every event on a mount that has none.
int64_t DynamicEvents::Impl::write_set_event(std::string_view data, uint32_t buffer,
                                             const std::weak_ptr<Node>& instance) {
  size_t i = 0;
  while (i < data.size() && is_blank(data[i])) ++i;
  if (i == data.size()) return done(data);
  size_t start = i;
  while (i < data.size() && !is_blank(data[i])) ++i;
  std::string_view word = data.substr(start, i - start);
  const int64_t consumed = static_cast<int64_t>(i < data.size() ? i + 1 : i);
  // The kernel's parser holds a word of 127 bytes at most.
  if (word.size() > 127) return -EINVAL;
  const bool on = word[0] != '!';
  if (!on) word.remove_prefix(1);

  std::optional<std::string_view> match, group, name;
  size_t colon = word.find(':');
  if (colon == std::string_view::npos) {
    match = word;
  } else {
    group = word.substr(0, colon);
    name = word.substr(colon + 1);
    if (group->empty() || *group == "*") group.reset();
    if (name->empty() || *name == "*") name.reset();
  }
  std::lock_guard l(mu);
  if (buffer != 0 && !instance_live(buffer, instance)) return -ENODEV;
  bool any = false;
  int first = 0;
  for (const auto& ev : events) {
    if (match && *match != ev->name && *match != ev->group) continue;
    if (group && *group != ev->group) continue;
    if (name && *name != ev->name) continue;
    any = true;
    if (int err = set_buffer_enable(*ev, buffer, on); err != 0 && first == 0) first = err;
  }
  // Nothing matched: EINVAL, as the kernel's; but a word for every event (`*:*`, `:`,
  // `!*:*`) on a mount with none is the reset scripts write first, and succeeds.
  const bool every_event = !match && !group && !name;
  if (!any && !(every_event && events.empty())) return -EINVAL;
  return first != 0 ? first : consumed;
}

// set_event opened with O_TRUNC: every event off.
int DynamicEvents::Impl::clear_set_event(uint32_t buffer, const std::weak_ptr<Node>& instance) {
  std::lock_guard l(mu);
  if (buffer != 0 && !instance_live(buffer, instance)) return -ENODEV;
  for (const auto& ev : events) (void)set_buffer_enable(*ev, buffer, false);
  return 0;
}

}  // namespace probefs::fs
