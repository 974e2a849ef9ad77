// perf probe's probe definitions and -L ranges, parsed the way perf 6.1 parses them (see
// probe_spec.h), with perf's messages; and perf's glob matching.
#include "tools/probe_spec.h"

#include "tools/cxx_names.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace probefs::tools {
namespace {

constexpr size_t kMaxProbeArgs = 128;     // perf's MAX_PROBE_ARGS
constexpr size_t kMaxEventNameLen = 63;   // the kernel's MAX_EVENT_NAME_LEN, less its NUL
constexpr size_t npos = std::string_view::npos;

Error semantic_error(std::string message, int code = -EINVAL) {
  return make_error(code, "Semantic error :" + message);
}

bool is_c_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }

bool is_c_name(std::string_view s) {
  if (s.empty() || !is_c_name_start(s[0])) return false;
  for (char c : s.substr(1)) {
    if (!is_c_name_start(c) && !std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)); }

// The first character of SET at or after FROM that no backslash right before it escapes.
size_t find_unescaped(std::string_view s, std::string_view set, size_t from = 0) {
  for (size_t i = s.find_first_of(set, from); i != npos; i = s.find_first_of(set, i + 1)) {
    if (i == 0 || s[i - 1] != '\\') return i;
  }
  return npos;
}

// Drops each escaping backslash (and a lone one at the end).
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\') ++i;
    if (i < s.size()) out += s[i];
  }
  return out;
}

// A number as perf reads one with strtoul(TEXT, &end, 0) and *end == '\0': C literal
// syntax, an optional sign, and "" as 0.
bool parse_whole_ulong(std::string_view text, unsigned long* value) {
  std::string s(text);
  char* end = nullptr;
  *value = std::strtoul(s.c_str(), &end, 0);
  return *end == '\0';
}

// A number as perf's -L reads one with strtol(..., 0): at least one digit, no overflow.
// Advances TEXT past it.
bool parse_leading_long(std::string_view* text, long* value) {
  std::string s(*text);
  char* end = nullptr;
  errno = 0;
  *value = std::strtol(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str()) return false;
  text->remove_prefix(static_cast<size_t>(end - s.c_str()));
  return true;
}

// Where an [[GROUP:]EVENT=] prefix of TEXT ends (after its '='), or 0 without one. Strict
// (C names only) so that a C++ name's "operator=" or "::" is never taken for one.
size_t event_prefix_end(std::string_view text) {
  size_t i = 0;
  for (int part = 0; part < 2; ++part) {
    const size_t start = i;
    while (i < text.size() && (is_c_name_start(text[i]) || (i > start && std::isdigit(static_cast<unsigned char>(text[i])))))
      ++i;
    if (i == start) return 0;
    if (i < text.size() && text[i] == '=') return i + 1;
    if (part == 0 && i < text.size() && text[i] == ':' && (i + 1 >= text.size() || text[i + 1] != ':'))
      ++i;
    else
      return 0;
  }
  return 0;
}

// The words of a spec: split at blanks, except that a C++ name in the first word keeps the
// blanks inside its brackets and its qualifiers ("price(shop::Order const&, int) const").
std::vector<std::string_view> split_words(std::string_view text) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < text.size() && is_space(text[i])) ++i;
  {
    const size_t start = i;
    size_t first_end = start;
    while (first_end < text.size() && !is_space(text[first_end])) ++first_end;
    const size_t name_at = start + event_prefix_end(text.substr(start, first_end - start));
    const std::string_view head = text.substr(name_at, first_end - name_at);
    if (is_cxx_name(head.substr(0, find_unescaped(head, "+@%;")))) {
      i = name_at + cxx_name_end(text.substr(name_at));
      while (i < text.size() && !is_space(text[i])) ++i;  // :RLN, +OFF, %return, @SRC, ;PTN
      words.push_back(text.substr(start, i - start));
    }
  }
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i > start) words.push_back(text.substr(start, i - start));
  }
  return words;
}

Status check_name_length(std::string_view name, const char* what) {
  if (name.size() <= kMaxEventNameLen) return Ok{};
  return make_error(-E2BIG, std::string("Too long ") + what + " name (" + std::string(name) + ")");
}

// [GROUP:]EVENT, the part before '='.
Status parse_event_name(std::string_view text, ProbeSpec* spec) {
  size_t colon = find_unescaped(text, ":");
  std::string_view event = text;
  if (colon != npos) {
    std::string_view group = text.substr(0, colon);
    if (!is_c_name(group)) {
      return semantic_error(std::string(group) +
                            " is bad for event name -it must follow C symbol-naming rule.");
    }
    if (auto st = check_name_length(group, "group"); !st) return st;
    spec->group = group;
    event = text.substr(colon + 1);
  }
  if (!is_c_name(event)) {
    return semantic_error(std::string(event) +
                          " is bad for event name -it must follow C symbol-naming rule.");
  }
  if (auto st = check_name_length(event, "event"); !st) return st;
  spec->event = event;
  return Ok{};
}

