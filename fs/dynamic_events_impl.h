// The state behind DynamicEvents (fs/dynamic_events.h), shared by its two halves:
// fs/dynamic_events.cc (the definition files, profiles, error_log, the events' life) and
// fs/event_files.cc (events/ and what shows or steers the events: enable, filter, trigger,
// format, id, available_events, set_event). Not for other users.
//
// Threads: `mu` guards every probe and event and the tree nodes of events/. Calls into the
// tracer are made with `mu` held (the tracer has its own lock, and never calls back into
// fs with it held). The trace readers never take `mu`: what the triggers change at the
// hit lives in the tracer's control page (fs/event_triggers.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "events/compile.h"
#include "events/definition.h"
#include "events/errors.h"
#include "events/filter.h"
#include "events/synthetic.h"
#include "fs/dynamic_events.h"
#include "fs/error_log.h"
#include "fs/event_triggers.h"
#include "fs/hist_trigger.h"
#include "fs/tracefs.h"
#include "fs/vfs.h"
#include "tracee/tracer.h"

namespace probefs::fs {

// Which definition file: its syntax, its removals and its truncation.
enum class DefinitionFile : uint8_t { kKprobe, kUprobe, kDynamic };

struct DynEvent;

// One histogram: its tables in the targets (a tracer slot). A named one is shared by the
// hist triggers of that name on every event; it goes with the last of them.
struct HistData {
  tracee::Tracer* tracer = nullptr;
  uint32_t slot = 0;
  std::string name;
  bool paused = false;
  HistData() = default;
  HistData(const HistData&) = delete;
  HistData& operator=(const HistData&) = delete;
  ~HistData() {
    if (tracer) tracer->destroy_hist(slot);
  }
};

// One hist trigger of an event.
struct HistTrigger {
  HistSpec spec;
  std::shared_ptr<HistData> data;
  std::shared_ptr<const events::CompiledFilter> filter;  // the trigger's `if`
  // What its hits run: keys and values, and the variables, references (to other
  // histograms' slots) and action resolved when it was added (compile_hist).
  events::HistProgram program;
  // The buffer whose hist and trigger files show it (0: the top level's; an instance's
  // only on events/ftrace/print).
  uint32_t buffer = 0;
};

// One line of a definition file: one probe in the tracer.
struct DynProbe {
  events::ProbeDefinition def;  // as written: read back, profiles, removal
  std::string file;             // uprobe syntax: PATH resolved at definition (the writer's cwd)
  tracee::ProbeId id = 0;
  DynEvent* event = nullptr;
  uint64_t seq = 0;  // definition order across probes and synthetic events
};

// One event (GROUP/NAME) and its probes.
struct DynEvent {
  std::string group;
  std::string name;
  events::ProbeSyntax syntax = events::ProbeSyntax::kUprobe;
  bool fprobe = false;  // its probes are `f` lines (events::ProbeDefinition::fprobe)
  uint16_t id = 0;
  events::CompiledEvent compiled;  // the first probe's: the fields, the format file
  std::vector<DynProbe*> probes;   // definition order
  // Its probes are enabled in the tracer: by `enable`, or by soft mode (the kernel's
  // EVENT_FILE_FL_ENABLED).
  bool registered = false;
  // The instances' buffers it is enabled in (bit b: buffer b; tracee::Tracer's "Buffers"):
  // its probes are enabled in the tracer while it is registered or enabled in one.
  uint32_t instance_on = 0;
  // The triggers that hold it in soft mode, by buffer: its own in that buffer, and the
  // enable_event / disable_event triggers of that buffer that target it (hist triggers
  // hold it apart: `hists`).
  int soft_refs[events::kRingMaxBuffers] = {};
  std::shared_ptr<const events::CompiledFilter> filter;
  std::string filter_text = "none\n";  // what its filter file reads
  // Its filters in the instances' buffers, by buffer (none: no entry).
  struct InstanceFilter {
    std::shared_ptr<const events::CompiledFilter> filter;
    std::string text;
  };
  std::map<uint32_t, InstanceFilter> instance_filters;
  std::vector<Trigger> triggers;  // newest first, as the trigger file lists them
  std::vector<HistTrigger> hists;  // in the order they were added
  bool removed = false;  // files still open on a removed event find this
  // A synthetic event (events/synthetic.h): no probes; defined by synthetic_events or
  // `s:` in dynamic_events, and lives until removed there.
  bool synthetic = false;
  events::SynthEvent synth;
  // events/ftrace/print (fs/marker_event.cc): trace_marker's records as an event whose
  // triggers and histograms the daemon runs at each write. Not in `events`: it has no
  // probes, no enable or filter file, and is not in available_events or set_event.
  bool marker = false;
  uint64_t seq = 0;
};

struct DynamicEvents::Impl {
  explicit Impl(Tracefs& f);

