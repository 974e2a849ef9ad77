#include "events/filter.h"

#include <cstring>

#include "events/kstrto.h"

namespace probefs::events {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}
bool is_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

constexpr size_t kMaxFilterStrVal = 256;  // a quoted operand must be shorter
constexpr size_t kNumBufSize = 24;        // "0xfeedfacedeadbeef" and then some

// A field a filter can name.
struct FieldRef {
  FilterInsn::Source source;
  uint32_t offset = 0;
  uint8_t size = 0;
  bool is_signed = false;
  bool is_string() const {
    return source == FilterInsn::kRecordString || source == FilterInsn::kComm;
  }
};

// The kernel looks in its generic fields first, then the common ones, then the event's.
bool find_field(const CompiledEvent& ev, std::string_view name, FieldRef* f) {
  if (name == "CPU" || name == "cpu" || name == "common_cpu") {
    *f = {FilterInsn::kCpu, 0, 4, true};
    return true;
  }
  if (name == "COMM" || name == "comm" || name == "common_comm") {
    *f = {FilterInsn::kComm, 0, 0, false};
    return true;
  }
  struct Common {
    const char* name;
    uint32_t offset;
    uint8_t size;
    bool is_signed;
  };
  static const Common kCommon[] = {{"common_type", 0, 2, false},
                                   {"common_flags", 2, 1, false},
                                   {"common_preempt_count", 3, 1, false},
                                   {"common_pid", 4, 4, true}};
  for (const Common& c : kCommon) {
    if (name == c.name) {
      *f = {FilterInsn::kRecordNumber, c.offset, c.size, c.is_signed};
      return true;
    }
  }
  if (ev.synthetic) {
    // no probe fields
  } else if (ev.is_return) {
    if (name == "__probe_func") return *f = {FilterInsn::kRecordNumber, 8, 8, false}, true;
    if (name == "__probe_ret_ip") return *f = {FilterInsn::kRecordNumber, 16, 8, false}, true;
  } else if (name == "__probe_ip") {
    return *f = {FilterInsn::kRecordNumber, 8, 8, false}, true;
  }
  for (const FieldLayout& fl : ev.fields) {
    if (name == fl.name) {
      if (fl.type->is_string && !fl.count) {
        *f = {FilterInsn::kRecordString, fl.offset, 4, false};
      } else {
        // Arrays compare as one number of the array's whole size, as the kernel does; a
        // size above 8 has no comparison and is kept as 0 so that it never matches.
        uint8_t size = fl.size <= 8 ? static_cast<uint8_t>(fl.size) : 0;
        *f = {FilterInsn::kRecordNumber, fl.offset, size, fl.type->is_signed};
      }
      return true;
    }
  }
  return false;
}

struct Parser {
  std::string_view s;
  const CompiledEvent& ev;
  CompiledFilter* out;
  Diagnostic* err;
  size_t i = 0;
  uint32_t depth = 0;

  bool fail(ErrorCode code, int pos, int errnum = 0) {
    err->code = code;
    err->err = errnum ? errnum : error_errno(code);
    err->pos = pos;
    return false;
  }

  void skip() {
    while (i < s.size() && is_space(s[i])) ++i;
  }
  char at(size_t k) const { return k < s.size() ? s[k] : '\0'; }

  void emit(FilterInsn in) {
    // Postfix depth: a predicate pushes, a binary operator pops one, NOT keeps it.
    if (in.kind == FilterInsn::kPred) ++depth;
    if (in.kind == FilterInsn::kAnd || in.kind == FilterInsn::kOr) --depth;
    if (depth > out->max_depth) out->max_depth = depth;
    out->insns.push_back(in);
  }

  bool parse_or() {
    if (!parse_and()) return false;
    for (;;) {
      skip();
      if (at(i) == '|' && at(i + 1) == '|') {
        i += 2;
        if (!parse_and()) return false;
        FilterInsn op;
        op.kind = FilterInsn::kOr;
        emit(op);
      } else {
        return true;
      }
    }
  }

  bool parse_and() {
    if (!parse_unary()) return false;
    for (;;) {
      skip();
      if (at(i) == '&' && at(i + 1) == '&') {
        i += 2;
        if (!parse_unary()) return false;
        FilterInsn op;
        op.kind = FilterInsn::kAnd;
        emit(op);
      } else {
        return true;
      }
    }
  }

  bool parse_unary() {
    skip();
    if (at(i) == '!' && at(i + 1) != '=' && at(i + 1) != '~') {  // "!=" and "!~" are not NOTs
      ++i;
      if (!parse_unary()) return false;
      FilterInsn op;
      op.kind = FilterInsn::kNot;
      emit(op);
      return true;
    }
    if (at(i) == '(') {
      size_t open = i++;
      if (!parse_or()) return false;
      skip();
      if (at(i) != ')') return fail(ErrorCode::kFiltTooManyOpen, static_cast<int>(open));
      ++i;
      return after_term();
    }
    if (!parse_pred()) return false;
    return after_term();
  }

