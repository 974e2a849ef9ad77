#include "fs/tracefs.h"

#include <unistd.h>

#include <cerrno>
#include <deque>
#include <mutex>
#include <string>

#include "events/raw_page.h"
#include "events/ring.h"
#include "fs/dynamic_events.h"
#include "fs/instances.h"
#include "fs/trace_files.h"

namespace probefs::fs {

// ---- EventTable --------------------------------------------------------------------------

uint16_t EventTable::allocate_id() {
  std::lock_guard l(mu_);
  const uint32_t span = kLastEventId - kFirstEventId + 1;
  for (uint32_t i = 0; i < span; ++i) {
    uint16_t id = static_cast<uint16_t>(kFirstEventId + (next_ - kFirstEventId + i) % span);
    if (!used_[id]) {
      used_[id] = true;
      // Consecutive ids for consecutive events, as the kernel gives them.
      next_ = id == kLastEventId ? kFirstEventId : static_cast<uint16_t>(id + 1);
      return id;
    }
  }
  return 0;
}

void EventTable::release_id(uint16_t id) {
  std::lock_guard l(mu_);
  used_.erase(id);
}

void EventTable::publish(std::shared_ptr<const EventView> view) {
  std::lock_guard l(mu_);
  uint16_t id = view->id;
  views_[id] = std::move(view);
}

void EventTable::unpublish(uint16_t id) {
  std::lock_guard l(mu_);
  views_.erase(id);
}

std::shared_ptr<const EventView> EventTable::find(uint16_t id) const {
  std::lock_guard l(mu_);
  auto it = views_.find(id);
  return it == views_.end() ? nullptr : it->second;
}

// ---- Tracefs -------------------------------------------------------------------------------

struct Tracefs::NoticeSink {
  std::mutex mu;
  DynamicEvents* events = nullptr;  // nullptr once the Tracefs goes
  std::unordered_map<pid_t, pid_t> parents;  // fork child -> its parent
  std::deque<pid_t> children;                // oldest first, for forgetting
};

Tracefs::Tracefs(tracee::Tracer& tracer, const Options& opts) : tracer_(tracer), opts_(opts) {
  static_assert(std::tuple_size_v<decltype(subbuf_)> == events::kRingMaxBuffers);
  for (auto& s : subbuf_) s.store(events::kRawPageSize);
  if (opts_.cpus <= 0) opts_.cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_CONF));
  if (opts_.cpus <= 0) opts_.cpus = 1;
  // The order in which the parts add their files is the root's readdir order.
  add_control_files(*this);
  trace_ = std::make_shared<TraceFiles>(*this);
  dynamic_ = std::make_unique<DynamicEvents>(*this);
  instances_ = std::make_shared<Instances>(*this);
  instances_->attach(tree_.mkdir_with_ops(tree_.root(), "instances", kModeDirPrivate, instances_));
  // A process refused as a target (the target limit), or one probefs cannot enter (a
  // static program, a secure exec, no agent), is said where the user looks: error_log,
  // beside `targets` (which lists it as untraced or untraceable while it runs).
  notices_ = std::make_shared<NoticeSink>();
  notices_->events = dynamic_.get();
  tracer_.on_target_notice([sink = notices_](const tracee::TargetNotice& n) {
    if (n.kind == tracee::TargetNotice::Kind::kForked && n.parent > 0) {
      std::lock_guard l(sink->mu);
      if (sink->parents.insert_or_assign(n.pid, n.parent).second)
        sink->children.push_back(n.pid);
      if (sink->children.size() > kForkParentsKept) {
        sink->parents.erase(sink->children.front());
        sink->children.pop_front();
      }
      return;
    }
    if (n.kind == tracee::TargetNotice::Kind::kNotPlaced) {
      // A definition accepted earlier that this process cannot take: the kernel's entry,
      // as its registration would have logged it had the process been there then.
      std::lock_guard l(sink->mu);
      if (sink->events != nullptr) sink->events->log_error(n.diag);
      return;
    }
    if (n.kind != tracee::TargetNotice::Kind::kRefused) return;
    events::Diagnostic d;
    d.code = n.untraceable ? events::ErrorCode::kUntraceable : events::ErrorCode::kTargetLimit;
    d.err = n.untraceable ? EPERM : ENOSPC;
    d.subsystem = events::kLogProbefs;
    d.command = "pid " + std::to_string(n.pid) + ": " + n.reason;
    std::lock_guard l(sink->mu);
    if (sink->events != nullptr) sink->events->log_error(d);
  });
}

Tracefs::~Tracefs() {
  tracer_.on_target_notice(nullptr);
  {
    std::lock_guard l(notices_->mu);
    notices_->events = nullptr;
  }
  shutdown();
  dynamic_->clear_all();
  // The instances' directory holds their owner: it lets go with the tree.
  tree_.remove(tree_.root(), "instances");
  // The definitions go first: their triggers may still call into the trace files.
  dynamic_.reset();
  instances_.reset();
  trace_.reset();
}

bool Tracefs::tracing_on(uint32_t buffer) const { return tracer_.tracing_on(buffer); }

void Tracefs::set_tracing_on(bool on) {
  (void)tracer_.set_tracing_on(on);
  if (trace_) trace_->wake_readers();
}

namespace {

// The top level's trace files, then the instances'.
std::vector<std::shared_ptr<TraceFiles>> every_buffer(const std::shared_ptr<TraceFiles>& top,
                                                      const std::shared_ptr<Instances>& in) {
  std::vector<std::shared_ptr<TraceFiles>> all;
  if (top) all.push_back(top);
  if (in)
    for (auto& f : in->trace_files()) all.push_back(std::move(f));
  return all;
}

}  // namespace

int Tracefs::reset_all_buffers(const std::function<int()>& op) {
  const std::vector<std::shared_ptr<TraceFiles>> all = every_buffer(trace_, instances_);
  // Each buffer's readers in turn, in buffer order, the op inside them all.
  std::function<int(size_t)> step = [&](size_t i) -> int {
    if (i == all.size()) return op();
    return all[i]->reset_buffer([&] { return step(i + 1); });
  };
  return step(0);
}

void Tracefs::set_clock(events::TraceClock c) {
  for (const auto& f : every_buffer(trace_, instances_)) f->set_clock(c);
}

void Tracefs::wake_readers() {
  for (const auto& f : every_buffer(trace_, instances_)) f->wake_readers();
}

void Tracefs::snapshot(uint32_t buffer) {
  for (const auto& f : every_buffer(trace_, instances_))
    if (f->buffer() == buffer) f->snapshot_swap();
}

void Tracefs::allocate_snapshot(uint32_t buffer) {
  for (const auto& f : every_buffer(trace_, instances_))
    if (f->buffer() == buffer) f->allocate_snapshot();
}

void Tracefs::shutdown() {
  shutdown_ = true;
  wake_readers();
}

bool Tracefs::shutting_down() const { return shutdown_; }

pid_t Tracefs::fork_parent(pid_t pid) const {
  std::lock_guard l(notices_->mu);
  auto it = notices_->parents.find(pid);
  return it == notices_->parents.end() ? 0 : it->second;
}

}  // namespace probefs::fs
