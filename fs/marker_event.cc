// events/ftrace/print as an event with triggers and histograms: trace_marker's records.
//
// The kernel runs the print event's triggers on each trace_marker write, after the record
// is in the buffer (and only when it is: with tracing off the write fails and nothing
// runs). Here the daemon writes that record (fs/trace_files.cc), so the daemon runs them,
// in the writer's write() call: traceon and traceoff, snapshot, enable_event and
// disable_event, each with its count and filter; and hist
// triggers, counted into the daemon's own table of each histogram (Tracer::
// count_daemon_hists), which `hist` reads merged with the targets' tables. A histogram's
// action fires a synthetic event here as a target's does: its record goes into the
// buffers the event is enabled in, and its own histograms count it.
//
// Each buffer has its own print triggers (instances/NAME/events/ftrace/print/trigger):
// they run on that buffer's trace_marker writes and act on that buffer. A stacktrace
// trigger is refused: the stack the kernel takes is the writer's, in another process.
//
// The fields triggers and histograms see: ip (0: no kernel caller) and buf, the text as
// written (without the newline the record gets when it has none, as the kernel runs the
// triggers before it adds one). The format file keeps the kernel's layout (buf in
// place, fs/ftrace_events.cc); for the daemon's programs the record is laid out with buf
// as a __data_loc string, which is how filters and hist keys read strings.
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "events/synthetic.h"
#include "fs/dynamic_events_impl.h"