  // After a predicate or a closing parenthesis only ')', the end, "&&" or "||" may come.
  bool after_term() {
    skip();
    char c = at(i);
    if (c == '\0' || c == ')') return true;
    if ((c == '&' || c == '|') && at(i + 1) == c) return true;
    return fail(ErrorCode::kFiltTooManyPreds, static_cast<int>(i), EPERM);
  }

  // Positions inside a predicate are the kernel's: one past the predicate's start, plus
  // the index inside it.
  bool parse_pred() {
    size_t start = i;
    int base = static_cast<int>(start) + 1;
    size_t j = i;
    while (j < s.size() && (is_alnum(s[j]) || s[j] == '_')) ++j;
    if (j == start) return fail(ErrorCode::kFiltErrno, 0, EPERM);  // "Error: (0)"
    FieldRef field;
    if (!find_field(ev, s.substr(start, j - start), &field))
      return fail(ErrorCode::kFiltFieldNotFound, base + static_cast<int>(j - start));
    i = j;
    skip();
    static const struct {
      const char* text;
      FilterOp op;
    } kOps[] = {{"~", FilterOp::kGlob}, {"!=", FilterOp::kNe}, {"==", FilterOp::kEq},
                {"<=", FilterOp::kLe},  {"<", FilterOp::kLt},  {">=", FilterOp::kGe},
                {">", FilterOp::kGt},   {"&", FilterOp::kBand}};
    FilterInsn pred;
    bool found = false;
    for (const auto& o : kOps) {
      size_t n = std::strlen(o.text);
      if (s.substr(i, n) == o.text) {
        pred.op = o.op;
        i += n;
        found = true;
        break;
      }
    }
    if (!found) return fail(ErrorCode::kFiltInvalidOp, base + static_cast<int>(i - start));
    skip();
    size_t v = i;
    int vpos = base + static_cast<int>(v - start);
    pred.source = field.source;
    pred.offset = field.offset;
    pred.size = field.size;
    pred.is_signed = field.is_signed;
    char c = at(v);
    if (c == '"' || c == '\'') {
      if (pred.op != FilterOp::kEq && pred.op != FilterOp::kNe && pred.op != FilterOp::kGlob)
        return fail(ErrorCode::kFiltIllegalFieldOp, vpos);
      if (!field.is_string()) return fail(ErrorCode::kFiltExpectDigit, vpos);
      // The operand ends at the next quote of its kind: there is no escaping.
      size_t m = v + 1;
      while (m < s.size() && s[m] != c) ++m;
      int mpos = base + static_cast<int>(m - start);
      if (m >= s.size()) return fail(ErrorCode::kFiltMissingQuote, mpos);
      std::string_view pat = s.substr(v + 1, m - v - 1);
      if (pat.size() >= kMaxFilterStrVal) return fail(ErrorCode::kFiltOperandTooLong, mpos);
      pred.negate = pred.op == FilterOp::kNe;
      if (pred.op == FilterOp::kGlob && !pat.empty() && pat[0] == '!') {
        pred.negate = !pred.negate;
        pat.remove_prefix(1);
      }
      pred.pattern = static_cast<uint32_t>(out->patterns.size());
      pred.pattern_len = static_cast<uint32_t>(pat.size());
      out->patterns += pat;
      i = m + 1;
    } else if ((c >= '0' && c <= '9') || c == '-') {
      if (field.is_string()) return fail(ErrorCode::kFiltExpectString, vpos);
      if (pred.op == FilterOp::kGlob) return fail(ErrorCode::kFiltIllegalFieldOp, vpos);
      size_t m = v;
      if (at(m) == '-') ++m;
      while (m < s.size() && is_alnum(s[m])) ++m;
      std::string_view num = s.substr(v, m - v);
      if (num.size() >= kNumBufSize)
        return fail(ErrorCode::kFiltOperandTooLong, base + static_cast<int>(m - start));
      bool ok;
      if (field.is_signed) {
        int64_t x = 0;
        ok = kstrtoll(num, 0, &x);
        pred.value = static_cast<uint64_t>(x);
      } else {
        ok = kstrtoull(num, 0, &pred.value);
      }
      if (!ok) return fail(ErrorCode::kFiltIllegalIntval, vpos);
      pred.negate = pred.op == FilterOp::kNe;
      i = m;
    } else {
      return fail(ErrorCode::kFiltInvalidValue, vpos);
    }
    emit(pred);
    return true;
  }
};

