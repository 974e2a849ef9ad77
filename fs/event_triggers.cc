#include "fs/event_triggers.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "events/kstrto.h"
#include "fs/tracefs.h"

namespace probefs::fs {
namespace {

using std::chrono::milliseconds;

bool is_blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

std::string_view skip_blanks(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  return s;
}

// Splits `s` at the first of `seps`: the part before it, and *rest after it (nullopt
// when there was no separator).
std::string_view split_at(std::string_view s, std::string_view seps,
                          std::optional<std::string_view>* rest) {
  size_t i = s.find_first_of(seps);
  if (i == std::string_view::npos) {
    rest->reset();
    return s;
  }
  *rest = s.substr(i + 1);
  return s.substr(0, i);
}

bool kind_of(std::string_view word, TriggerKind* kind) {
  if (word == "traceon") *kind = TriggerKind::kTraceOn;
  else if (word == "traceoff") *kind = TriggerKind::kTraceOff;
  else if (word == "enable_event") *kind = TriggerKind::kEnableEvent;
  else if (word == "disable_event") *kind = TriggerKind::kDisableEvent;
  else if (word == "stacktrace") *kind = TriggerKind::kStackTrace;
  else return false;
  return true;
}

bool has_target(TriggerKind k) {
  return k == TriggerKind::kEnableEvent || k == TriggerKind::kDisableEvent;
}

const char* kind_name(TriggerKind k) {
  switch (k) {
    case TriggerKind::kTraceOn: return "traceon";
    case TriggerKind::kTraceOff: return "traceoff";
    case TriggerKind::kEnableEvent: return "enable_event";
    case TriggerKind::kDisableEvent: return "disable_event";
    case TriggerKind::kStackTrace: return "stacktrace";
  }
  return "";
}

// COUNT[:ignored]
int parse_count(std::string_view param, int64_t* count) {
  std::optional<std::string_view> rest;
  std::string_view number = split_at(param, ":", &rest);
  uint64_t v;
  if (number.empty() || !events::kstrtoull(number, 0, &v)) return -EINVAL;
  *count = static_cast<int64_t>(v);
  return 0;
}

// "if FILTER": the filter as the file reads it back.
int parse_condition(std::string_view cond, std::string* filter) {
  std::optional<std::string_view> rest;
  std::string_view word = split_at(cond, " \t", &rest);
  if (word != "if" || !rest || rest->empty()) return -EINVAL;
  *filter = std::string(*rest);
  return 0;
}

bool uses_comm(const events::CompiledFilter& f) {
  for (const events::FilterInsn& in : f.insns)
    if (in.kind == events::FilterInsn::kPred && in.source == events::FilterInsn::kComm)
      return true;
  return false;
}

// Threads stack_shown() remembers at most; past that it forgets them all (a forgotten
// thread's next stack is shown).
constexpr size_t kMaxStackThreads = 1 << 16;

int32_t tid_of(const tracee::TraceRecord& rec) {
  int32_t tid = 0;
  if (rec.len >= 8) std::memcpy(&tid, rec.data + 4, sizeof tid);
  return tid;
}

}  // namespace

int parse_trigger(std::string_view text, TriggerCommand* out) {
  *out = TriggerCommand{};
  text = trim(text);
  if (!text.empty() && text[0] == '!') {
    out->remove = true;
    text.remove_prefix(1);
  }
  std::optional<std::string_view> rest;
  std::string_view word = split_at(text, ": \t", &rest);
  if (!kind_of(word, &out->kind)) return -EINVAL;
  std::string_view args = rest ? skip_blanks(*rest) : std::string_view();
  const bool targeted = has_target(out->kind);

  // The parameter (a count, or the target and a count) and the condition. Without a
  // parameter that starts with a digit, what follows is the condition.
  std::optional<std::string_view> param, cond;
  if (!args.empty()) {
    if (!targeted && !(args[0] >= '0' && args[0] <= '9')) {
      cond = args;
    } else {
      std::optional<std::string_view> after;
      param = split_at(args, " \t", &after);
      if (after && !skip_blanks(*after).empty()) cond = skip_blanks(*after);
    }
  }
  std::optional<std::string_view> count_text = param;
  if (targeted) {
    if (!param) return -EINVAL;
    std::optional<std::string_view> after_system, after_event;
    out->system = std::string(split_at(*param, ":", &after_system));
    if (!after_system) return -EINVAL;
    out->event = std::string(split_at(*after_system, ":", &after_event));
    count_text = after_event;
  }
  // A removal names what it removes; its count and condition are not looked at.
  if (out->remove) return 0;
  if (count_text && parse_count(*count_text, &out->count) != 0) return -EINVAL;
  if (cond) {
    if (parse_condition(*cond, &out->filter) != 0) return -EINVAL;
    out->has_filter = true;
  }
  return 0;
}

std::string_view no_triggers_text() {
  return "# Available triggers:\n# traceon traceoff stacktrace enable_event disable_event hist\n";
}

// ---- the gate ----------------------------------------------------------------------------

struct TriggerGate::Event {
  uint16_t id = 0;
  bool soft_disabled = false;
  std::vector<Trigger> triggers;  // newest first
};

TriggerGate::TriggerGate(Hooks hooks)
    : hooks_(std::move(hooks)), by_id_(kLastEventId - kFirstEventId + 1) {
  thread_ = std::thread([this] { worker(); });
}

TriggerGate::~TriggerGate() { stop(); }

TriggerGate::Event* TriggerGate::lookup(uint16_t id) const {
  if (id < kFirstEventId || id > kLastEventId) return nullptr;
  return by_id_[id - kFirstEventId].get();
}

TriggerGate::EventPtr TriggerGate::add_event(uint16_t id) {
  auto ev = std::make_shared<Event>();
  ev->id = id;
  std::lock_guard l(mu_);
  if (id >= kFirstEventId && id <= kLastEventId) by_id_[id - kFirstEventId] = ev;
  return ev;
}

void TriggerGate::remove_event(uint16_t id) {
  std::lock_guard l(mu_);
  Event* ev = lookup(id);
  if (!ev) return;
  trigger_count_ -= ev->triggers.size();
  ev->triggers.clear();
  if (ev->soft_disabled) --soft_disabled_count_;
  ev->soft_disabled = false;
  by_id_[id - kFirstEventId].reset();
  update_quiet();
}

bool TriggerGate::soft_disabled(const Event& ev) const {
  std::lock_guard l(mu_);
  return ev.soft_disabled;
}

void TriggerGate::set_soft_disabled(Event& ev, bool on) {
  std::lock_guard l(mu_);
  if (ev.soft_disabled == on) return;
  ev.soft_disabled = on;
  if (on) ++soft_disabled_count_;
  else --soft_disabled_count_;
  update_quiet();
}

std::string TriggerGate::show(const Event& ev) const {
  std::lock_guard l(mu_);
  if (ev.triggers.empty()) return std::string(no_triggers_text());
  std::string out;
  for (const Trigger& t : ev.triggers) {
    out += kind_name(t.kind);
    if (t.target) out += ":" + t.target_name;
    out += t.count < 0 ? ":unlimited" : ":count=" + std::to_string(t.count);
    if (t.has_filter) out += " if " + t.filter_text;
    out += '\n';
  }
  return out;
}

namespace {

// traceon and traceoff share one place, stacktrace has its own, enable_event and
// disable_event one per target (the kernel's trigger types).
bool same_place(const TriggerGate::Trigger& t, TriggerKind kind,
                const TriggerGate::Event* target) {
  if (has_target(kind) != has_target(t.kind)) return false;
  if ((kind == TriggerKind::kStackTrace) != (t.kind == TriggerKind::kStackTrace)) return false;
  return !has_target(kind) || t.target.get() == target;
}

}  // namespace

bool TriggerGate::taken(const Event& ev, TriggerKind kind, const Event* target) const {
  std::lock_guard l(mu_);
  for (const Trigger& t : ev.triggers)
    if (same_place(t, kind, target)) return true;
  return false;
}

void TriggerGate::add(Event& ev, Trigger t) {
  std::lock_guard l(mu_);
  ev.triggers.insert(ev.triggers.begin(), std::move(t));
  ++trigger_count_;
  update_quiet();
}

bool TriggerGate::remove(Event& ev, TriggerKind kind, const Event* target,
                         EventPtr* target_out) {
  std::lock_guard l(mu_);
  target_out->reset();
  for (auto it = ev.triggers.begin(); it != ev.triggers.end(); ++it) {
    if (!same_place(*it, kind, target)) continue;
    *target_out = it->target;
    ev.triggers.erase(it);
    --trigger_count_;
    update_quiet();
    return true;
  }
  return false;
}

std::vector<TriggerGate::EventPtr> TriggerGate::remove_all(Event& ev) {
  std::lock_guard l(mu_);
  std::vector<EventPtr> targets;
  for (Trigger& t : ev.triggers)
    if (t.target) targets.push_back(t.target);
  trigger_count_ -= ev.triggers.size();
  ev.triggers.clear();
  update_quiet();
  return targets;
}

void TriggerGate::update_quiet() {
  quiet_.store(trigger_count_ == 0 && soft_disabled_count_ == 0 && !tracing_off_,
               std::memory_order_release);
}

// One trigger whose condition held: false when it had nothing to do (its count is spent,
// or tracing or its target is already in the state it sets).
bool TriggerGate::fire(Trigger& t) {
  if (t.count == 0) return false;
  switch (t.kind) {
    case TriggerKind::kTraceOn:
      if (!tracing_off_) return false;
      tracing_off_ = false;
      request_tracing(true);
      break;
    case TriggerKind::kTraceOff:
      if (tracing_off_) return false;
      tracing_off_ = true;
      ++off_generation_;
      request_tracing(false);
      break;
    case TriggerKind::kEnableEvent:
    case TriggerKind::kDisableEvent: {
      bool disable = t.kind == TriggerKind::kDisableEvent;
      if (t.target->soft_disabled == disable) return false;
      t.target->soft_disabled = disable;
      if (disable) ++soft_disabled_count_;
      else --soft_disabled_count_;
      break;
    }
    case TriggerKind::kStackTrace:
      break;  // the stack record after it is shown (stack_shown)
  }
  if (t.count > 0) --t.count;
  return true;
}

bool TriggerGate::admit(const EventView& view, const tracee::TraceRecord& rec) {
  if (quiet_.load(std::memory_order_acquire)) return true;
  std::lock_guard l(mu_);
  const bool off_before = tracing_off_;
  Event* ev = lookup(view.id);
  if (!ev) return !off_before;
  const bool soft = ev->soft_disabled;
  bool shown = !off_before && !soft;
  bool has_stacktrace = false, stack_fired = false;
  std::string comm;
  for (Trigger& t : ev->triggers) {
    if (t.kind == TriggerKind::kStackTrace) has_stacktrace = true;
    if (t.filter) {
      // A soft-disabled event's conditional triggers do not run, as in the kernel.
      if (soft) continue;
      events::FilterContext ctx;
      ctx.cpu = rec.cpu;
      if (uses_comm(*t.filter) && hooks_.comm_of) {
        if (comm.empty()) comm = hooks_.comm_of(rec.pid, tid_of(rec));
        ctx.comm = comm.c_str();
      }
      if (!events::filter_match(*t.filter, rec.data, rec.len, ctx)) continue;
    }
    const bool fired = fire(t);
    if (fired && t.kind == TriggerKind::kTraceOn && !t.filter && !soft) shown = true;
    if (fired && t.kind == TriggerKind::kStackTrace) stack_fired = true;
  }
  if (stack_shown_.size() > kMaxStackThreads) stack_shown_.clear();
  stack_shown_[uint64_t{static_cast<uint32_t>(rec.pid)} << 32 | static_cast<uint32_t>(tid_of(rec))] =
      !has_stacktrace || stack_fired;
  update_quiet();
  return shown;
}

bool TriggerGate::stack_shown(pid_t pid, int32_t tid) const {
  if (quiet_.load(std::memory_order_acquire)) return true;  // no stacktrace trigger
  std::lock_guard l(mu_);
  auto it = stack_shown_.find(uint64_t{static_cast<uint32_t>(pid)} << 32 | static_cast<uint32_t>(tid));
  return it == stack_shown_.end() || it->second;
}

// ---- the gate's thread: tracing_on changes, made outside every reader ----------------

void TriggerGate::request_tracing(bool on) {
  {
    std::lock_guard w(work_mu_);
    if (stop_) return;
    pending_ = on;
  }
  work_cv_.notify_one();
}

void TriggerGate::sync() {
  {
    std::unique_lock w(work_mu_);
    done_cv_.wait(w, [&] { return stop_ || (!pending_ && !applying_); });
  }
  poll_user_on();
}

void TriggerGate::stop() {
  {
    std::lock_guard w(work_mu_);
    stop_ = true;
    pending_.reset();
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TriggerGate::worker() {
  std::unique_lock w(work_mu_);
  for (;;) {
    // Never mu_ here: admit() holds mu_ when it takes work_mu_.
    const bool off = tracing_off_.load(std::memory_order_relaxed);
    // While a traceoff holds, look now and then whether tracing_on was set again by hand.
    if (off) work_cv_.wait_for(w, milliseconds(20), [&] { return stop_ || pending_; });
    else work_cv_.wait(w, [&] { return stop_ || pending_; });
    if (stop_) return;
    if (pending_) {
      bool on = *pending_;
      pending_.reset();
      applying_ = true;
      w.unlock();
      if (hooks_.set_tracing_on) hooks_.set_tracing_on(on);
      w.lock();
      applying_ = false;
      if (!pending_) done_cv_.notify_all();
      continue;
    }
    w.unlock();
    poll_user_on();
    w.lock();
  }
}

// Tracing is on although the last trigger turned it off, and no change is on its way:
// someone wrote tracing_on. Records are shown again.
void TriggerGate::poll_user_on() {
  uint64_t gen;
  {
    std::lock_guard l(mu_);
    if (!tracing_off_) return;
    gen = off_generation_;
  }
  {
    std::lock_guard w(work_mu_);
    if (pending_ || applying_) return;
  }
  if (!hooks_.tracing_on || !hooks_.tracing_on()) return;
  std::lock_guard l(mu_);
  if (tracing_off_ && off_generation_ == gen) {
    tracing_off_ = false;
    update_quiet();
  }
}

}  // namespace probefs::fs