namespace probefs::fs {

namespace {

// The synthetic events language says what the marker's fields are, and gives their
// layout: ip at 8, buf's __data_loc at 16.
constexpr std::string_view kMarkerFields = "print u64 ip; char buf[]";
constexpr uint32_t kMarkerTextAt = 20;

// The most a synthetic event's record may take (a target's hit path keeps the same
// bound).
constexpr uint32_t kSynthRecordBytes = 1024;

}  // namespace

void DynamicEvents::Impl::make_marker() {
  marker = std::make_shared<DynEvent>();
  marker->group = "ftrace";
  marker->name = "print";
  marker->id = kPrintEventId;
  marker->marker = true;
  const events::SynthResult r = events::parse_synthetic_command(kMarkerFields);
  marker->compiled = events::synthetic_compiled(r.event);
  marker->compiled.group = marker->group;
  marker->compiled.event = marker->name;
}

void DynamicEvents::Impl::add_marker_files(uint32_t buffer, const NodePtr& edir,
                                           const NodePtr& dir) {
  const std::weak_ptr<Node> self = edir;
  tree.add_file(dir, "trigger", kModeReadWrite,
                make_text_file(
                    [this, buffer] {
                      std::lock_guard l(mu);
                      return trigger_text(*marker, buffer);
                    },
                    [this, buffer, self](const Request&, std::string_view data) -> int64_t {
                      {
                        std::lock_guard l(mu);
                        if (!instance_live(buffer, self)) return -ENODEV;
                      }
                      return write_trigger(*marker, data, buffer);
                    }));
  tree.add_file(dir, "hist", kModeRead, make_text_file([this, buffer] {
                  std::lock_guard l(mu);
                  return hist_text(*marker, buffer);
                }));
}

void DynamicEvents::Impl::update_marker_armed() {
  uint32_t armed = 0;
  for (const Trigger& t : marker->triggers) armed |= 1u << t.buffer;
  for (const HistTrigger& t : marker->hists) armed |= 1u << t.buffer;
  marker_armed.store(armed, std::memory_order_release);
}

void DynamicEvents::Impl::marker_hit(uint32_t buffer, pid_t tid, std::string_view comm,
                                     std::string_view text) {
  if (buffer >= 32 || !(marker_armed.load(std::memory_order_acquire) >> buffer & 1)) return;
  std::lock_guard l(mu);
  // The record as the marker's fields lay it out (its text NUL-terminated).
  const auto n = static_cast<uint32_t>(text.size() + 1);
  std::vector<uint8_t> rec(kMarkerTextAt + n, 0);
  const uint16_t id = marker->id;
  const int32_t pid = tid;
  const uint32_t loc = kMarkerTextAt | n << 16;
  std::memcpy(rec.data(), &id, 2);
  rec[3] = 1;
  std::memcpy(rec.data() + 4, &pid, 4);
  std::memcpy(rec.data() + 16, &loc, 4);
  std::memcpy(rec.data() + kMarkerTextAt, text.data(), text.size());
  const auto len = static_cast<uint32_t>(rec.size());
  char name[16] = {};
  std::memcpy(name, comm.data(), std::min(comm.size(), sizeof name - 1));

  const std::vector<events::HistProgram> programs =
      hit_programs(*marker, static_cast<int>(buffer));
  std::vector<events::HistFired> fired;
  tracer.count_daemon_hists(programs, rec.data(), len, name, &fired);
  if (!fired.empty()) emit_daemon_synths(fired, tid, 0);

  const int cpu = ::sched_getcpu();
  bool woke = false;
  for (const Trigger& t : marker->triggers) {
    if (t.buffer != buffer) continue;
    if (t.filter) {
      events::FilterContext fc;
      fc.cpu = cpu < 0 ? 0 : static_cast<uint32_t>(cpu);
      fc.comm = name;
      if (!events::filter_match(*t.filter, rec.data(), len, fc)) continue;
    }
    const uint32_t slot = t.count < 0 ? events::kNoCountSlot : t.count_slot;
    switch (t.kind) {
      case TriggerKind::kTraceOn:
      case TriggerKind::kTraceOff: {
        const bool on = t.kind == TriggerKind::kTraceOn;
        // Tracing already as it would set it: no count spent, as at a target's hit.
        if (tracer.tracing_on(buffer) == on || !tracer.take_trigger_count(slot)) break;
        (void)tracer.set_tracing_on(on, buffer);
        woke = true;
        break;
      }
      case TriggerKind::kEnableEvent:
      case TriggerKind::kDisableEvent: {
        const bool disable = t.kind == TriggerKind::kDisableEvent;
        if (!t.target || tracer.soft_disabled(t.target->id, buffer) == disable) break;
        if (tracer.take_trigger_count(slot)) tracer.set_soft_disabled(t.target->id, disable, buffer);
        break;
      }
      case TriggerKind::kSnapshot:
        if (tracer.take_trigger_count(slot)) fs.snapshot(buffer);
        break;
      case TriggerKind::kStackTrace:
        break;  // refused on the marker (write_trigger)
    }
  }
  if (woke) fs.wake_readers();
}

void DynamicEvents::Impl::emit_daemon_synths(const std::vector<events::HistFired>& fired,
                                             pid_t tid, int depth) {
  for (const events::HistFired& f : fired) {
    auto it = std::find_if(events.begin(), events.end(), [&](const auto& e) {
      return e->synthetic && e->id == f.synth_id;
    });
    if (it == events.end() || f.action == nullptr) continue;
    DynEvent& se = **it;
    const uint32_t size = se.compiled.program.fixed_size;
    if (size < 8 || size > kSynthRecordBytes || size % 8 != 0) continue;
    std::vector<uint8_t> rec(size, 0);
    const uint64_t common = se.id | uint64_t{static_cast<uint32_t>(tid)} << 32;
    std::memcpy(rec.data(), &common, 8);
    for (uint32_t i = 0; i < f.nparams && i < events::kHistMaxParams; ++i) {
      const uint32_t off = f.action->param_offset[i], bytes = f.action->param_size[i];
      if (off < 8 || off > size || bytes > size - off || bytes > 8) continue;
      std::memcpy(rec.data() + off, &f.params[i], bytes);  // little-endian: the low bytes
    }
    const std::vector<events::HistProgram> programs = hit_programs(se, -1);
    std::vector<events::HistFired> next;
    tracer.count_daemon_hists(programs, rec.data(), size, "", &next);
    auto keeps = [&](const std::shared_ptr<const events::CompiledFilter>& filter) {
      if (!filter) return true;
      events::FilterContext fc;
      fc.comm = "";
      return events::filter_match(*filter, rec.data(), size, fc);
    };
    if (se.registered && !soft_disabled(se) && keeps(se.filter))
      (void)tracer.write_record(rec.data(), size, 0);
    for (uint32_t bits = se.instance_on; bits != 0; bits &= bits - 1) {
      const auto b = static_cast<uint32_t>(__builtin_ctz(bits));
      auto fi = se.instance_filters.find(b);
      if (keeps(fi == se.instance_filters.end() ? nullptr : fi->second.filter))
        (void)tracer.write_record(rec.data(), size, b);
    }
    // A chain stops where a target's does: one synthetic event may fire another.
    if (!next.empty() && depth < 1) emit_daemon_synths(next, tid, depth + 1);
  }
}

void DynamicEvents::marker_written(uint32_t buffer, pid_t tid, std::string_view comm,
                                   std::string_view text) {
  impl_->marker_hit(buffer, tid, comm, text);
}

}  // namespace probefs::fs