  Tracefs& fs;
  tracee::Tracer& tracer;
  Tree& tree;
  ErrorLog error_log;

  std::mutex mu;
  std::vector<std::unique_ptr<DynProbe>> probes;  // definition order
  std::vector<std::shared_ptr<DynEvent>> events;  // creation order
  std::shared_ptr<DynEvent> marker;               // events/ftrace/print
  // Whether the marker has a trigger or histogram in buffer b (bit b): a trace_marker
  // write looks no further while its buffer's bit is clear.
  std::atomic<uint32_t> marker_armed{0};
  uint64_t next_seq = 1;
  NodePtr events_dir;
  // The instances' events/ directories, by buffer (fs/instances.h).
  std::map<uint32_t, NodePtr> instance_events;

  // ---- fs/dynamic_events.cc: the definition files and the events' life ----
  void add_root_files();
  std::string read_back(DefinitionFile which);
  int64_t write_definitions(DefinitionFile which, const Request& rq, std::string_view data);
  int truncate_definitions(DefinitionFile which);
  int define(const events::ProbeDefinition& def, pid_t writer);
  int remove(DefinitionFile which, const events::RemovalRequest& req);
  int remove_probe(DynProbe* p);
  void destroy_event(DynEvent* ev);
  // ---- synthetic events ----
  std::string synthetic_text();
  int64_t write_synthetic(std::string_view data);
  int truncate_synthetic();
  int truncate_synthetic_locked();
  int define_synthetic(const events::SynthEvent& se, const std::string& command);
  int remove_synthetic(std::string_view name);
  std::string uprobe_profile();
  std::string kprobe_profile();
  void clear_all();
  DynEvent* find_event(std::string_view group, std::string_view name);
  // The events a histogram may live on: `events` and the marker.
  std::vector<DynEvent*> hist_events();
  // find_event, the marker included (onmatch(ftrace.print)).
  DynEvent* find_hist_event(std::string_view group, std::string_view name);

  // ---- fs/marker_event.cc: events/ftrace/print's triggers and histograms ----
  void make_marker();
  // trigger and hist of the marker in `dir`, events/ftrace/print under `edir`, the
  // events/ of buffer `buffer`.
  void add_marker_files(uint32_t buffer, const NodePtr& edir, const NodePtr& dir);
  // A record trace_marker wrote into buffer `buffer`: its writer and text.
  void marker_hit(uint32_t buffer, pid_t tid, std::string_view comm, std::string_view text);
  // The synthetic events the daemon's histograms fired, written and counted (depth: the
  // chain so far, bounded as a target's).
  void emit_daemon_synths(const std::vector<events::HistFired>& fired, pid_t tid, int depth);
  void update_marker_armed();