// perf's "%[sdt_PROVIDER:]SDTEVENT" and "sdt_PROVIDER:SDTEVENT": read from the binary's
// SDT notes (tools/sdt_notes.h), where perf reads its probe cache.
bool is_sdt_event(std::string_view word) {
  return word.starts_with('%') || (word.starts_with("sdt_") && word.find(':') != npos &&
                                   word.find('=') == npos);
}

Status parse_point(std::string_view word, ProbeSpec* spec) {
  if (is_sdt_event(word)) {
    std::string_view body = word.starts_with('%') ? word.substr(1) : word;
    size_t special = find_unescaped(body, ";=@+%");
    if (special != npos && body[special] != '@') {
      return semantic_error(std::string(body) + " must be an SDT name.");
    }
    if (special != npos)  // SDTEVENT@BUILDID: an entry of perf's cache, which is not read
      return make_error(-EOPNOTSUPP, "Cached probes are not supported: " + std::string(word));
    const size_t colon = body.find(':');
    std::string_view provider = colon == npos ? std::string_view() : body.substr(0, colon);
    const std::string_view name = colon == npos ? body : body.substr(colon + 1);
    if (!provider.empty()) {
      if (!provider.starts_with("sdt_")) return semantic_error(std::string(body) + " must be an SDT name.");
      provider.remove_prefix(4);
    }
    if (name.empty() || (colon != npos && provider.empty()))
      return semantic_error(std::string(body) + " must be an SDT name.");
    spec->point.sdt = true;
    spec->point.sdt_provider = std::string(provider);
    spec->point.sdt_name = std::string(name);
    return Ok{};
  }

  std::string_view rest = word;
  // A C++ name (beyond perf): the separators are looked for after it only.
  const size_t prefix = event_prefix_end(rest);
  const std::string_view after_prefix = rest.substr(prefix);
  const bool cxx = is_cxx_name(after_prefix.substr(0, cxx_name_end(after_prefix)));
  if (cxx) {
    if (prefix != 0) {
      if (auto st = parse_event_name(rest.substr(0, prefix - 1), spec); !st) return st;
      rest.remove_prefix(prefix);
    }
  } else if (size_t special = find_unescaped(rest, ";=@+%"); special != npos && rest[special] == '=') {
    if (auto st = parse_event_name(rest.substr(0, special), spec); !st) return st;
    rest.remove_prefix(special + 1);
  }

  // perf's rule for telling "prog.c:12" (a file) from "main:12" (a function).
  bool file_spec = false;
  if (!cxx && find_unescaped(rest, "+@%") == npos) {
    size_t sep = find_unescaped(rest, ";:");
    file_spec = sep != npos && rest.substr(0, sep).find('.') != npos;
  }

  ProbePoint& pp = spec->point;
  constexpr std::string_view kSeparators = ";:+@%";
  size_t sep = find_unescaped(rest, kSeparators, cxx ? cxx_name_end(rest) : 0);
  std::string head = unescape(rest.substr(0, sep));
  bool has_file = false;
  if (file_spec) {
    pp.file = head;
    has_file = true;
  } else {
    pp.function = head;
    if (head.starts_with("0x")) {
      char* end = nullptr;
      errno = 0;
      pp.address = std::strtoull(head.c_str(), &end, 0);
      if (*end != '\0' || errno != 0) {
        return semantic_error("Invalid absolute address.");
      }
      pp.has_address = true;
    }
  }

  unsigned long line = 0;
  unsigned long offset = 0;
  while (sep != npos) {
    char kind = rest[sep];
    size_t start = sep + 1;
    if (kind == ';') {  // the lazy pattern is all the rest, escapes and all
      pp.lazy = rest.substr(start);
      pp.has_lazy = true;
      break;
    }
    sep = find_unescaped(rest, kSeparators, start);
    std::string_view value = rest.substr(start, sep == npos ? npos : sep - start);
    switch (kind) {
      case ':':
        if (!parse_whole_ulong(value, &line)) {
          return semantic_error("There is non-digit char in line number.");
        }
        break;
      case '+':
        if (!parse_whole_ulong(value, &offset)) {
          return semantic_error("There is non-digit character in offset.");
        }
        break;
      case '@':
        if (has_file) return semantic_error("SRC@SRC is not allowed.");
        pp.file = unescape(value);
        has_file = true;
        break;
      case '%':
        if (value != "return") {
          return semantic_error("%" + std::string(value) + " is not supported.", -EOPNOTSUPP);
        }
        pp.retprobe = true;
        break;
    }
  }
  // perf keeps the line in an int: "-11" is line -11.
  pp.line = static_cast<int>(line);
  pp.has_line = pp.line != 0;
  pp.offset = offset;
  pp.has_offset = offset != 0;

  if (pp.has_lazy && pp.has_line) {
    return semantic_error("Lazy pattern can't be used with line number.");
  }
  if (pp.has_lazy && pp.has_offset) {
    return semantic_error("Lazy pattern can't be used with offset.");
  }
  if (pp.has_line && pp.has_offset) {
    return semantic_error("Offset can't be used with line number.");
  }
  if (!pp.has_line && !pp.has_lazy && has_file && pp.function.empty()) {
    return semantic_error("File always requires line number or lazy pattern.");
  }
  if (pp.has_offset && pp.function.empty()) {
    return semantic_error("Offset requires an entry function.");
  }
  if ((pp.has_offset || pp.has_line || pp.has_lazy) && pp.retprobe) {
    return semantic_error("Offset/Line/Lazy pattern can't be used with return probe.");
  }
  // perf takes these and fails later, or crashes (";PTN").
  if (pp.function.empty() && pp.file.empty()) {
    return make_error(-EINVAL, "No function or source file is given: " + std::string(word));
  }
  return Ok{};
}

