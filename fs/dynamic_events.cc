// The definition files (kprobe_events, uprobe_events, dynamic_events), the profiles and
// error_log, and the life of an event: defined with its first probe, gone with its last.
#include "fs/dynamic_events.h"

#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <optional>

#include "events/parse.h"
#include "fs/dynamic_events_impl.h"
#include "tracee/proc_info.h"

namespace probefs::fs {
namespace {

// A relative uprobe PATH names a file from the writer's working directory, as the
// kernel resolves it in the writing process; the daemon's own is "/".
std::string resolve_path(pid_t writer, const std::string& path) {
  if (path.empty() || path[0] == '/' || writer <= 0) return path;
  const std::string cwd = tracee::proc_link(writer, 0, "cwd");
  if (cwd.empty()) return path;
  return cwd == "/" ? "/" + path : cwd + "/" + path;
}

// fprobe events (`f` lines) are dynamic_events' alone, as in the kernel.
bool applies_to(DefinitionFile which, events::ProbeSyntax syntax, bool fprobe) {
  switch (which) {
    case DefinitionFile::kKprobe: return syntax == events::ProbeSyntax::kKprobe && !fprobe;
    case DefinitionFile::kUprobe: return syntax == events::ProbeSyntax::kUprobe;
    case DefinitionFile::kDynamic: return true;
  }
  return false;
}

events::ParseResult parse_line(DefinitionFile which, std::string_view line,
                               const events::ParseOptions& opts) {
  switch (which) {
    case DefinitionFile::kKprobe: return events::parse_kprobe_command(line, opts);
    case DefinitionFile::kUprobe: return events::parse_uprobe_command(line, opts);
    case DefinitionFile::kDynamic: return events::parse_dynamic_command(line, opts);
  }
  return {};
}

// The record layout does not depend on where a data symbol is (ProbeSpec): any address
// will do here; the tracer resolves `@SYM` in each target.
bool any_address(std::string_view, uint64_t* addr) {
  *addr = 0;
  return true;
}

}  // namespace

DynamicEvents::Impl::Impl(Tracefs& f)
    : fs(f),
      tracer(f.tracer()),
      tree(f.tree()) {
  make_marker();
}

// ---- the files at the top ------------------------------------------------------------------

void DynamicEvents::Impl::add_root_files() {
  NodePtr root = tree.root();
  // The kernel lists its tracefs root newest first; among the files of this part,
  // error_log comes before options (the trace files' part), the rest after everything.
  tree.add_file(root, "error_log", kModeReadWrite,
                make_text_file([this] { return error_log.text(); },
                               [](const Request&, std::string_view data) {
                                 return static_cast<int64_t>(data.size());
                               },
                               [this](const Request&) {
                                 error_log.clear();
                                 return 0;
                               }),
                "options");
  add_events_dir();
  tree.add_file(root, "uprobe_profile", kModeRead, make_text_file([this] {
                  return uprobe_profile();
                }));
  auto definitions = [this](DefinitionFile which) {
    return make_text_file(
        [this, which] { return read_back(which); },
        [this, which](const Request& rq, std::string_view data) {
          return write_definitions(which, rq, data);
        },
        [this, which](const Request&) { return truncate_definitions(which); });
  };
  tree.add_file(root, "uprobe_events", kModeReadWrite, definitions(DefinitionFile::kUprobe));
  tree.add_file(root, "kprobe_profile", kModeRead, make_text_file([this] {
                  return kprobe_profile();
                }));
  tree.add_file(root, "kprobe_events", kModeReadWrite, definitions(DefinitionFile::kKprobe));
  tree.add_file(root, "set_event", kModeReadWrite,
                make_text_file([this] { return set_event_text(); },
                               [this](const Request&, std::string_view data) {
                                 return write_set_event(data);
                               },
                               [this](const Request&) { return clear_set_event(); }));
  tree.add_file(root, "dynamic_events", kModeReadWrite,
                definitions(DefinitionFile::kDynamic));
  tree.add_file(root, "synthetic_events", kModeReadWrite,
                make_text_file([this] { return synthetic_text(); },
                               [this](const Request&, std::string_view data) {
                                 return write_synthetic(data);
                               },
                               [this](const Request&) { return truncate_synthetic(); }));
  tree.add_file(root, "available_events", kModeRead, make_text_file([this] {
                  return available_events();
                }));
}

// ---- reading and writing definitions -------------------------------------------------------

std::string DynamicEvents::Impl::read_back(DefinitionFile which) {
  std::lock_guard l(mu);
  // dynamic_events lists synthetic events too, each where it was defined among the probes.
  std::vector<std::pair<uint64_t, std::string>> lines;
  for (const auto& p : probes)
    if (applies_to(which, p->def.syntax, p->def.fprobe)) lines.emplace_back(p->seq, events::read_back(p->def));
  if (which == DefinitionFile::kDynamic)
    for (const auto& ev : events)
      if (ev->synthetic)
        lines.emplace_back(ev->seq, "s:" + std::string(events::kSynthSystem) + "/" +
                                        events::synthetic_description(ev->synth));
  std::sort(lines.begin(), lines.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& [seq, line] : lines) out += line + "\n";
  return out;
}

// Each write() is parsed by itself, line by line; the first bad line ends it with its
// errno (the lines before it stay applied), as the kernel's probes_write does.
int64_t DynamicEvents::Impl::write_definitions(DefinitionFile which, const Request& rq,
                                               std::string_view data) {
  bool too_long = false;
  std::vector<std::string> lines = events::split_write(data, &too_long);
  const pid_t writer = rq.pid;
  events::ParseOptions opts;
  opts.check_path = [writer](const std::string& path) -> std::optional<events::ErrorCode> {
    struct stat st;
    if (stat(resolve_path(writer, path).c_str(), &st) != 0)
      return events::ErrorCode::kFileNotFound;
    if (!S_ISREG(st.st_mode)) return events::ErrorCode::kNoRegularFile;
    return std::nullopt;
  };
  std::lock_guard l(mu);
  for (const std::string& line : lines) {
    if (which == DefinitionFile::kDynamic && events::is_synthetic_dynamic(line)) {
      const std::string text = line.substr(0, line.find('#'));
      const events::SynthResult r = events::parse_synthetic_dynamic(text);
      int err = 0;
      if (r.status == events::SynthStatus::kError) {
        if (r.error.logged()) error_log.add(r.error);
        err = -r.error.err;
      } else if (r.status == events::SynthStatus::kDefine) {
        err = define_synthetic(r.event, r.command);
      }
      if (err != 0) return err;
      continue;
    }
    events::ParseResult r = parse_line(which, line, opts);
    int err = 0;
    switch (r.status) {
      case events::ParseStatus::kEmpty: break;
      case events::ParseStatus::kNotMine:
      case events::ParseStatus::kError:
        error_log.add(r.error);
        err = -(r.error.err ? r.error.err : EINVAL);
        break;
      case events::ParseStatus::kRemove: err = remove(which, r.removal); break;
      case events::ParseStatus::kDefine: err = define(r.def, writer); break;
    }
    if (err != 0) return err;
  }
  if (too_long) return -EINVAL;
  return static_cast<int64_t>(data.size());
}

// Opening a definition file with O_TRUNC removes every event of its kind; while one of
// them is enabled it removes nothing and the open fails with EBUSY.
int DynamicEvents::Impl::truncate_definitions(DefinitionFile which) {
  std::lock_guard l(mu);
  for (const auto& ev : events)
    if ((ev->synthetic ? which == DefinitionFile::kDynamic : applies_to(which, ev->syntax, ev->fprobe)) &&
        in_use(*ev))
      return -EBUSY;
  std::vector<DynProbe*> doomed;
  for (const auto& p : probes)
    if (applies_to(which, p->def.syntax, p->def.fprobe)) doomed.push_back(p.get());
  for (DynProbe* p : doomed) (void)remove_probe(p);
  if (which == DefinitionFile::kDynamic) return truncate_synthetic_locked();
  return 0;
}

DynEvent* DynamicEvents::Impl::find_event(std::string_view group, std::string_view name) {
  for (const auto& ev : events)
    if (ev->group == group && ev->name == name) return ev.get();
  return nullptr;
}

std::vector<DynEvent*> DynamicEvents::Impl::hist_events() {
  std::vector<DynEvent*> all;
  all.reserve(events.size() + 1);
  for (const auto& ev : events) all.push_back(ev.get());
  all.push_back(marker.get());
  return all;
}

DynEvent* DynamicEvents::Impl::find_hist_event(std::string_view group, std::string_view name) {
  if (group == marker->group && name == marker->name) return marker.get();
  return find_event(group, name);
}

// A new probe: joins the event of its name (the kernel's checks, in its order), or makes
// a new event; then the tracer places it. A failure anywhere leaves nothing behind.
int DynamicEvents::Impl::define(const events::ProbeDefinition& def, pid_t writer) {
  auto fail = [this](const events::Diagnostic& d) {
    error_log.add(d);
    return -(d.err ? d.err : EINVAL);
  };
  DynEvent* ev = find_event(def.group, def.event);
  if (ev) {
    // An event of the other kind: the kernel finds no probe event of its own kind by that
    // name, and registering the name fails.
    if (ev->synthetic || ev->syntax != def.syntax || ev->fprobe != def.fprobe)
      return fail(events::make_diagnostic(def, events::ErrorCode::kEventExist, 0, 0));
    for (DynProbe* p : ev->probes) {
      events::Diagnostic d = events::check_append(p->def, def);
      if (!d.ok()) return fail(d);
    }
  } else if (!names_free(def.group, def.event)) {
    return fail(events::make_diagnostic(def, events::ErrorCode::kEventExist, 0, 0));
  }
  events::CompiledEvent compiled;
  events::Diagnostic d;
  if (!events::compile(def, any_address, &compiled, &d)) return fail(d);

  std::shared_ptr<DynEvent> created;
  if (!ev) {
    created = std::make_shared<DynEvent>();
    created->group = def.group;
    created->name = def.event;
    created->syntax = def.syntax;
    created->fprobe = def.fprobe;
    created->compiled = compiled;
    created->id = fs.events().allocate_id();
    if (created->id == 0) return -ENOSPC;
    auto view = std::make_shared<EventView>();
    view->id = created->id;
    view->system = def.group;
    view->name = def.event;
    view->compiled = compiled;
    view->kprobe_style = def.syntax == events::ProbeSyntax::kKprobe;
    fs.events().publish(std::move(view));
    tracer.clear_soft_disabled(created->id);  // an id used before may have left it set
    ev = created.get();
  }

  tracee::ProbeSpec spec;
  spec.def = def;
  if (def.syntax == events::ProbeSyntax::kUprobe) spec.def.path = resolve_path(writer, def.path);
  spec.compiled = std::move(compiled);
  spec.event_id = ev->id;
  spec.enabled = in_use(*ev);
  spec.buffers = (ev->registered ? 1u : 0u) | ev->instance_on;
  if (spec.buffers == 0) spec.buffers = 1;  // told again before it is enabled
  spec.filter = ev->filter;
  for (const auto& [buffer, f] : ev->instance_filters) {
    if (!f.filter) continue;
    if (spec.instance_filters.size() <= buffer) spec.instance_filters.resize(buffer + 1u);
    spec.instance_filters[buffer] = f.filter;
  }
  tracee::ProbeId id = 0;
  events::Diagnostic reg;
  if (int err = tracer.define_probe(spec, &id, &reg); err != 0) {
    if (created) {
      fs.events().unpublish(created->id);
      fs.events().release_id(created->id);
    }
    error_log.add(reg);
    return err;
  }
  auto p = std::make_unique<DynProbe>();
  p->def = def;
  if (def.syntax == events::ProbeSyntax::kUprobe) p->file = spec.def.path;
  p->id = id;
  p->event = ev;
  p->seq = next_seq++;
  ev->probes.push_back(p.get());
  probes.push_back(std::move(p));
  if (!ev->hists.empty()) apply_hits(*ev);
  if (created) {
    events.push_back(created);
    add_event_nodes(created);
  }
  return 0;
}

// `-:[GRP/][EVENT] [place args]`: every matching probe of this file's kind, in definition
// order, each as the kernel frees it: a probe with siblings goes, the last probe of an
// enabled event is EBUSY and ends the removal (what went before stays removed).
int DynamicEvents::Impl::remove(DefinitionFile which, const events::RemovalRequest& req) {
  std::vector<DynProbe*> matched;
  for (const auto& p : probes)
    if (applies_to(which, p->def.syntax, p->def.fprobe) && events::removal_matches(req, p->def))
      matched.push_back(p.get());
  int err = -ENOENT;
  for (DynProbe* p : matched) {
    err = remove_probe(p);
    if (err != 0) break;
  }
  // A synthetic event matches by its name, in its group or in none.
  if (which == DefinitionFile::kDynamic && err == -ENOENT && !req.event.empty() &&
      (!req.has_group || req.group == events::kSynthSystem))
    if (DynEvent* ev = find_event(events::kSynthSystem, req.event); ev && ev->synthetic)
      err = remove_synthetic(req.event);
  return err;
}

// ---- synthetic events ------------------------------------------------------------------------

std::string DynamicEvents::Impl::synthetic_text() {
  std::lock_guard l(mu);
  std::string out;
  for (const auto& ev : events)
    if (ev->synthetic) out += events::synthetic_description(ev->synth) + "\n";
  return out;
}

// Each line by itself, as the kernel's trace_parse_run_command: the first bad one ends
// the write with its errno.
int64_t DynamicEvents::Impl::write_synthetic(std::string_view data) {
  bool too_long = false;
  const std::vector<std::string> lines = events::split_write(data, &too_long);
  std::lock_guard l(mu);
  for (const std::string& line : lines) {
    const std::string text = line.substr(0, line.find('#'));
    const events::SynthResult r = events::parse_synthetic_command(text);
    int err = 0;
    switch (r.status) {
      case events::SynthStatus::kEmpty: break;
      case events::SynthStatus::kError:
        if (r.error.logged()) error_log.add(r.error);
        err = -r.error.err;
        break;
      case events::SynthStatus::kRemove: err = remove_synthetic(r.remove); break;
      case events::SynthStatus::kDefine: err = define_synthetic(r.event, r.command); break;
    }
    if (err != 0) return err;
  }
  if (too_long) return -EINVAL;
  return static_cast<int64_t>(data.size());
}

int DynamicEvents::Impl::truncate_synthetic() {
  std::lock_guard l(mu);
  return truncate_synthetic_locked();
}

// Every synthetic event goes, or (one is enabled) none does: EBUSY.
int DynamicEvents::Impl::truncate_synthetic_locked() {
  for (const auto& ev : events)
    if (ev->synthetic && (in_use(*ev) || synth_referenced(ev->id))) return -EBUSY;
  std::vector<DynEvent*> doomed;
  for (const auto& ev : events)
    if (ev->synthetic) doomed.push_back(ev.get());
  for (DynEvent* ev : doomed) destroy_event(ev);
  return 0;
}

int DynamicEvents::Impl::define_synthetic(const events::SynthEvent& se,
                                          const std::string& command) {
  if (DynEvent* old = find_event(events::kSynthSystem, se.name); old && old->synthetic) {
    events::Diagnostic d;
    d.code = events::ErrorCode::kSynthEventExists;
    d.err = EEXIST;
    d.command = command;
    d.subsystem = events::kLogSynth;
    const size_t at = command.find(se.name);
    d.pos = at == std::string::npos ? 0 : static_cast<int>(at);
    error_log.add(d);
    return -EEXIST;
  }
  // A probe event of that group and name holds it: the kernel's registration fails.
  if (!names_free(events::kSynthSystem, se.name)) return -EEXIST;
  auto ev = std::make_shared<DynEvent>();
  ev->group = std::string(events::kSynthSystem);
  ev->name = se.name;
  ev->syntax = events::ProbeSyntax::kKprobe;
  ev->synthetic = true;
  ev->synth = se;
  ev->compiled = events::synthetic_compiled(se);
  ev->seq = next_seq++;
  ev->id = fs.events().allocate_id();
  if (ev->id == 0) return -ENOSPC;
  auto view = std::make_shared<EventView>();
  view->id = ev->id;
  view->system = ev->group;
  view->name = ev->name;
  view->compiled = ev->compiled;
  fs.events().publish(std::move(view));
  tracer.clear_soft_disabled(ev->id);
  events.push_back(ev);
  add_event_nodes(ev);
  return 0;
}

// `!NAME` (synthetic_events) or `-:[synthetic/]NAME` (dynamic_events): ENOENT when there
// is none, EBUSY while it is enabled.
int DynamicEvents::Impl::remove_synthetic(std::string_view name) {
  DynEvent* ev = find_event(events::kSynthSystem, name);
  if (!ev || !ev->synthetic) return -ENOENT;
  if (in_use(*ev) || synth_referenced(ev->id)) return -EBUSY;
  destroy_event(ev);
  return 0;
}

int DynamicEvents::Impl::remove_probe(DynProbe* p) {
  DynEvent* ev = p->event;
  if (ev->probes.size() == 1 && in_use(*ev)) return -EBUSY;
  if (int err = tracer.remove_probe(p->id); err != 0 && err != -ENOENT) return err;
  std::erase(ev->probes, p);
  std::erase_if(probes, [p](const std::unique_ptr<DynProbe>& q) { return q.get() == p; });
  if (ev->probes.empty()) destroy_event(ev);
  return 0;
}

// The event's last probe is gone: its triggers let their targets go, and its id, view
// and files go.
void DynamicEvents::Impl::destroy_event(DynEvent* ev) {
  ev->hists.clear();  // their tables go with the last trigger that shares them
  drop_triggers(*ev);
  if (ev->synthetic) tracer.remove_synth(ev->id);
  fs.events().unpublish(ev->id);
  fs.events().release_id(ev->id);
  remove_event_nodes(*ev);
  ev->removed = true;
  std::erase_if(events, [ev](const std::shared_ptr<DynEvent>& e) { return e.get() == ev; });
}

// ---- profiles --------------------------------------------------------------------------------

// One line per uprobe-syntax probe: "  %s %-44s %15lu\n" (path as defined, event, hits).
std::string DynamicEvents::Impl::uprobe_profile() {
  std::lock_guard l(mu);
  std::string out;
  for (const auto& p : probes) {
    if (p->def.syntax != events::ProbeSyntax::kUprobe) continue;
    events::format_profile_line(out, p->def.path, p->event->name, tracer.profile(p->id).hits);
  }
  return out;
}

// One line per kprobe-syntax probe, as the kernel's kprobe_profile: event, hits, misses.
std::string DynamicEvents::Impl::kprobe_profile() {
  std::lock_guard l(mu);
  std::string out;
  for (const auto& p : probes) {
    if (p->def.syntax != events::ProbeSyntax::kKprobe || p->def.fprobe) continue;
    tracee::ProbeProfile prof = tracer.profile(p->id);
    char line[160];
    std::snprintf(line, sizeof line, "  %-44s %15lu %15lu\n", p->event->name.c_str(),
                  static_cast<unsigned long>(prof.hits), static_cast<unsigned long>(prof.misses));
    out += line;
  }
  return out;
}

// ---- the end ---------------------------------------------------------------------------------

void DynamicEvents::Impl::clear_all() {
  std::lock_guard l(mu);
  drop_triggers(*marker);
  marker->hists.clear();
  update_marker_armed();
  for (const auto& ev : events) drop_triggers(*ev);
  for (const auto& p : probes) (void)tracer.remove_probe(p->id);
  for (const auto& p : probes) p->event->probes.clear();
  probes.clear();
  for (const auto& ev : events) {
    ev->registered = false;
    ev->instance_on = 0;
    if (ev->synthetic) tracer.remove_synth(ev->id);
    fs.events().unpublish(ev->id);
    fs.events().release_id(ev->id);
    remove_event_nodes(*ev);
    ev->removed = true;
  }
  events.clear();
}

// ---- DynamicEvents -------------------------------------------------------------------------

DynamicEvents::DynamicEvents(Tracefs& fs) : impl_(std::make_unique<Impl>(fs)) {
  impl_->add_root_files();
}

DynamicEvents::~DynamicEvents() = default;

void DynamicEvents::clear_all() { impl_->clear_all(); }

void DynamicEvents::log_error(const events::Diagnostic& d) { impl_->error_log.add(d); }

void DynamicEvents::add_instance(uint32_t buffer, const NodePtr& dir) {
  impl_->add_instance(buffer, dir);
}

void DynamicEvents::remove_instance(uint32_t buffer) { impl_->remove_instance(buffer); }

}  // namespace probefs::fs
