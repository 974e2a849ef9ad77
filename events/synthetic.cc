// The synthetic_events language: see synthetic.h. Errors carry the kernel's messages and
// carets: a caret points at the first place the offending word occurs in the command.
#include "events/synthetic.h"

#include <cctype>
#include <cstring>
#include <optional>

#include "events/definition.h"

namespace probefs::events {
namespace {

constexpr std::string_view kBlanks = " \t";

// The synthetic_events subsystem's messages (trace_events_synth.c), by name.
enum class SynthError : uint8_t {
  kBadName, kInvalidCmd, kInvalidDynCmd, kEventExists, kTooManyFields, kIncompleteType,
  kInvalidType, kInvalidField, kInvalidArraySpec,
};

SynthResult fail(std::string_view command, SynthError e, int pos, int err = EINVAL) {
  SynthResult r;
  r.status = SynthStatus::kError;
  r.error.err = err;
  r.error.pos = pos;
  r.error.command = std::string(command);
  r.error.subsystem = kLogSynth;
  switch (e) {
    case SynthError::kBadName: r.error.code = ErrorCode::kSynthBadName; break;
    case SynthError::kInvalidCmd: r.error.code = ErrorCode::kSynthInvalidCmd; break;
    case SynthError::kInvalidDynCmd: r.error.code = ErrorCode::kSynthInvalidDynCmd; break;
    case SynthError::kEventExists: r.error.code = ErrorCode::kSynthEventExists; break;
    case SynthError::kTooManyFields: r.error.code = ErrorCode::kSynthTooManyFields; break;
    case SynthError::kIncompleteType: r.error.code = ErrorCode::kSynthIncompleteType; break;
    case SynthError::kInvalidType: r.error.code = ErrorCode::kSynthInvalidType; break;
    case SynthError::kInvalidField: r.error.code = ErrorCode::kSynthInvalidField; break;
    case SynthError::kInvalidArraySpec: r.error.code = ErrorCode::kSynthInvalidArraySpec; break;
  }
  return r;
}

// Where `word` first occurs in the command (the kernel's err_pos: a search, not a pointer).
int where(std::string_view command, std::string_view word) {
  if (word.empty()) return 0;
  const size_t at = command.find(word);
  return at == std::string_view::npos ? 0 : static_cast<int>(at);
}

std::string_view skip_blanks(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  return s;
}

// The kernel's argv_split: words between white space.
std::vector<std::string_view> words(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    if (i == s.size()) break;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

bool good_name(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

struct TypeInfo {
  const char* name;
  uint32_t size;
  const char* fmt;
};

constexpr TypeInfo kNumberTypes[] = {
    {"s64", 8, "%lld"}, {"u64", 8, "%llu"}, {"s32", 4, "%d"}, {"u32", 4, "%u"},
    {"s16", 2, "%d"},   {"u16", 2, "%u"},   {"s8", 1, "%d"},  {"u8", 1, "%u"},
    {"char", 1, "%d"},  {"unsigned char", 1, "%u"},  {"int", 4, "%d"},
    {"unsigned int", 4, "%u"},  {"long", 8, "%ld"},  {"unsigned long", 8, "%lu"},
    {"bool", 1, "%d"},  {"pid_t", 4, "%d"},  {"gfp_t", 4, "%x"},
};

const TypeInfo* number_type(std::string_view t) {
  for (const TypeInfo& i : kNumberTypes)
    if (t == i.name) return &i;
  return nullptr;
}

bool signed_type(std::string_view t) { return !(t.starts_with("u") || t == "gfp_t"); }

// The size a string type gives: N of char[N], 0 for char[], nullopt when malformed.
std::optional<uint32_t> string_size(std::string_view type) {
  const size_t open = type.find("char[");
  const size_t start = open + 5;
  const size_t close = type.find(']');
  if (close == std::string_view::npos || close < start || close + 1 != type.size())
    return std::nullopt;
  const std::string_view digits = type.substr(start, close - start);
  if (digits.size() > 3) return std::nullopt;
  if (digits.empty()) return 0;
  // kstrtouint with base 0: decimal, 0x hex or 0 octal, nothing else after.
  std::string text(digits);
  char* end = nullptr;
  errno = 0;
  if (!std::isdigit(static_cast<unsigned char>(text[0]))) return std::nullopt;
  const unsigned long v = std::strtoul(text.c_str(), &end, 0);
  if (errno || *end || v > kSynthStringMax) return std::nullopt;
  return static_cast<uint32_t>(v);
}

// Parses one field starting at w[i]; advances i past it. `command` for carets.
std::optional<SynthResult> parse_field(std::string_view command,
                                       const std::vector<std::string_view>& w, size_t& i,
                                       SynthField* out) {
  std::string prefix;
  std::string_view type = w[i], name;
  if (type == "unsigned") {
    if (w.size() - i < 3) return fail(command, SynthError::kIncompleteType, where(command, type));
    prefix = "unsigned ";
    type = w[i + 1];
    name = w[i + 2];
    i += 3;
  } else {
    if (w.size() - i < 2) {
      i = w.size();
      return fail(command, SynthError::kInvalidField, where(command, type));
    }
    name = w[i + 1];
    i += 2;
  }
  std::string_view array;
  if (const size_t b = name.find('['); b != std::string_view::npos) {
    array = name.substr(b);
    name = name.substr(0, b);
  }
  if (!good_name(name)) return fail(command, SynthError::kBadName, where(command, name));
  std::string full = prefix + std::string(type) + std::string(array);
  SynthField f;
  f.name = std::string(name);
  // A number's size; a string's N (0 for char[]); 0 for anything else (long[] included,
  // told apart below), as the kernel's synth_field_size.
  std::optional<uint32_t> size = 0;
  if (const TypeInfo* t = number_type(full)) size = t->size;
  else if (full.find("char[") != std::string::npos) size = string_size(full);
  if (!size) {
    return fail(command, array.empty() ? SynthError::kInvalidType : SynthError::kInvalidArraySpec,
                where(command, array.empty() ? type : w[i - 1]));
  }
  const bool is_string = full.find("char[") != std::string::npos;
  const bool is_stack = !is_string && full.find("long[") != std::string::npos;
  if (*size == 0) {
    if (!is_string && !is_stack)
      return fail(command, SynthError::kInvalidType, where(command, type));
    full = "__data_loc " + full;
    f.is_dynamic = true;
    *size = 8;
  }
  f.type = full;
  f.size = *size;
  f.is_string = is_string;
  f.is_stack = is_stack;
  f.is_signed = signed_type(full);
  *out = std::move(f);
  return std::nullopt;
}

// NAME and its FIELDS text: the kernel's __create_synth_event. `command` for carets.
SynthResult create(std::string_view command, std::string_view name, std::string_view fields) {
  if (name.empty()) return fail(command, SynthError::kInvalidCmd, 0);
  if (!good_name(name)) return fail(command, SynthError::kBadName, where(command, name));
  SynthResult r;
  r.status = SynthStatus::kDefine;
  r.event.name = std::string(name);
  size_t at = 0;
  for (;;) {
    const size_t semi = fields.find(';', at);
    const std::string_view part =
        fields.substr(at, semi == std::string_view::npos ? std::string_view::npos : semi - at);
    const std::vector<std::string_view> w = words(part);
    for (size_t i = 0; i < w.size();) {
      SynthField f;
      if (auto e = parse_field(command, w, i, &f)) return *e;
      if (r.event.fields.size() == kSynthFieldsMax)
        return fail(command, SynthError::kTooManyFields, 0);
      r.event.fields.push_back(std::move(f));
    }
    if (semi == std::string_view::npos) break;
    at = semi + 1;
  }
  if (r.event.fields.empty()) return fail(command, SynthError::kInvalidCmd, 0);
  uint32_t offset = 8;  // after the common header
  for (SynthField& f : r.event.fields) {
    f.offset = offset;
    offset += f.is_string && !f.is_dynamic ? kSynthStringMax : 8;
  }
  return r;
}

// The kernel's check_command: the part before the first ';' needs a name and a field
// (three words), unless it removes.
bool command_complete(std::string_view s) {
  const std::string_view first = s.substr(0, s.find(';'));
  if (!first.empty() && first[0] == '!') return true;
  return words(first).size() >= 3;
}

// A line of synthetic_events, its leading blanks gone.
SynthResult parse_command(std::string_view command) {
  if (command.empty()) return {};
  if (!command_complete(command)) return fail(command, SynthError::kInvalidCmd, 0);
  const size_t blank = command.find_first_of(kBlanks);
  if (blank == std::string_view::npos && command[0] != '!')
    return fail(command, SynthError::kInvalidCmd, 0);
  const std::string_view name = command.substr(0, blank);
  if (name[0] == '!') {
    SynthResult r;
    r.status = SynthStatus::kRemove;
    r.remove = std::string(name.substr(1));
    return r;
  }
  return create(command, name, skip_blanks(command.substr(blank)));
}

// A line of dynamic_events that starts with "s:", its leading blanks gone.
SynthResult parse_dynamic(std::string_view command) {
  std::string_view name = command.substr(2);
  const size_t blank = command.find_first_of(kBlanks);
  if (blank == std::string_view::npos) return fail(command, SynthError::kInvalidCmd, 0);
  const std::string_view fields = skip_blanks(command.substr(blank));
  // A group may be given; it must be "synthetic" (a '/' anywhere asks for one, as the
  // kernel looks for it).
  if (name.find('/') != std::string_view::npos) {
    if (!name.starts_with(std::string(kSynthSystem) + "/"))
      return fail(command, SynthError::kInvalidDynCmd, 0);
    name.remove_prefix(kSynthSystem.size() + 1);
  }
  const size_t name_at = static_cast<size_t>(name.data() - command.data());
  if (!command_complete(command.substr(name_at))) return fail(command, SynthError::kInvalidCmd, 0);
  return create(command, command.substr(name_at, blank - name_at), fields);
}

}  // namespace

SynthResult parse_synthetic_command(std::string_view line) {
  const std::string_view command = skip_blanks(line);
  SynthResult r = parse_command(command);
  r.command = std::string(command);
  return r;
}

bool is_synthetic_dynamic(std::string_view line) { return skip_blanks(line).starts_with("s:"); }

SynthResult parse_synthetic_dynamic(std::string_view line) {
  const std::string_view command = skip_blanks(line);
  SynthResult r = parse_dynamic(command);
  r.command = std::string(command);
  return r;
}

std::string synthetic_description(const SynthEvent& ev) {
  std::string s = ev.name + "\t";
  for (size_t i = 0; i < ev.fields.size(); ++i) {
    const SynthField& f = ev.fields[i];
    std::string_view type = f.type;
    if (type.starts_with("__data_loc ")) type.remove_prefix(11);
    s += std::string(type) + " " + f.name;
    if (i + 1 < ev.fields.size()) s += "; ";
  }
  return s;
}

CompiledEvent synthetic_compiled(const SynthEvent& ev) {
  CompiledEvent c;
  c.synthetic = true;
  c.group = std::string(kSynthSystem);
  c.event = ev.name;
  std::string fmt = "\"", args;
  for (size_t i = 0; i < ev.fields.size(); ++i) {
    const SynthField& f = ev.fields[i];
    const TypeInfo* t = number_type(f.type);
    fmt += f.name + "=" + (t ? t->fmt : "%s") + (i + 1 < ev.fields.size() ? ", " : "");
    if (f.is_dynamic && f.is_string) args += ", __get_str(" + f.name + ")";
    else if (f.is_stack) args += ", __get_stacktrace(" + f.name + ")";
    else args += ", REC->" + f.name;

    FieldLayout l;
    l.name = f.name;
    l.offset = f.offset;
    l.decl_size = f.size;
    l.decl_signed = f.is_signed;
    const size_t bracket = f.type.find('[');
    if (bracket == std::string::npos || f.type.starts_with("__data_loc"))
      l.decl = f.type + " " + f.name;
    else
      l.decl = f.type.substr(0, bracket) + " " + f.name + "[]";
    if (f.is_string && f.is_dynamic) {
      l.type = find_fetch_type("string", ProbeSyntax::kKprobe);
      l.size = 4;
    } else if (f.is_string || f.is_stack) {
      // Kept in place (or an address list): no key, no value, no filter operand.
      l.type = find_fetch_type("string", ProbeSyntax::kKprobe);
      l.count = f.is_stack ? 1 : f.size;
      l.size = f.is_stack ? 8 : f.size;
    } else {
      static constexpr const char* kSigned[] = {nullptr, "s8", "s16", nullptr, "s32",
                                                nullptr, nullptr, nullptr, "s64"};
      static constexpr const char* kUnsigned[] = {nullptr, "u8", "u16", nullptr, "u32",
                                                  nullptr, nullptr, nullptr, "u64"};
      l.type = find_fetch_type((f.is_signed ? kSigned : kUnsigned)[f.size], ProbeSyntax::kKprobe);
      l.size = f.size;
    }
    c.fields.push_back(std::move(l));
  }
  c.print_fmt = fmt + "\"" + args;
  uint32_t end = 8;
  for (const SynthField& f : ev.fields) end = f.offset + (f.is_string && !f.is_dynamic ? kSynthStringMax : 8);
  c.program.header_size = 8;
  c.program.fixed_size = end;
  c.program.nargs = static_cast<uint32_t>(ev.fields.size());
  return c;
}

}  // namespace probefs::events