// [NAME=]VAR[->FIELD|.FIELD|[N]]...[@user][:TYPE], or a raw fetch argument.
Result<ProbeArg> parse_arg(std::string_view word) {
  ProbeArg arg;
  arg.text = word;
  auto parse_error = [](std::string_view what) {
    return semantic_error("Argument parse error: " + std::string(what));
  };
  std::string_view s = word;
  if (size_t eq = s.find('='); eq != npos) {
    arg.name = s.substr(0, eq);
    s.remove_prefix(eq + 1);
    if (arg.name.empty()) return parse_error(word);
  }
  // perf sees "@user" only at the very end, so "v@user:u8" is a variable "v@user".
  if (size_t at = s.find('@'); at != npos && at != 0 && s.substr(at + 1) == "user") {
    arg.user_access = true;
    s = s.substr(0, at);
  }
  if (size_t colon = s.find(':'); colon != npos) {
    arg.type = s.substr(colon + 1);
    s = s.substr(0, colon);
    if (arg.type.empty()) return parse_error(word);
  }
  if (s.empty()) return parse_error(word);

  constexpr std::string_view kFieldStarts = "-.[";
  size_t pos = s.find_first_of(kFieldStarts);
  if (!is_c_name_start(s[0]) || pos == npos) {
    arg.var = s;
    return arg;
  }
  arg.var = s.substr(0, pos);
  size_t component = 0;  // where the component perf names in "Argument parse error" starts
  while (pos < s.size()) {
    ArgField field;
    size_t name_start = 0;
    if (s[pos] == '[') {
      component = pos;
      std::string index(s.substr(pos + 1));
      char* end = nullptr;
      field.kind = ArgField::Kind::kIndex;
      field.index = std::strtol(index.c_str(), &end, 0);
      if (end == index.c_str() || *end != ']') {
        return semantic_error("Array index must be a number.");
      }
      pos += 2 + static_cast<size_t>(end - index.c_str());
      arg.fields.push_back(field);
      continue;
    }
    if (s[pos] == '.') {
      field.kind = ArgField::Kind::kDot;
      name_start = pos + 1;
    } else if (s.substr(pos, 2) == "->") {
      field.kind = ArgField::Kind::kArrow;
      name_start = pos + 2;
    } else {
      return parse_error(s.substr(component));
    }
    pos = std::min(s.find_first_of(kFieldStarts, name_start), s.size());
    field.name = s.substr(name_start, pos - name_start);
    component = name_start;
    arg.fields.push_back(field);
  }
  return arg;
}

bool match_class(std::string_view pattern, size_t* p, char c);

// Matches one pattern element at *P (not '*') against C, and moves *P past it.
bool match_element(std::string_view pattern, size_t* p, char c) {
  char e = pattern[*p];
  if (e == '?') {
    ++*p;
    return true;
  }
  if (e == '[') return match_class(pattern, p, c);
  if (e == '\\') {
    if (*p + 1 >= pattern.size()) return false;
    ++*p;
  }
  return pattern[(*p)++] == c;
}

