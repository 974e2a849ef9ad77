#include "events/parse.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "arch/regs.h"
#include "events/kstrto.h"

namespace probefs::events {
namespace {

// ---------------------------------------------------------------------------------------
// Character classes and names (numbers: kstrto.h).

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }

// The lenient kind: as many digits as there are, no overflow check; *end after them.
uint64_t simple_strtoul(std::string_view s, size_t* end) {
  unsigned base = 0;
  size_t i = fixup_radix(s, &base);
  uint64_t v = 0;
  for (; i < s.size(); ++i) {
    int d = digit_value(s[i]);
    if (d >= static_cast<int>(base)) break;
    v = v * base + static_cast<uint64_t>(d);
  }
  *end = i;
  return v;
}

bool is_good_name(std::string_view n) {
  if (n.empty() || (!is_alpha(n[0]) && n[0] != '_')) return false;
  for (char c : n.substr(1))
    if (!is_alnum(c) && c != '_') return false;
  return true;
}

// Group names also take '-' (the captures accept `bad-grp`).
bool is_good_system_name(std::string_view n) {
  if (n.empty() || (!is_alpha(n[0]) && n[0] != '_')) return false;
  for (char c : n.substr(1))
    if (!is_alnum(c) && c != '_' && c != '-') return false;
  return true;
}

// ---------------------------------------------------------------------------------------
// Commands and positions.

std::vector<std::string> split_argv(std::string_view line) {
  size_t hash = line.find('#');
  if (hash != std::string_view::npos) line = line.substr(0, hash);
  std::vector<std::string> argv;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    size_t s = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (i > s) argv.emplace_back(line.substr(s, i - s));
  }
  return argv;
}

std::string join_argv(const std::vector<std::string>& argv) {
  std::string out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (i) out += ' ';
    out += argv[i];
  }
  return out;
}

// The kernel's caret rule: the start of argv[index] plus offset; an index past the last
// argument points one past the end of the command.
int caret_position(const std::vector<std::string>& argv, int index, int offset) {
  int pos = 0, len = 0;
  for (int i = 0; i < static_cast<int>(argv.size()); ++i) {
    if (i == index) pos = len;
    len += static_cast<int>(argv[i].size()) + 1;
  }
  if (index >= static_cast<int>(argv.size())) return len;
  return pos + offset;
}

// Collects the one error of a parse, positioned against argv[index].
struct Log {
  const std::vector<std::string>* argv;
  std::string_view subsystem;
  int index = 0;
  Diagnostic diag;

  int err(int offset, ErrorCode code, int errnum = 0) {
    diag.code = code;
    diag.err = errnum ? errnum : error_errno(code);
    diag.pos = caret_position(*argv, index, offset);
    diag.command = join_argv(*argv);
    diag.subsystem = subsystem;
    return -diag.err;
  }
};

ParseResult not_mine() {
  ParseResult r;
  r.status = ParseStatus::kNotMine;
  r.error.err = EINVAL;
  return r;
}

ParseResult silent_error(int errnum) {
  ParseResult r;
  r.status = ParseStatus::kError;
  r.error.err = errnum;
  return r;
}

ParseResult logged_error(const Log& log) {
  ParseResult r;
  r.status = ParseStatus::kError;
  r.error = log.diag;
  return r;
}

ParseResult fail(Log& log, int offset, ErrorCode code) {
  log.err(offset, code);
  return logged_error(log);
}

// [GRP/]EVENT after "p:". `offset` is where `text` starts inside argv[0].
int parse_event_name(std::string_view text, int offset, std::string* group, std::string* event,
                     bool* given, Log& log) {
  size_t slash = text.find('/');
  if (slash == std::string_view::npos) slash = text.find('.');
  bool has_slash = slash != std::string_view::npos;
  if (has_slash) {
    if (slash == 0) return log.err(offset, ErrorCode::kNoGroupName);
    if (static_cast<int>(slash) + 1 > kMaxEventNameLen)
      return log.err(offset, ErrorCode::kGroupTooLong);
    std::string_view g = text.substr(0, slash);
    if (!is_good_system_name(g)) return log.err(offset, ErrorCode::kBadGroupName);
    *group = std::string(g);
    offset += static_cast<int>(slash) + 1;
    text = text.substr(slash + 1);
  }
  if (text.empty()) {
    if (has_slash) {
      *given = false;
      return 0;
    }
    return log.err(offset, ErrorCode::kNoEventName);
  }
  if (static_cast<int>(text.size()) >= kMaxEventNameLen)
    return log.err(offset, ErrorCode::kEventTooLong);
  if (!is_good_name(text)) return log.err(offset, ErrorCode::kBadEventName);
  *event = std::string(text);
  *given = true;
  return 0;
}

// ---------------------------------------------------------------------------------------
// Fetch arguments. The staged code is built in a fixed array of kFetchInsnMax slots, as
// the kernel does, so that "too much nested" and the other slot-limited errors trip at
// exactly the same depth.

struct ArgContext {
  ProbeSyntax syntax;
  bool is_return;
  bool fentry;            // kprobe syntax, on a function entry
  int offset = 0;         // where the current text starts inside this argv entry
  Log* log;
  ProbeDefinition* def;
  ProbeArg* parg;
};

}  // namespace

int register_offset(std::string_view name) {
  struct Reg {
    const char* name;
    size_t off;
  };
  static const Reg kRegs[] = {
      {"r15", offsetof(PtRegs, r15)}, {"r14", offsetof(PtRegs, r14)},
      {"r13", offsetof(PtRegs, r13)}, {"r12", offsetof(PtRegs, r12)},
      {"r11", offsetof(PtRegs, r11)}, {"r10", offsetof(PtRegs, r10)},
      {"r9", offsetof(PtRegs, r9)},   {"r8", offsetof(PtRegs, r8)},
      {"bx", offsetof(PtRegs, bx)},   {"cx", offsetof(PtRegs, cx)},
      {"dx", offsetof(PtRegs, dx)},   {"si", offsetof(PtRegs, si)},
      {"di", offsetof(PtRegs, di)},   {"bp", offsetof(PtRegs, bp)},
      {"ax", offsetof(PtRegs, ax)},   {"orig_ax", offsetof(PtRegs, orig_ax)},
      {"ip", offsetof(PtRegs, ip)},   {"cs", offsetof(PtRegs, cs)},
      {"flags", offsetof(PtRegs, flags)}, {"sp", offsetof(PtRegs, sp)},
      {"ss", offsetof(PtRegs, ss)},
  };
  for (const Reg& r : kRegs)
    if (name == r.name) return static_cast<int>(r.off);
  return -1;
}