// Quotes and parentheses are checked over the whole text first, as the kernel does, so
// these errors win over anything inside. Their errno values are the kernel's: it returns
// its internal codes -1, -2, -3 as they are (EPERM, ENOENT, ESRCH).
bool check_balance(std::string_view s, Diagnostic* err) {
  char quote = 0;
  size_t last_quote = 0;
  std::vector<size_t> opens;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
      last_quote = i;
    } else if (c == '(') {
      opens.push_back(i);
    } else if (c == ')') {
      if (opens.empty()) {
        err->code = ErrorCode::kFiltTooManyClose;
        err->err = EPERM;
        err->pos = static_cast<int>(i);
        return false;
      }
      opens.pop_back();
    }
  }
  if (quote) {
    err->code = ErrorCode::kFiltMissingQuote;
    err->err = ESRCH;
    err->pos = static_cast<int>(last_quote);
    return false;
  }
  if (!opens.empty()) {
    err->code = ErrorCode::kFiltTooManyOpen;
    err->err = error_errno(err->code);
    err->pos = static_cast<int>(opens.back());  // the rightmost '(' left open
    return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Hit-path helpers: no library calls. The empty asm keeps the compiler from turning the
// loops into memcmp/strnlen calls.
__attribute__((always_inline)) inline bool bytes_equal(const char* a, const char* b,
                                                       uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    asm("" : "+r"(i));
    if (a[i] != b[i]) return false;
  }
  return true;
}

__attribute__((always_inline)) inline uint32_t cstr_len(const char* s, uint32_t max) {
  uint32_t n = 0;
  while (n < max && s[n]) {
    asm("" : "+r"(n));
    ++n;
  }
  return n;
}

__attribute__((always_inline)) inline bool class_match(const char* pat, uint32_t pat_len,
                                                       uint32_t* pi, char c) {
  // pat[*pi] is '['. On success *pi is past the closing ']'.
  uint32_t p = *pi + 1;
  bool negate = false;
  if (p < pat_len && pat[p] == '!') {
    negate = true;
    ++p;
  }
  bool match = false;
  bool first = true;
  while (p < pat_len && (first || pat[p] != ']')) {
    first = false;
    char lo = pat[p];
    if (p + 2 < pat_len && pat[p + 1] == '-' && pat[p + 2] != ']') {
      char hi = pat[p + 2];
      if (c >= lo && c <= hi) match = true;
      p += 3;
    } else {
      if (c == lo) match = true;
      ++p;
    }
  }
  if (p >= pat_len) {  // a '[' without its ']' is an ordinary character
    if (c != '[') return false;
    *pi += 1;
    return true;
  }
  *pi = p + 1;
  return match != negate;
}

}  // namespace

bool glob_match(const char* pat, uint32_t pat_len, const char* s, uint32_t s_len) {
  uint32_t pi = 0, si = 0;
  uint32_t star_p = ~0u, star_s = 0;
  while (si < s_len) {
    if (pi < pat_len) {
      char pc = pat[pi];
      if (pc == '*') {
        star_p = ++pi;
        star_s = si;
        continue;
      }
      if (pc == '?') {
        ++pi;
        ++si;
        continue;
      }
      if (pc == '[') {
        uint32_t np = pi;
        if (class_match(pat, pat_len, &np, s[si])) {
          pi = np;
          ++si;
          continue;
        }
      } else {
        if (pc == '\\' && pi + 1 < pat_len) pc = pat[++pi];
        if (pc == s[si]) {
          ++pi;
          ++si;
          continue;
        }
      }
    }
    if (star_p == ~0u) return false;
    pi = star_p;
    si = ++star_s;
  }
  while (pi < pat_len && pat[pi] == '*') ++pi;
  return pi == pat_len;
}

bool compile_filter(std::string_view text, const CompiledEvent& ev, CompiledFilter* out,
                    Diagnostic* err) {
  text = trim(text);
  *err = Diagnostic{};
  err->subsystem = kLogFilter;
  err->command = std::string(text);
  CompiledFilter f;
  f.text = std::string(text);
  if (text.empty()) {
    err->code = ErrorCode::kFiltErrno;
    err->err = EINVAL;
    err->pos = 0;
    return false;
  }
  if (!check_balance(text, err)) return false;
  Parser p{text, ev, &f, err};
  if (!p.parse_or()) return false;
  p.skip();
  if (p.i != text.size())
    return p.fail(ErrorCode::kFiltTooManyPreds, static_cast<int>(p.i), EPERM);
  if (f.max_depth > kMaxFilterDepth) return p.fail(ErrorCode::kFiltTooManyPreds, 0);
  *out = std::move(f);
  *err = Diagnostic{};
  return true;
}

