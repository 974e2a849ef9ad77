#include "fs/event_triggers.h"

#include <cerrno>
#include <cstring>

#include "events/kstrto.h"
#include "fs/tracefs.h"

namespace probefs::fs {
namespace {

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
  else if (word == "snapshot") *kind = TriggerKind::kSnapshot;
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
    case TriggerKind::kSnapshot: return "snapshot";
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

std::string_view no_triggers_text(bool marker) {
  if (marker)
    return "# Available triggers:\n# traceon traceoff snapshot enable_event disable_event hist\n";
  return "# Available triggers:\n"
         "# traceon traceoff snapshot stacktrace enable_event disable_event hist\n";
}

bool same_place(const Trigger& t, TriggerKind kind, const DynEvent* target) {
  if (has_target(kind) != has_target(t.kind)) return false;
  if ((kind == TriggerKind::kStackTrace) != (t.kind == TriggerKind::kStackTrace)) return false;
  if ((kind == TriggerKind::kSnapshot) != (t.kind == TriggerKind::kSnapshot)) return false;
  return !has_target(kind) || t.target == target;
}

std::string trigger_line(const Trigger& t, int64_t left) {
  std::string out(kind_name(t.kind));
  if (t.target) out += ":" + t.target_name;
  out += t.count < 0 ? ":unlimited" : ":count=" + std::to_string(left);
  if (t.has_filter) out += " if " + t.filter_text;
  return out + "\n";
}

events::TriggerSpec hit_trigger(const Trigger& t, uint16_t target_id) {
  events::TriggerSpec s;
  switch (t.kind) {
    case TriggerKind::kTraceOn: s.action = events::TriggerAction::kTraceOn; break;
    case TriggerKind::kTraceOff: s.action = events::TriggerAction::kTraceOff; break;
    case TriggerKind::kEnableEvent: s.action = events::TriggerAction::kEnableEvent; break;
    case TriggerKind::kDisableEvent: s.action = events::TriggerAction::kDisableEvent; break;
    case TriggerKind::kStackTrace: s.action = events::TriggerAction::kStackTrace; break;
    case TriggerKind::kSnapshot: s.action = events::TriggerAction::kSnapshot; break;
  }
  s.target_event = target_id;
  s.buffer = static_cast<uint8_t>(t.buffer);
  s.count_slot = t.count < 0 ? events::kNoCountSlot : t.count_slot;
  if (t.filter) s.filter = *t.filter;
  return s;
}

}  // namespace probefs::fs