namespace {

bool str_to_immediate(std::string_view s, uint64_t* imm) {
  if (s.empty()) return false;
  if (is_digit(s[0])) return kstrtoull(s, 0, imm);
  int64_t v;
  if (s[0] == '-') {
    if (!kstrtoll(s, 0, &v)) return false;
    *imm = static_cast<uint64_t>(v);
    return true;
  }
  if (s[0] == '+') {
    if (!kstrtoll(s.substr(1), 0, &v)) return false;
    *imm = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

using Code = std::vector<FetchInsn>;
constexpr int kEndSlot = kFetchInsnMax - 1;

int parse_probe_vars(const std::string& orig, Code& code, int* ci, ArgContext& ctx) {
  std::string_view arg = std::string_view(orig).substr(1);
  FetchInsn& c = code[*ci];
  ErrorCode e = ErrorCode::kBadVar;
  bool kernel = ctx.syntax == ProbeSyntax::kKprobe;

  if (arg.substr(0, 6) == "retval") {
    if (!ctx.is_return) return ctx.log->err(ctx.offset, ErrorCode::kRetvalOnProbe);
    c.op = FetchOp::kRetval;
    return 0;
  }
  if (arg.substr(0, 5) == "stack") {
    std::string_view rest = arg.substr(5);
    if (rest.empty()) {
      c.op = FetchOp::kStackP;
      return 0;
    }
    if (is_digit(rest[0])) {
      uint64_t n;
      if (!kstrtoull(rest, 10, &n)) return ctx.log->err(ctx.offset, e);
      if (kernel && n > static_cast<uint64_t>(kMaxStackParam))
        return ctx.log->err(ctx.offset, ErrorCode::kBadStackNum);
      if (n > 0xffffffffu) return ctx.log->err(ctx.offset, e);
      c.op = FetchOp::kStack;
      c.param = static_cast<uint32_t>(n);
      return 0;
    }
    return ctx.log->err(ctx.offset, e);
  }
  if (arg == "comm" || arg == "COMM") {
    c.op = FetchOp::kComm;
    return 0;
  }
  if (arg.substr(0, 3) == "arg") {
    uint64_t n;
    if (!kstrtoull(arg.substr(3), 10, &n)) return ctx.log->err(ctx.offset, e);
    if (n == 0 || n > static_cast<uint64_t>(kMaxStackParam))
      return ctx.log->err(ctx.offset, ErrorCode::kBadArgNum);
    if (ctx.fentry) {
      c.op = FetchOp::kArg;
      c.param = static_cast<uint32_t>(n - 1);
    } else if (kernel && ctx.is_return) {
      // The value is saved when the function is entered and read back at its return.
      if (n > ctx.def->entry_args) ctx.def->entry_args = static_cast<uint32_t>(n);
      c.op = FetchOp::kEntryData;
      c.param = static_cast<uint32_t>((n - 1) * 8);
    } else {
      return ctx.log->err(ctx.offset, ErrorCode::kNofentryArgs);
    }
    return 0;
  }
  return ctx.log->err(ctx.offset, e);
}

int parse_probe_arg(std::string arg, Code& code, int* ci, ArgContext& ctx) {
  int ret = 0;
  bool kernel = ctx.syntax == ProbeSyntax::kKprobe;
  if (arg.empty()) arg.push_back('\0');  // a lone "" is a bad fetch argument below
  switch (arg[0]) {
    case '$':
      ret = parse_probe_vars(arg, code, ci, ctx);
      break;
    case '%': {
      if (ctx.def->fprobe) {  // an fprobe sees a function's arguments, not its registers
        ret = ctx.log->err(ctx.offset, ErrorCode::kBadVar);
        break;
      }
      int off = register_offset(std::string_view(arg).substr(1));
      if (off >= 0) {
        code[*ci].op = FetchOp::kReg;
        code[*ci].param = static_cast<uint32_t>(off);
      } else {
        ret = ctx.log->err(ctx.offset, ErrorCode::kBadRegName);
      }
      break;
    }
    case '@': {
      int64_t offset = 0;
      if (arg.size() > 1 && is_digit(arg[1])) {
        uint64_t a;
        if (!kstrtoull(std::string_view(arg).substr(1), 0, &a)) {
          ret = ctx.log->err(ctx.offset, ErrorCode::kBadMemAddr);
          break;
        }
        code[*ci].op = FetchOp::kImm;
        code[*ci].imm = a;
      } else if (arg.size() > 1 && arg[1] == '+') {
        if (kernel) return ctx.log->err(ctx.offset, ErrorCode::kFileOnKprobe);
        if (!kstrtoll(std::string_view(arg).substr(2), 0, &offset)) {
          ret = ctx.log->err(ctx.offset, ErrorCode::kBadFileOffs);
          break;
        }
        code[*ci].op = FetchOp::kFileOffset;
        code[*ci].imm = static_cast<uint64_t>(offset);
        offset = 0;
      } else {
        if (!kernel) return ctx.log->err(ctx.offset, ErrorCode::kSymOnUprobe);
        code[*ci].op = FetchOp::kSymbol;
        ctx.parg->symbol = arg.substr(1);
        if (++*ci == kEndSlot) return ctx.log->err(ctx.offset, ErrorCode::kTooManyOps);
        code[*ci].op = FetchOp::kImm;
        code[*ci].imm = 0;
      }
      if (++*ci == kEndSlot) return ctx.log->err(ctx.offset, ErrorCode::kTooManyOps);
      code[*ci].op = FetchOp::kDeref;
      code[*ci].offset = offset;
      break;
    }
    case '+':
    case '-': {
      // Index arithmetic mirrors the kernel's pointer walk, including where its caret
      // lands for the "+u"/"-u" forms, so that positions match error_log exactly.
      FetchOp deref = FetchOp::kDeref;
      size_t a = 0;
      if (arg.size() > 1 && arg[1] == 'u') {
        deref = FetchOp::kUDeref;
        arg[1] = arg[0];
        a = 1;
      }
      if (arg[a] == '+') ++a;
      size_t open = arg.find('(', a);
      if (open == std::string::npos) return ctx.log->err(ctx.offset, ErrorCode::kDerefNeedBrace);
      int64_t offset;
      if (!kstrtoll(std::string_view(arg).substr(a, open - a), 0, &offset)) {
        ret = ctx.log->err(ctx.offset, ErrorCode::kBadDerefOffs);
        break;
      }
      ctx.offset += static_cast<int>(open + 1 - a) + (arg[a] != '-' ? 1 : 0);
      std::string inner = arg.substr(open + 1);
      size_t close = inner.rfind(')');
      if (close == std::string::npos)
        return ctx.log->err(ctx.offset + static_cast<int>(inner.size()),
                            ErrorCode::kDerefOpenBrace);
      inner.resize(close);  // anything after the last ')' is ignored, as in the kernel
      int cur = ctx.offset;
      ret = parse_probe_arg(inner, code, ci, ctx);
      if (ret) break;
      ctx.offset = cur;
      if (code[*ci].op == FetchOp::kComm || code[*ci].op == FetchOp::kData)
        return ctx.log->err(ctx.offset, ErrorCode::kCommCantDeref);
      if (++*ci == kEndSlot) return ctx.log->err(ctx.offset, ErrorCode::kTooManyOps);
      code[*ci].op = deref;
      code[*ci].offset = offset;
      break;
    }
    case '\\':
      if (arg.size() > 1 && arg[1] == '"') {
        std::string_view str = std::string_view(arg).substr(2);
        // An empty body checks the opening quote itself, as the kernel does.
        char last = str.empty() ? '"' : str.back();
        if (last != '"')
          return ctx.log->err(ctx.offset + 2 + static_cast<int>(str.size()),
                              ErrorCode::kImmstrNoClose);
        ctx.parg->data = std::string(str.empty() ? str : str.substr(0, str.size() - 1));
        code[*ci].op = FetchOp::kData;
      } else {
        uint64_t imm;
        if (!str_to_immediate(std::string_view(arg).substr(1), &imm)) {
          ret = ctx.log->err(ctx.offset + 1, ErrorCode::kBadImm);
        } else {
          code[*ci].op = FetchOp::kImm;
          code[*ci].imm = imm;
        }
      }
      break;
    default:
      if (is_alpha(arg[0]) || arg[0] == '_')  // a BTF variable name: no BTF here
        return ctx.log->err(ctx.offset, ErrorCode::kNosupBtfarg);
      break;
  }
  if (!ret && code[*ci].op == FetchOp::kNop)
    ret = ctx.log->err(ctx.offset, ErrorCode::kBadFetchArg);
  return ret;
}

bool is_op(FetchOp op, std::initializer_list<FetchOp> set) {
  for (FetchOp o : set)
    if (o == op) return true;
  return false;
}

// Turns the last load/deref into a store, then adds the bitfield and array stages.
int finalize_fetch_insn(Code& code, int ci, ProbeArg& parg, const char* type_str,
                        int type_offset, ArgContext& ctx) {
  const FetchType* t = parg.type;
  FetchInsn* c = &code[ci];
  if (t->is_string) {
    bool symstr = std::strcmp(t->name, "symstr") == 0;
    if (symstr) {
      if (!is_op(c->op, {FetchOp::kReg, FetchOp::kStack, FetchOp::kRetval, FetchOp::kArg,
                         FetchOp::kDeref}))
        return ctx.log->err(ctx.offset + type_offset, ErrorCode::kBadSymstring);
    } else if (!is_op(c->op, {FetchOp::kDeref, FetchOp::kUDeref, FetchOp::kImm,
                              FetchOp::kComm, FetchOp::kData})) {
      return ctx.log->err(ctx.offset + type_offset, ErrorCode::kBadString);
    }
    if (symstr || is_op(c->op, {FetchOp::kImm, FetchOp::kComm, FetchOp::kData}) ||
        parg.count) {
      c = &code[++ci];
      if (c->op != FetchOp::kNop) return ctx.log->err(ctx.offset, ErrorCode::kTooManyOps);
    }
    if (std::strcmp(t->name, "ustring") == 0 || c->op == FetchOp::kUDeref)
      c->op = FetchOp::kStUString;
    else if (symstr)
      c->op = FetchOp::kStSymstr;
    else
      c->op = FetchOp::kStString;
    c->size = t->size;
  } else if (c->op == FetchOp::kDeref) {
    c->op = FetchOp::kStMem;
    c->size = t->size;
  } else if (c->op == FetchOp::kUDeref) {
    c->op = FetchOp::kStUMem;
    c->size = t->size;
  } else {
    c = &code[++ci];
    if (c->op != FetchOp::kNop) return ctx.log->err(ctx.offset, ErrorCode::kTooManyOps, E2BIG);
    c->op = FetchOp::kStRaw;
    c->size = t->size;
  }
  int scode = ci;
  if (type_str && type_str[0] == 'b') {
    std::string_view bf(type_str);
    size_t end;
    uint64_t bw = simple_strtoul(bf.substr(1), &end);
    end += 1;
    bool bad = bw == 0 || end >= bf.size() || bf[end] != '@';
    uint64_t bo = 0;
    if (!bad) {
      size_t start = end + 1, e2;
      bo = simple_strtoul(bf.substr(start), &e2);
      e2 += start;
      bad = e2 == start || e2 >= bf.size() || bf[e2] != '/';
    }
    if (!bad) {
      c = &code[++ci];
      bad = c->op != FetchOp::kNop;
    }
    unsigned bits = t->size * 8u;
    if (!bad) {
      c->op = FetchOp::kModBitfield;
      c->lshift = static_cast<uint8_t>(bits - (bw + bo));
      c->rshift = static_cast<uint8_t>(bits - bw);
      c->size = t->size;
      bad = bits < bw + bo;
    }
    if (bad) return ctx.log->err(ctx.offset + type_offset, ErrorCode::kBadBitfield);
  }
  if (parg.count) {
    if (!is_op(code[scode].op, {FetchOp::kStMem, FetchOp::kStString, FetchOp::kStUString}))
      return ctx.log->err(ctx.offset + type_offset, ErrorCode::kBadString);
    c = &code[++ci];
    if (c->op != FetchOp::kNop) return ctx.log->err(ctx.offset, ErrorCode::kTooManyOps, E2BIG);
    c->op = FetchOp::kLoopArray;
    c->param = parg.count;
  }
  code[++ci].op = FetchOp::kEnd;
  code.resize(static_cast<size_t>(ci) + 1);
  return 0;
}

const char* const kReservedFieldNames[] = {
    "common_type", "common_flags",   "common_preempt_count", "common_pid",
    "common_tgid", "__probe_ip",     "__probe_ret_ip",       "__probe_func",
};

// NAME=BODY or BODY; argument `i` of the definition (0-based).
int parse_one_arg(ProbeDefinition& def, int i, const std::string& argtext, ArgContext base) {
  ProbeArg parg;
  ArgContext ctx = base;
  ctx.parg = &parg;
  Log& log = *ctx.log;
  std::string body;
  size_t eq = argtext.find('=');
  if (eq != std::string::npos) {
    if (static_cast<int>(eq) > kMaxArgNameLen) return log.err(0, ErrorCode::kArgNameTooLong);
    if (eq == 0) return log.err(0, ErrorCode::kNoArgName);
    parg.name = argtext.substr(0, eq);
    body = argtext.substr(eq + 1);
  } else {
    parg.name = "arg" + std::to_string(i + 1);
    body = argtext;
  }
  if (!is_good_name(parg.name)) return log.err(0, ErrorCode::kBadArgName);
  for (const char* r : kReservedFieldNames)
    if (parg.name == r) return log.err(0, ErrorCode::kUsedArgName);
  for (int j = 0; j < i; ++j)
    if (def.args[static_cast<size_t>(j)].name == parg.name)
      return log.err(0, ErrorCode::kUsedArgName);
  ctx.offset = eq != std::string::npos ? static_cast<int>(eq) + 1 : 0;

  if (static_cast<int>(body.size()) > kMaxArgStrLen)
    return log.err(ctx.offset, ErrorCode::kArgTooLong);
  if (body.empty()) return log.err(ctx.offset, ErrorCode::kNoArgBody);
  parg.comm = body;

  // The type: after the first ':', with an optional [N] array suffix.
  std::string arg = body;
  std::string type_text;
  bool has_type = false;
  size_t colon = arg.find(':');
  int type_offset = 0;
  if (colon != std::string::npos) {
    has_type = true;
    type_text = arg.substr(colon + 1);
    arg.resize(colon);
    type_offset = static_cast<int>(colon) + 1;
    size_t lb = type_text.find('[');
    if (lb != std::string::npos) {
      std::string num = type_text.substr(lb + 1);
      int num_off = type_offset + static_cast<int>(lb) + 1;
      size_t rb = num.find(']');
      if (rb == std::string::npos)
        return log.err(ctx.offset + num_off + static_cast<int>(num.size()),
                       ErrorCode::kArrayNoClose);
      if (rb + 1 != num.size())
        return log.err(ctx.offset + num_off + static_cast<int>(rb) + 1,
                       ErrorCode::kBadArraySuffix);
      num.resize(rb);
      uint64_t n;
      if (!kstrtoull(num, 0, &n) || n == 0 || n > 0xffffffffu)
        return log.err(ctx.offset + num_off, ErrorCode::kBadArrayNum);
      if (n > static_cast<uint64_t>(kMaxArrayLen))
        return log.err(ctx.offset + num_off, ErrorCode::kArrayTooBig);
      parg.count = static_cast<uint32_t>(n);
      type_text.resize(lb);
    }
  }
  if (arg == "$comm" || arg == "$COMM" || arg.rfind("\\\"", 0) == 0) {
    if (parg.count || (has_type && type_text != "string"))
      return log.err(ctx.offset + type_offset, ErrorCode::kNeedStringType);
    parg.type = find_fetch_type("string", ctx.syntax);
  } else {
    parg.type = has_type ? find_fetch_type(type_text.c_str(), ctx.syntax) : default_fetch_type();
  }
  if (!parg.type) return log.err(ctx.offset + type_offset, ErrorCode::kBadType);

  Code code(kFetchInsnMax);
  code[kEndSlot].op = FetchOp::kEnd;
  int ci = 0;
  int ret = parse_probe_arg(arg, code, &ci, ctx);
  if (ret) return ret;
  ret = finalize_fetch_insn(code, ci, parg, has_type ? type_text.c_str() : nullptr,
                            has_type ? type_offset : 0, ctx);
  if (ret) return ret;
  parg.code = std::move(code);
  def.args.push_back(std::move(parg));
  return 0;
}

int parse_args(ProbeDefinition& def, const std::vector<std::string>& argv, Log& log,
               bool fentry) {
  // `$arg*` (every argument, by BTF) is looked for before any argument is parsed, as the
  // kernel expands it first; there is no BTF here.
  if (def.syntax == ProbeSyntax::kKprobe) {
    for (size_t i = 2; i < argv.size(); ++i) {
      if (argv[i].starts_with("$arg*")) {
        log.index = static_cast<int>(i);
        return log.err(0, ErrorCode::kNosupBtfarg, EOPNOTSUPP);
      }
    }
  }
  ArgContext ctx{def.syntax, def.is_return, fentry, 0, &log, &def, nullptr};
  for (size_t i = 2; i < argv.size(); ++i) {
    log.index = static_cast<int>(i);
    int ret = parse_one_arg(def, static_cast<int>(i - 2), argv[i], ctx);
    if (ret) return ret;
  }
  return 0;
}

std::string truncate_name(std::string s) {
  if (s.size() > static_cast<size_t>(kMaxEventNameLen - 1)) s.resize(kMaxEventNameLen - 1);
  return s;
}

// `-:[GRP/][EVENT] [head...]`, or `!...` through dynamic_events.
ParseResult parse_removal(const std::vector<std::string>& argv) {
  const std::string& a0 = argv[0];
  std::string event;
  if (a0[0] == '-') {
    if (a0.size() < 2 || a0[1] != ':') return silent_error(EINVAL);
    event = a0.substr(2);
  } else {
    size_t c = a0.find(':');
    if (c == std::string::npos) return silent_error(EINVAL);
    event = a0.substr(c + 1);
  }
  ParseResult r;
  r.status = ParseStatus::kRemove;
  size_t slash = event.find('/');
  if (slash != std::string::npos) {
    r.removal.has_group = true;
    r.removal.group = event.substr(0, slash);
    event = event.substr(slash + 1);
  }
  if (!r.removal.has_group && event.empty()) return silent_error(EINVAL);
  r.removal.event = event;
  r.removal.head.assign(argv.begin() + 1, argv.end());
  return r;
}

// `[MOD:]SYM` into def's module and symbol; false for an empty symbol or module.
bool split_module(const std::string& place, ProbeDefinition* def) {
  const size_t colon = place.find(':');
  if (colon != std::string::npos) {
    def->module = place.substr(0, colon);
    def->symbol = place.substr(colon + 1);
  } else {
    def->symbol = place;
  }
  return !def->symbol.empty() && (colon == std::string::npos || !def->module.empty());
}

// Where an argument reads $retval (as a word of its own), or npos.
size_t retval_at(const std::string& arg) {
  const size_t at = arg.find("$retval");
  if (at == std::string::npos || at + 7 == arg.size()) return at;
  return !is_alnum(arg[at + 7]) && arg[at + 7] != '_' ? at : std::string::npos;
}

// An automatic event name as the kernel makes it: cut to the longest name, and every
// character from `from` on that cannot be in a C identifier made '_'.
std::string event_name_of(std::string name, size_t from) {
  name = truncate_name(std::move(name));
  for (size_t i = from; i < name.size(); ++i)
    if (!is_alnum(name[i]) && name[i] != '_') name[i] = '_';
  return name;
}

// The arguments of a definition whose head is parsed, and the result.
ParseResult parse_tail(ProbeDefinition def, const std::vector<std::string>& argv,
                       Log& log, bool fentry) {
  if (argv.size() - 2 > static_cast<size_t>(kMaxTraceArgs)) {
    log.index = 2;
    return fail(log, 0, ErrorCode::kTooManyArgs);
  }
  def.argv = argv;
  if (parse_args(def, argv, log, fentry)) return logged_error(log);
  ParseResult r;
  r.status = ParseStatus::kDefine;
  r.def = std::move(def);
  return r;
}

// Whether a kprobe-syntax place names a USDT point, `[MOD:]%PROVIDER:NAME` (`pct`: where
// its first '%' is): a '%' that opens the place or follows MOD's colon, not `%return`.
bool is_sdt_place(const std::string& sym, size_t pct) {
  return pct != std::string::npos && (pct == 0 || sym[pct - 1] == ':') &&
         sym.compare(pct, std::string::npos, "%return") != 0;
}

// `[MOD:]%PROVIDER:NAME` into def's module and symbol ("%PROVIDER:NAME"): -1, or where
// in the place it stops being one (PROVIDER and NAME are C identifiers, MOD not empty).
int parse_sdt_place(const std::string& sym, size_t pct, ProbeDefinition* def) {
  auto identifier_end = [&](size_t at) {
    while (at < sym.size() && (is_alnum(sym[at]) || sym[at] == '_')) ++at;
    return at;
  };
  if (pct == 1) return 0;  // ":%P:N": an empty MOD
  const size_t provider_end = identifier_end(pct + 1);
  if (provider_end == pct + 1 || provider_end >= sym.size() || sym[provider_end] != ':')
    return static_cast<int>(provider_end);
  const size_t name_end = identifier_end(provider_end + 1);
  if (name_end == provider_end + 1 || name_end != sym.size()) return static_cast<int>(name_end);
  if (pct > 0) def->module = sym.substr(0, pct - 1);
  def->symbol = sym.substr(pct);
  return -1;
}

ParseResult parse_kprobe_tail(ProbeDefinition def, const std::vector<std::string>& argv,
                              Log& log, size_t colon, bool fentry);

ParseResult parse_kprobe_argv(const std::vector<std::string>& argv, const ParseOptions&) {
  const std::string& a0 = argv[0];
  ProbeDefinition def;
  def.syntax = ProbeSyntax::kKprobe;
  def.group = "kprobes";
  if (a0[0] == 'r')
    def.is_return = true;
  else if (a0[0] != 'p')
    return not_mine();
  if (argv.size() < 2) return not_mine();
  Log log{&argv, kLogKprobe, 0, {}};

  size_t colon = a0.find(':', 1);
  bool has_event = colon != std::string::npos;
  if (a0.size() > 1 && is_digit(a0[1])) {
    if (!def.is_return) return fail(log, 1, ErrorCode::kBadMaxactType);
    size_t len = has_event ? colon - 1 : a0.size() - 1;
    if (len > static_cast<size_t>(kMaxEventNameLen - 1))
      return fail(log, 1, ErrorCode::kBadMaxact);
    uint64_t n;
    if (!kstrtoull(std::string_view(a0).substr(1, len), 0, &n) || n == 0 || n > 0xffffffffu)
      return fail(log, 1, ErrorCode::kBadMaxact);
    if (n > static_cast<uint64_t>(kMaxActiveMax))
      return fail(log, 1, ErrorCode::kMaxactTooBig);
    def.maxactive = static_cast<int>(n);
  }

  const std::string& place = argv[1];
  uint64_t addr;
  bool fentry = false;
  if (kstrtoull(place, 0, &addr)) {
    def.address = addr;
  } else {
    log.index = 1;
    if (place.find('/') != std::string::npos && place.find(':') != std::string::npos)
      return not_mine();
    std::string sym = place;
    size_t pct = sym.find('%');
    if (is_sdt_place(sym, pct)) {
      if (int at = parse_sdt_place(sym, pct, &def); at >= 0)
        return fail(log, at, ErrorCode::kBadProbeAddr);
      if (def.is_return) return fail(log, 0, ErrorCode::kBadRetprobe);
      return parse_kprobe_tail(std::move(def), argv, log, colon, /*fentry=*/true);
    }
    if (pct != std::string::npos) {
      if (sym.compare(pct, std::string::npos, "%return") != 0)
        return fail(log, static_cast<int>(pct), ErrorCode::kBadAddrSuffix);
      sym.resize(pct);
      def.is_return = true;
    }
    // MOD:SYM picks an object; the offset is looked for in the symbol part only, so that
    // object names with '-' in them (ld-linux-x86-64) stay whole.
    size_t mod_colon = sym.find(':');
    size_t sym_start = mod_colon == std::string::npos ? 0 : mod_colon + 1;
    size_t pm = sym.find_first_of("+-", sym_start);
    int64_t off = 0;
    if (pm != std::string::npos) {
      if (!kstrtoll(std::string_view(sym).substr(pm), 0, &off) || off < 0 ||
          off > 0xffffffffll)
        return fail(log, 0, ErrorCode::kBadProbeAddr);
      sym.resize(pm);
    }
    if (!split_module(sym, &def)) return fail(log, 0, ErrorCode::kBadProbeAddr);
    def.offset = static_cast<uint64_t>(off);
    // In user space a function entry is offset 0 of a symbol; a return probe needs one.
    if (off == 0 && !def.is_return) fentry = true;
    if (off != 0 && def.is_return)
      return fail(log, 0, ErrorCode::kBadRetprobe);
    // "0x401000%return" or "0x401000+4": no symbol is a number, so this is an address
    // (the kernel would look the number up as a symbol and fail).
    uint64_t numeric;
    if (def.module.empty() && kstrtoull(def.symbol, 0, &numeric)) {
      def.address = numeric + def.offset;
      def.symbol.clear();
      def.offset = 0;
      fentry = false;
    }
  }

  return parse_kprobe_tail(std::move(def), argv, log, colon, fentry);
}

// The event name (GROUP/EVENT after argv[0]'s colon, when it has one; made from the place
// otherwise) and the arguments of a kprobe-syntax definition whose place is parsed.
ParseResult parse_kprobe_tail(ProbeDefinition def, const std::vector<std::string>& argv,
                              Log& log, size_t colon, bool fentry) {
  const std::string& a0 = argv[0];
  log.index = 0;
  bool named = false;
  if (colon != std::string::npos) {
    if (parse_event_name(std::string_view(a0).substr(colon + 1), static_cast<int>(colon) + 1,
                         &def.group, &def.event, &named, log))
      return logged_error(log);
  }
  if (!named && def.on_sdt()) {
    // As perf names an SDT event: the point's name.
    def.event = event_name_of(def.symbol.substr(def.symbol.find(':') + 1), 0);
  } else if (!named) {
    char buf[160];
    if (def.on_symbol()) {
      std::string full = def.module.empty() ? def.symbol : def.module + ":" + def.symbol;
      std::snprintf(buf, sizeof buf, "%c_%s_%ld", def.is_return ? 'r' : 'p', full.c_str(),
                    static_cast<long>(def.offset));
    } else {
      std::snprintf(buf, sizeof buf, "%c_0x%lx", def.is_return ? 'r' : 'p',
                    static_cast<unsigned long>(def.address));
    }
    // The kernel turns ':' and '.' into '_', which is enough for its own symbol and module
    // names; user-space objects also have '-' and '+' (ld-linux-x86-64.so.2, libstdc++),
    // so every character that cannot be in an identifier becomes '_'.
    def.event = event_name_of(buf, 1);
  }
  return parse_tail(std::move(def), argv, log, fentry);
}

// `f[N][:[GRP/][EVENT]] [MOD:]SYM[%return] [ARGS]`: the kernel's fprobe event (trace_fprobe),
// a function's entry, or its exit with %return (or an argument that reads $retval). The
// place is a symbol and nothing else: "SYM+4" is looked for as a name, and found nowhere.
//
// `t[:[GRP/][EVENT]] TRACEPOINT [ARGS]`, a probe on a kernel tracepoint, is parsed by the
// same rules and then refused: a process has no tracepoints (NO_TRACEPOINT, where the
// kernel would wait for a module that defines it).
ParseResult parse_fprobe_argv(const std::vector<std::string>& argv, const ParseOptions&) {
  const std::string& a0 = argv[0];
  if ((a0[0] != 'f' && a0[0] != 't') || argv.size() < 2) return not_mine();
  const bool tracepoint = a0[0] == 't';
  ProbeDefinition def;
  def.syntax = ProbeSyntax::kKprobe;
  def.fprobe = true;
  def.group = tracepoint ? "tracepoints" : "fprobes";
  Log log{&argv, kLogFprobe, 0, {}};
  const size_t colon = a0.find(':', 1);
  const bool has_event = colon != std::string::npos;
  if (a0.size() > 1 && is_digit(a0[1])) {
    const size_t len = has_event ? colon - 1 : a0.size() - 1;
    if (len > static_cast<size_t>(kMaxEventNameLen - 1)) return fail(log, 1, ErrorCode::kBadMaxact);
    uint64_t n;
    if (!kstrtoull(std::string_view(a0).substr(1, len), 0, &n) || n == 0 || n > 0xffffffffu)
      return fail(log, 1, ErrorCode::kBadMaxact);
    if (n > static_cast<uint64_t>(kMaxActiveMax)) return fail(log, 1, ErrorCode::kMaxactTooBig);
    def.maxactive = static_cast<int>(n);
  }
  log.index = 1;
  std::string sym = argv[1];
  const size_t pct = sym.find('%');
  if (pct != std::string::npos) {
    if (tracepoint || sym.compare(pct, std::string::npos, "%return") != 0)
      return fail(log, static_cast<int>(pct), ErrorCode::kBadAddrSuffix);
    sym.resize(pct);
    def.is_return = true;
  }
  if (tracepoint) {
    for (size_t i = 0; i < sym.size(); ++i)
      if (!is_alnum(sym[i]) && sym[i] != '_') return fail(log, static_cast<int>(i), ErrorCode::kBadTpName);
  }
  // An argument that reads $retval makes it the function's exit (a tracepoint has none).
  for (size_t i = 2; i < argv.size() && !def.is_return; ++i) {
    const size_t at = retval_at(argv[i]);
    if (at == std::string::npos) continue;
    if (tracepoint) {
      log.index = static_cast<int>(i);
      return fail(log, static_cast<int>(at), ErrorCode::kRetvalOnProbe);
    }
    def.is_return = true;
  }
  if (!def.is_return && def.maxactive) {
    log.index = 0;
    return fail(log, 1, ErrorCode::kBadMaxactType);
  }
  if (!split_module(sym, &def)) return fail(log, 0, ErrorCode::kBadProbeAddr);
  log.index = 0;
  bool named = false;
  if (has_event &&
      parse_event_name(std::string_view(a0).substr(colon + 1), static_cast<int>(colon) + 1,
                       &def.group, &def.event, &named, log))
    return logged_error(log);
  if (!named) {
    // SYM__entry or SYM__exit (a tracepoint's own name), every character that cannot be in
    // a C identifier as '_'.
    def.event = event_name_of(tracepoint ? (is_digit(sym[0]) ? "_" : "") + sym
                                         : sym + (def.is_return ? "__exit" : "__entry"),
                              0);
  }
  const bool fentry = !def.is_return;
  ParseResult r = parse_tail(std::move(def), argv, log, fentry);
  if (tracepoint && r.status == ParseStatus::kDefine) {
    log.index = 1;
    return fail(log, 0, ErrorCode::kNoTracepoint);
  }
  return r;
}

ParseResult parse_uprobe_argv(const std::vector<std::string>& argv, const ParseOptions& opts) {
  const std::string& a0 = argv[0];
  ProbeDefinition def;
  def.syntax = ProbeSyntax::kUprobe;
  def.group = "uprobes";
  if (a0[0] == 'r')
    def.is_return = true;
  else if (a0[0] != 'p')
    return not_mine();
  if (argv.size() < 2) return not_mine();
  Log log{&argv, kLogUprobe, 0, {}};
  if (argv.size() - 2 > static_cast<size_t>(kMaxTraceArgs)) {
    log.index = 2;
    return fail(log, 0, ErrorCode::kTooManyArgs);
  }
  // Only "p:" / "r:" introduce a name; "r10:..." or "pfoo:..." leave the default.
  bool has_event = a0.size() > 1 && a0[1] == ':';

  const std::string& place = argv[1];
  if (place.find('/') == std::string::npos) return not_mine();
  size_t colon = place.rfind(':');
  if (colon == std::string::npos || colon + 1 >= place.size() || !is_digit(place[colon + 1]))
    return not_mine();
  log.index = 1;
  def.path = place.substr(0, colon);
  if (opts.check_path) {
    if (const std::optional<ErrorCode> e = opts.check_path(def.path)) return fail(log, 0, *e);
  }
  std::string arg = place.substr(colon + 1);
  const int arg_pos = static_cast<int>(colon) + 1;
  size_t lp = arg.find('(');
  if (lp != std::string::npos) {
    size_t rp = arg.find(')', lp);
    if (rp == std::string::npos)
      return fail(log, arg_pos + static_cast<int>(arg.size()), ErrorCode::kRefcntOpenBrace);
    if (rp + 1 != arg.size())
      return fail(log, arg_pos + static_cast<int>(rp) + 1, ErrorCode::kBadRefcntSuffix);
    uint64_t rc;
    if (!kstrtoull(std::string_view(arg).substr(lp + 1, rp - lp - 1), 0, &rc))
      return fail(log, arg_pos + static_cast<int>(lp) + 1, ErrorCode::kBadRefcnt);
    def.ref_ctr_offset = rc;
    arg.resize(lp);
  }
  size_t pct = arg.find('%');
  if (pct != std::string::npos) {
    if (arg.compare(pct, std::string::npos, "%return") != 0)
      return fail(log, arg_pos + static_cast<int>(pct), ErrorCode::kBadAddrSuffix);
    arg.resize(pct);
    def.is_return = true;
  }
  if (!kstrtoull(arg, 0, &def.offset))
    return fail(log, arg_pos, ErrorCode::kBadUprobeOffs);

  log.index = 0;
  bool named = false;
  if (has_event &&
      parse_event_name(std::string_view(a0).substr(2), 2, &def.group, &def.event, &named, log))
    return logged_error(log);
  if (!named) {
    // p_<basename cut at the first '.', '-' or '_'>_0x<offset>, even for return probes.
    size_t b = def.path.rfind('/');
    std::string tail = b == std::string::npos ? def.path : def.path.substr(b + 1);
    size_t cut = tail.find_first_of(".-_");
    if (cut != std::string::npos) tail.resize(cut);
    char buf[64];
    std::snprintf(buf, sizeof buf, "p_%s_0x%lx", tail.c_str(),
                  static_cast<unsigned long>(def.offset));
    def.event = truncate_name(buf);
  }
  return parse_tail(std::move(def), argv, log, false);
}

using TypeParser = ParseResult (*)(const std::vector<std::string>&, const ParseOptions&);

ParseResult parse_line(std::string_view line, const ParseOptions& opts, bool dynamic,
                       std::initializer_list<TypeParser> types) {
  // The removal forms are recognised on the raw line: "  -:e" is not a removal.
  size_t hash = line.find('#');
  if (hash != std::string_view::npos) line = line.substr(0, hash);
  std::vector<std::string> argv = split_argv(line);
  if (argv.empty()) return ParseResult{};
  if (line[0] == '-' || (dynamic && line[0] == '!')) return parse_removal(argv);
  for (TypeParser p : types) {
    ParseResult r = p(argv, opts);
    if (r.status != ParseStatus::kNotMine) return r;
  }
  return silent_error(EINVAL);
}

std::string hex(uint64_t v, int width = 0) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*lx", width, static_cast<unsigned long>(v));
  return buf;
}

// The kernel compares through a 64-byte buffer; longer text never matches.
std::string clip(std::string s) {
  if (s.size() > static_cast<size_t>(kMaxArgStrLen)) s.resize(kMaxArgStrLen);
  return s;
}

std::string place_text(const ProbeDefinition& def) {
  if (def.syntax == ProbeSyntax::kUprobe) {
    std::string s = def.path + ":" + hex(def.offset, 16);
    if (def.ref_ctr_offset) s += "(" + hex(def.ref_ctr_offset) + ")";
    return s;
  }
  if (!def.on_symbol()) return hex(def.address, 16);
  std::string s = def.module.empty() ? def.symbol : def.module + ":" + def.symbol;
  if (def.offset) s += "+" + std::to_string(def.offset);
  if (def.fprobe && def.is_return) s += "%return";
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------

std::string ProbeDefinition::command() const { return join_argv(argv); }

ParseResult parse_kprobe_command(std::string_view line, const ParseOptions& opts) {
  return parse_line(line, opts, false, {parse_kprobe_argv});
}

ParseResult parse_uprobe_command(std::string_view line, const ParseOptions& opts) {
  return parse_line(line, opts, false, {parse_uprobe_argv});
}

ParseResult parse_dynamic_command(std::string_view line, const ParseOptions& opts) {
  return parse_line(line, opts, true, {parse_kprobe_argv, parse_uprobe_argv, parse_fprobe_argv});
}

std::vector<std::string> split_write(std::string_view buf, bool* too_long) {
  *too_long = false;
  std::vector<std::string> lines;
  // A NUL ends the text, as it ends the kernel's C string.
  size_t nul = buf.find('\0');
  if (nul != std::string_view::npos) buf = buf.substr(0, nul);
  size_t done = 0;
  while (done < buf.size()) {
    size_t nl = buf.find('\n', done);
    size_t len = (nl == std::string_view::npos ? buf.size() : nl) - done;
    // The kernel reads at most kWriteBufSize-1 bytes at a time; a line that does not end
    // inside that window, with more data behind it, is refused.
    size_t window = std::min(buf.size() - done, static_cast<size_t>(kWriteBufSize - 1));
    if (len >= window && done + window < buf.size()) {
      *too_long = true;
      return lines;
    }
    lines.emplace_back(buf.substr(done, len));
    done += len + (nl == std::string_view::npos ? 0 : 1);
  }
  return lines;
}

Diagnostic make_diagnostic(const ProbeDefinition& def, ErrorCode code, int index, int offset,
                           int err) {
  Diagnostic d;
  d.code = code;
  d.err = err ? err : error_errno(code);
  d.pos = caret_position(def.argv, index, offset);
  d.command = def.command();
  d.subsystem = def.fprobe                              ? kLogFprobe
                : def.syntax == ProbeSyntax::kKprobe ? kLogKprobe
                                                     : kLogUprobe;
  return d;
}

Diagnostic check_append(const ProbeDefinition& existing, const ProbeDefinition& incoming) {
  if (existing.is_return != incoming.is_return)
    return make_diagnostic(incoming, ErrorCode::kDiffProbeType, 0, 0);
  const auto& a = incoming.args;
  const auto& b = existing.args;
  int differs = 0;
  if (a.size() != b.size()) {
    differs = static_cast<int>(std::min(a.size(), b.size())) + 1;
  } else {
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::strcmp(a[i].type->name, b[i].type->name) != 0 || a[i].count != b[i].count ||
          a[i].name != b[i].name) {
        differs = static_cast<int>(i) + 1;
        break;
      }
    }
  }
  if (differs) return make_diagnostic(incoming, ErrorCode::kDiffArgType, differs + 1, 0);
  bool same_place = place_text(existing) == place_text(incoming);
  if (same_place) {
    bool same_args = true;
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].comm != b[i].comm) same_args = false;
    if (same_args) return make_diagnostic(incoming, ErrorCode::kSameProbe, 0, 0);
  }
  return Diagnostic{};
}