bool filter_match(const CompiledFilter& f, const uint8_t* rec, uint32_t len,
                  const FilterContext& ctx) {
  bool stack[kMaxFilterDepth];
  uint32_t sp = 0;
  const char* patterns = f.patterns.data();
  for (const FilterInsn& in : f.insns) {
    switch (in.kind) {
      case FilterInsn::kAnd:
        --sp;
        stack[sp - 1] = stack[sp - 1] && stack[sp];
        continue;
      case FilterInsn::kOr:
        --sp;
        stack[sp - 1] = stack[sp - 1] || stack[sp];
        continue;
      case FilterInsn::kNot:
        stack[sp - 1] = !stack[sp - 1];
        continue;
      case FilterInsn::kPred:
        break;
    }
    bool r = false;
    if (in.source == FilterInsn::kRecordString || in.source == FilterInsn::kComm) {
      const char* str = "";
      uint32_t n = 0;
      if (in.source == FilterInsn::kComm) {
        str = ctx.comm ? ctx.comm : "";
        n = cstr_len(str, 16);
      } else if (in.offset <= len && len - in.offset >= 4) {  // no wrap on a bad offset
        uint32_t loc;
        __builtin_memcpy(&loc, rec + in.offset, 4);
        uint32_t slen = loc >> 16, off = loc & 0xffff;
        // Inside the record and no longer than a fetched string can be (the record
        // writer's bound, record.h): a hostile __data_loc costs the glob at most that.
        if (slen && slen <= static_cast<uint32_t>(kMaxStringSize) && off < len &&
            slen <= len - off) {
          str = reinterpret_cast<const char*>(rec + off);
          n = cstr_len(str, slen);
        }
      }
      const char* pat = patterns + in.pattern;
      if (in.op == FilterOp::kGlob)
        r = glob_match(pat, in.pattern_len, str, n);
      else
        r = n == in.pattern_len && bytes_equal(str, pat, n);
    } else {
      uint64_t v = 0;
      bool sized = true;
      if (in.source == FilterInsn::kCpu) {
        v = ctx.cpu;
      } else if (in.offset <= len && len - in.offset >= in.size) {  // no wrap on a bad offset
        switch (in.size) {
          case 1: v = rec[in.offset]; break;
          case 2: { uint16_t x; __builtin_memcpy(&x, rec + in.offset, 2); v = x; break; }
          case 4: { uint32_t x; __builtin_memcpy(&x, rec + in.offset, 4); v = x; break; }
          case 8: __builtin_memcpy(&v, rec + in.offset, 8); break;
          default: sized = false; break;
        }
      } else {
        sized = false;
      }
      if (!sized) {
        // The kernel has no comparison for this size: the predicate is false, even for
        // "!=".
        stack[sp++] = false;
        continue;
      }
      {
        // Both sides in the field's own type, as the kernel compares them: the operand
        // is cut to the field's width, and signed fields compare signed.
        unsigned size = in.source == FilterInsn::kCpu ? 4u : in.size;  // sized: 1, 2, 4, 8
        unsigned shift = 64 - size * 8u;
        uint64_t uv = (v << shift) >> shift, uval = (in.value << shift) >> shift;
        int64_t sv = static_cast<int64_t>(v << shift) >> shift;
        int64_t sval = static_cast<int64_t>(in.value << shift) >> shift;
        switch (in.op) {
          case FilterOp::kEq:
          case FilterOp::kNe: r = uv == uval; break;
          case FilterOp::kBand: r = in.source != FilterInsn::kCpu && (uv & uval) != 0; break;
          case FilterOp::kLt: r = in.is_signed ? sv < sval : uv < uval; break;
          case FilterOp::kLe: r = in.is_signed ? sv <= sval : uv <= uval; break;
          case FilterOp::kGt: r = in.is_signed ? sv > sval : uv > uval; break;
          case FilterOp::kGe: r = in.is_signed ? sv >= sval : uv >= uval; break;
          case FilterOp::kGlob: r = false; break;
        }
      }
    }
    stack[sp++] = r != in.negate;
  }
  return sp ? stack[sp - 1] : true;
}

std::string filter_error_text(const Diagnostic& err) {
  std::string s = err.command;
  if (err.code == ErrorCode::kFiltErrno) return s + "\nError: (0)\n\n";
  int pos = err.pos;
  if (pos > static_cast<int>(err.command.size())) pos = static_cast<int>(err.command.size());
  s += "\n";
  s.append(static_cast<size_t>(pos), ' ');
  s += "^\nparse_error: ";
  s += err.message();
  s += "\n\n";
  return s;
}

Diagnostic subsystem_filter_error(std::string_view text) {
  Diagnostic d;
  d.code = ErrorCode::kFiltBadSubsysFilter;
  d.err = EINVAL;
  d.pos = 0;
  d.command = std::string(trim(text));
  d.subsystem = kLogFilter;
  return d;
}

}  // namespace probefs::events