  // ---- fs/event_files.cc: events/ and the files that show or steer the events ----
  void add_events_dir();
  // The event's directory and files (its group's directory with its first event); false
  // when a name is taken by something else in the tree.
  bool names_free(std::string_view group, std::string_view name);
  void add_event_nodes(const std::shared_ptr<DynEvent>& ev);
  void remove_event_nodes(const DynEvent& ev);
  void add_events_root(uint32_t buffer, const NodePtr& edir);
  void add_event_files(uint32_t buffer, const NodePtr& edir, const std::shared_ptr<DynEvent>& ev);
  // An instance's events/ (enable and filter files) and set_event, under its `dir`.
  void add_instance(uint32_t buffer, const NodePtr& dir);
  void remove_instance(uint32_t buffer);
  // Whether `edir` is still the events/ of buffer `buffer`'s instance (mu held): a file of
  // an instance removed since (its buffer maybe another instance's now) changes nothing.
  // The top level's (0) always is.
  bool instance_live(uint32_t buffer, const std::weak_ptr<Node>& edir) const;
  int register_event(DynEvent& ev);
  void unregister_event(DynEvent& ev);
  // The event records into buffer `buffer` from now on (the top level's: register_event),
  // or no longer.
  int turn_on(DynEvent& ev, uint32_t buffer);
  void turn_off(DynEvent& ev, uint32_t buffer);
  // The enable file, set_event and the group and top-level enables of buffer `buffer`
  // (0: the top level's). In soft mode there, only its soft-disabled bit follows.
  int set_buffer_enable(DynEvent& ev, uint32_t buffer, bool on);
  // Tells its probes which buffers their records go into (registered: the top level's).
  void tell_buffers(DynEvent& ev);
  static bool in_use(const DynEvent& ev) { return ev.registered || ev.instance_on != 0; }
  static bool enabled_in(const DynEvent& ev, uint32_t buffer) {
    return buffer == 0 ? ev.registered : ((ev.instance_on >> buffer) & 1) != 0;
  }
  int soft_on(DynEvent& ev, uint32_t buffer);
  void soft_off(DynEvent& ev, uint32_t buffer);
  std::string enable_text(const DynEvent& ev, uint32_t buffer);
  // In soft mode in a buffer: its probes run whether or not it is enabled there, and it
  // records there only while soft-enabled (Tracer::soft_disabled).
  static bool soft_mode(const DynEvent& ev, uint32_t buffer);
  static uint32_t soft_mask(const DynEvent& ev);  // bit b: soft_mode(ev, b)
  bool soft_disabled(const DynEvent& ev, uint32_t buffer = 0) const {
    return soft_mode(ev, buffer) && tracer.soft_disabled(ev.id, buffer);
  }
  // Drops ev's triggers (the event goes): their counts, and the soft mode they held.
  void drop_triggers(DynEvent& ev);
  // Drops ev's triggers and histograms of buffer `buffer` (its instance goes).
  void drop_buffer_triggers(DynEvent& ev, uint32_t buffer);
  // The event's filter in buffer `buffer` (0: the top level's, else an instance's).
  int set_filters(DynEvent& ev, std::shared_ptr<const events::CompiledFilter> f,
                  std::string text, uint32_t buffer = 0);
  int64_t write_filter(DynEvent& ev, std::string_view data, uint32_t buffer = 0,
                       const std::weak_ptr<Node>& instance = {});
  int64_t write_group_filter(const std::string& group, std::string_view data,
                             uint32_t buffer = 0, const std::weak_ptr<Node>& instance = {});
  std::string filter_text(const DynEvent& ev, uint32_t buffer) const;
  int64_t write_trigger(DynEvent& ev, std::string_view data, uint32_t buffer = 0);
  int compile_trigger_filter(const DynEvent& ev, std::string_view text,
                             std::shared_ptr<const events::CompiledFilter>* out);
  // ---- fs/event_hists.cc: hist triggers and the hist file ----
  std::map<std::string, std::weak_ptr<HistData>> named_hists;
  int64_t write_hist(DynEvent& ev, std::string_view data, uint32_t buffer = 0);
  // Resolves spec's variables, references and action against the events defined now;
  // 0, or a negative errno with *d set where the kernel logs an entry.
  int compile_hist(const DynEvent& ev, const HistSpec& spec, const std::string& command,
                   events::HistProgram* out, events::Diagnostic* d);
  // Whether another histogram reads a variable of the slot, or an action writes the
  // synthetic event: what may not go yet (EBUSY).
  bool slot_referenced(uint32_t slot, const HistTrigger* except);
  bool synth_referenced(uint16_t event_id);
  std::string trigger_text(const DynEvent& ev, uint32_t buffer = 0);
  std::string hist_text(const DynEvent& ev, uint32_t buffer = 0);
  // What the hits of the event's histograms run (of buffer `buffer`, or of all for -1).
  static std::vector<events::HistProgram> hit_programs(const DynEvent& ev, int buffer);
  // What the event's probes count, and whether they record: told to each probe.
  // Tells the event's probes (or its synthetic spec) what their hits run besides
  // recording: histograms, triggers, soft mode.
  void apply_hits(DynEvent& ev);
  // A histogram of the event's in `buffer` went: the soft mode they held there goes with
  // the last.
  void hists_gone(DynEvent& ev, uint32_t buffer);
  std::string available_events();
  // set_event of the top level, or of the instance whose events/ is `instance`.
  std::string set_event_text(uint32_t buffer = 0);
  int64_t write_set_event(std::string_view data, uint32_t buffer = 0,
                          const std::weak_ptr<Node>& instance = {});
  int clear_set_event(uint32_t buffer = 0, const std::weak_ptr<Node>& instance = {});
};

}  // namespace probefs::fs