std::string read_back(const ProbeDefinition& def) {
  std::string s(1, def.fprobe ? 'f' : def.is_return ? 'r' : 'p');
  if (def.syntax == ProbeSyntax::kKprobe && def.is_return && def.maxactive)
    s += std::to_string(def.maxactive);
  s += ":" + def.group + "/" + def.event + " " + place_text(def);
  for (const ProbeArg& a : def.args) s += " " + a.name + "=" + a.comm;
  return s;
}

bool removal_matches(const RemovalRequest& req, const ProbeDefinition& def) {
  if (!req.event.empty() && req.event != def.event) return false;
  if (req.has_group && req.group != def.group) return false;
  if (req.head.empty()) return true;
  if (def.syntax == ProbeSyntax::kUprobe) {
    const std::string& h = req.head[0];
    if (h.compare(0, def.path.size(), def.path) != 0 || h.size() <= def.path.size() ||
        h[def.path.size()] != ':')
      return false;
    std::string want = hex(def.offset, 16);
    if (def.ref_ctr_offset) want += "(" + hex(def.ref_ctr_offset) + ")";
    if (clip(want) != h.substr(def.path.size() + 1)) return false;
  } else if (clip(place_text(def)) != req.head[0]) {
    return false;
  }
  if (req.head.size() - 1 > def.args.size()) return false;
  for (size_t i = 1; i < req.head.size(); ++i) {
    const ProbeArg& a = def.args[i - 1];
    if (clip(a.name + "=" + a.comm) != req.head[i]) return false;
  }
  return true;
}

}  // namespace probefs::events