// "[...]" at *P. The first character (after '!') is always a member, so "[]]" holds ']'.
bool match_class(std::string_view pattern, size_t* p, char c) {
  size_t first = *p + 1;
  bool negate = first < pattern.size() && pattern[first] == '!';
  if (negate) ++first;
  size_t close = first < pattern.size() ? pattern.find(']', first + 1) : npos;
  if (close == npos) return false;
  bool hit = false;
  for (size_t i = first; i < close && !hit; ++i) {
    if (i > first && pattern[i] == '-' && i + 1 < close) {
      char lo = pattern[i - 1], hi = pattern[i + 1];
      if (lo > hi) return false;
      hit = lo <= c && c <= hi;
      ++i;
    } else {
      hit = pattern[i] == c;
    }
  }
  *p = close + 1;
  return hit != negate;
}

}  // namespace

bool ProbeArg::is_variable() const { return !var.empty() && is_c_name_start(var[0]); }

bool ProbeArg::is_raw() const { return !is_variable() && var != "$params" && var != "$vars"; }

Result<ProbeSpec> parse_probe_spec(std::string_view text) {
  ProbeSpec spec;
  spec.text = text;
  std::vector<std::string_view> words = split_words(text);
  if (words.size() > kMaxProbeArgs + 1) {
    return semantic_error("Too many probe arguments (" + std::to_string(words.size() - 1) + ").",
                          -ERANGE);
  }
  if (words.empty()) return make_error(-EINVAL, "No probe point is given.");
  if (auto st = parse_point(words[0], &spec); !st) return st.error();
  for (size_t i = 1; i < words.size(); ++i) {
    Result<ProbeArg> arg = parse_arg(words[i]);
    if (!arg) return arg.error();
    if (arg->is_variable() && spec.point.retprobe) {
      return semantic_error("You can't specify local variable for kretprobe.");
    }
    spec.args.push_back(std::move(*arg));
  }
  return spec;
}

Result<LineRange> parse_line_range(std::string_view text) {
  LineRange range;
  std::string_view name = text;
  // perf 6.1 splits -L at the first ':' whether escaped or not; a C++ name (beyond perf)
  // at the first ':' after it.
  const size_t cxx_end = is_cxx_name(text.substr(0, cxx_name_end(text))) ? cxx_name_end(text) : 0;
  if (size_t colon = text.find(':', cxx_end); colon != npos) {
    name = text.substr(0, colon);
    std::string_view rest = text.substr(colon + 1);
    if (!parse_leading_long(&rest, &range.start)) {
      return semantic_error("'start line' is not a valid number.");
    }
    if (rest.starts_with('+') || rest.starts_with('-')) {
      bool count = rest[0] == '+';
      rest.remove_prefix(1);
      if (!parse_leading_long(&rest, &range.end)) {
        return semantic_error("'end line' is not a valid number.");
      }
      if (count) range.end += range.start - 1;
      range.has_end = true;
      if (range.start > range.end) {
        return semantic_error("Start line must be smaller than end line.");
      }
    }
    if (!rest.empty()) {
      return semantic_error("Tailing with invalid str '" + std::string(rest) + "'.");
    }
  }
  std::string_view function;
  if (cxx_end != 0) {
    function = name.substr(0, cxx_end);
    if (name.size() > cxx_end && name[cxx_end] == '@') range.file = name.substr(cxx_end + 1);
    range.function = function;
    return range;
  }
  if (size_t at = name.find('@'); at != npos) {
    function = name.substr(0, at);
    range.file = name.substr(at + 1);
  } else if (name.find_first_of("/.") != npos) {
    range.file = name;
    return range;
  } else {
    function = name;
  }
  if (!is_c_name(function)) {
    return semantic_error("'" + std::string(function) + "' is not a valid function name.");
  }
  range.function = function;
  return range;
}

std::string sanitize_event_name(std::string_view text) {
  std::string out;
  if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))) out += '_';
  for (char c : text) {
    out += is_c_name_start(c) || std::isdigit(static_cast<unsigned char>(c)) ? c : '_';
  }
  return out;
}

// Backtracks to the last '*' only: enough, since what follows a '*' matches no empty text.
bool glob_match(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0;
  size_t star = npos, star_n = 0;  // just after the last '*', and where it began to match
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = ++p;
      star_n = n;
      continue;
    }
    size_t next = p;
    if (p < pattern.size() && match_element(pattern, &next, name[n])) {
      p = next;
      ++n;
      continue;
    }
    if (star == npos) return false;
    p = star;
    n = ++star_n;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace probefs::tools
