// Hist triggers: the command language, its read-back and the hist file (hist_trigger.h).
// The order of the checks, the errors each logs and where its caret points follow the
// kernel's (the caret of an error names the first place its text occurs in the
// command, as the kernel's errpos() finds it).
#include "fs/hist_trigger.h"

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "events/filter.h"
#include "events/kstrto.h"

namespace probefs::fs {

namespace {

using events::ErrorCode;

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view strip(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

// The parse's state: the command as error_log shows it, and where errors go.
struct Parser {
  std::string command;  // "hist:" + the text after the command word
  std::string_view group, event;
  events::Diagnostic* err;

  int pos_of(std::string_view s) const {
    const size_t at = command.find(s);
    return at == std::string::npos ? 0 : static_cast<int>(at);
  }
  int fail(ErrorCode code, std::string_view at) {
    *err = hist_diagnostic(code, command, at.empty() ? 0 : pos_of(at), group, event);
    return -err->err;
  }
  int fail_at0(ErrorCode code) {
    *err = hist_diagnostic(code, command, 0, group, event);
    return -err->err;
  }
};

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (true) {
    const size_t next = s.find(sep, at);
    if (next == std::string_view::npos) {
      out.push_back(s.substr(at));
      return out;
    }
    out.push_back(s.substr(at, next - at));
    at = next + 1;
  }
}

// The event's field `name`, as the kernel's trace_find_event_field finds it: the event's
// own fields, then the common ones.
bool find_field(const events::CompiledEvent& ev, std::string_view name, HistField* f) {
  for (const events::FieldLayout& l : ev.fields) {
    if (l.name != name) continue;
    if (l.count != 0) return false;  // arrays are no key or value
    f->offset = l.offset;
    f->is_string = l.type->is_string;
    f->is_signed = l.type->is_signed;
    f->size = l.type->is_string ? 4 : l.size;
    return f->size == 1 || f->size == 2 || f->size == 4 || f->size == 8;
  }
  struct Common {
    const char* name;
    uint32_t offset, size;
    bool is_signed;
  };
  static constexpr Common kCommon[] = {{"common_type", 0, 2, false},
                                       {"common_flags", 2, 1, false},
                                       {"common_preempt_count", 3, 1, false},
                                       {"common_pid", 4, 4, true}};
  for (const Common& c : kCommon) {
    if (name != c.name) continue;
    f->offset = c.offset;
    f->size = c.size;
    f->is_signed = c.is_signed;
    return true;
  }
  if (ev.synthetic) return false;
  if (ev.is_return ? (name == "__probe_func" || name == "__probe_ret_ip") : name == "__probe_ip") {
    f->offset = name == "__probe_ret_ip" ? 16 : 8;
    f->size = 8;
    return true;
  }
  return false;
}

// One key or value: FIELD[.MODIFIER].
int parse_field(Parser& ps, const events::CompiledEvent& ev, std::string_view text, bool key,
                HistField* f) {
  std::string plain(text);
  for (size_t at = plain.find(".sym-offset"); at != std::string::npos;
       at = plain.find(".sym-offset", at + 11))
    plain[at + 4] = 'X';
  if (plain.find_first_of("+-*/$") != std::string::npos)
    return ps.fail(ErrorCode::kHistCreateFail, text);  // expressions and variables
  std::string_view name = text, modifier;
  const size_t dot = text.find('.');
  if (dot != std::string_view::npos) {
    name = text.substr(0, dot);
    modifier = text.substr(dot + 1);
    bool ok = true;
    if (modifier == "hex") f->flag = HistFlag::kHex;
    else if (modifier == "sym") f->flag = HistFlag::kSym;
    else if (modifier == "sym-offset") f->flag = HistFlag::kSymOffset;
    else if (modifier == "execname" && name == "common_pid") f->flag = HistFlag::kExecname;
    else if (modifier == "log2") f->flag = HistFlag::kLog2;
    else if (modifier == "usecs") f->flag = HistFlag::kUsecs;
    else if (modifier.substr(0, 6) == "bucket") {
      std::string_view n = modifier.substr(6);
      if (!n.empty() && n.front() == 's') n.remove_prefix(1);
      uint64_t b = 0;
      ok = !n.empty() && n.front() == '=' &&
           events::kstrtoull(n.substr(1), 0, &b) && b != 0;
      f->flag = HistFlag::kBuckets;
      f->buckets = b;
    } else if (modifier.substr(0, 7) == "percent") {
      ok = !key;
      f->flag = HistFlag::kPercent;
    } else if (modifier.substr(0, 5) == "graph") {
      ok = !key;
      f->flag = HistFlag::kGraph;
    } else {
      ok = false;
    }
    if (!ok) return ps.fail(ErrorCode::kHistBadFieldModifier, modifier);
  }
  f->name = std::string(name);
  if (name == "common_timestamp") {
    if (key || (f->flag != HistFlag::kNone && f->flag != HistFlag::kUsecs))
      return ps.fail(ErrorCode::kHistCreateFail, name);
    f->is_timestamp = true;
    return 0;
  }
  if (f->flag == HistFlag::kUsecs) return ps.fail(ErrorCode::kHistBadFieldModifier, "usecs");
  if (find_field(ev, name, f)) return 0;
  if (name == "common_cpu" || name == "cpu" || name == "CPU") {
    f->is_cpu = true;
    f->name = "common_cpu";
    f->size = 4;
    return 0;
  }
  return ps.fail(ErrorCode::kHistFieldNotFound, name);
}

// One term of an expression, or a value: $VAR, a number, or FIELD[.MODIFIER].
int parse_term(Parser& ps, const events::CompiledEvent& ev, std::string_view text, bool key,
               HistField* f) {
  if (!text.empty() && text.front() == '$') {
    if (key) return ps.fail(ErrorCode::kHistInvalidRefKey, text);
    if (text.size() == 1) return ps.fail(ErrorCode::kHistVarNotFound, text);
    f->var = std::string(text.substr(1));
    f->name = std::string(text);
    return 0;
  }
  if (!text.empty() && text.front() >= '0' && text.front() <= '9') {
    if (key) return ps.fail(ErrorCode::kHistCreateFail, text);
    uint64_t v = 0;
    if (!events::kstrtoull(text, 0, &v)) return ps.fail(ErrorCode::kHistCreateFail, text);
    f->is_const = true;
    f->constant = v;
    f->name = std::to_string(v);
    return 0;
  }
  return parse_field(ps, ev, text, key, f);
}

std::string field_text(const HistField& f);

// An expression as the kernel's parse_expr() builds it: terms at the leaves, binary
// operators and unary minus at the nodes; constant operands of a binary operator are
// folded into one constant, printed as its value.
struct Expr {
  char op = 0;  // 0: a term; '+', '-', '*', '/'; 'u': -(l)
  HistField term;
  std::unique_ptr<Expr> l, r;
  bool is_const = false;
  uint64_t value = 0;  // a constant's (and, for lowering, -(constant)'s)
  std::string text;    // as the kernel prints it
  bool simple() const { return op == 0; }
};

// The rightmost '-' of `s` that is not the one of .sym-offset, or npos.
size_t last_minus(std::string_view s) {
  for (size_t i = s.size(); i-- > 0;)
    if (s[i] == '-' && !(i >= 4 && s.substr(i - 4, 5) == ".sym-")) return i;
  return std::string_view::npos;
}

// The kernel's contains_operator(): the root operator of `s` and where it is. The lowest
// precedence first (+ and -), the rightmost of those (so that operators of one precedence
// go left to right); a '-' at the start is unary minus, the root whatever follows.
char root_operator(std::string_view s, size_t* at) {
  constexpr size_t npos = std::string_view::npos;
  const size_t minus = last_minus(s);
  if (minus == 0) {
    *at = 0;
    return 'u';
  }
  const size_t plus = s.rfind('+');
  if (plus != npos || minus != npos) {
    const bool is_plus = plus != npos && (minus == npos || plus > minus);
    *at = is_plus ? plus : minus;
    return is_plus ? '+' : '-';
  }
  const size_t div = s.rfind('/'), mul = s.rfind('*');
  if (div == npos && mul == npos) return 0;
  const bool is_mul = mul != npos && (div == npos || mul > div);
  *at = is_mul ? mul : div;
  return is_mul ? '*' : '/';
}

// The kernel's parse_expr(), with its limit of three subexpressions (binary operators
// and unary minus, counted in `n` as they are met) and the carets of its errors.
int parse_expr(Parser& ps, const events::CompiledEvent& ev, std::string_view str, unsigned* n,
               Expr* out) {
  if (*n > 3) return ps.fail(ErrorCode::kHistTooManySubexpr, str);
  size_t at = 0;
  const char op = root_operator(str, &at);
  if (op == 0) {
    if (int rc = parse_term(ps, ev, str, false, &out->term); rc != 0) return rc;
    out->is_const = out->term.is_const;
    out->value = out->term.constant;
    out->text = field_text(out->term);
    return 0;
  }
  if (op == 'u') {  // only -(EXPR): the parentheses are required
    if (++*n > 3) return ps.fail(ErrorCode::kHistTooManySubexpr, str);
    std::string_view rest = str.substr(1);
    if (rest.find('(') == std::string_view::npos) return ps.fail(ErrorCode::kSilent, str);
    rest.remove_prefix(1);
    const size_t close = rest.rfind(')');
    if (close == std::string_view::npos) return ps.fail(ErrorCode::kSilent, str);
    if (close + 1 != rest.size()) return ps.fail(ErrorCode::kHistUnaryMinusSubexpr, rest);
    const std::string_view inner = rest.substr(0, close);
    out->op = 'u';
    out->l = std::make_unique<Expr>();
    if (int rc = parse_expr(ps, ev, inner, n, out->l.get()); rc != 0) return rc;
    if (out->l->simple() && out->l->term.is_string)
      return ps.fail(ErrorCode::kHistInvalidStrOperand, inner);
    out->value = 0 - out->l->value;
    out->text = "-(" + out->l->text + ")";
    return 0;
  }
  ++*n;
  const std::string_view left = str.substr(0, at), right = str.substr(at + 1);
  if (left.empty() || right.empty()) return ps.fail(ErrorCode::kSilent, str);
  out->l = std::make_unique<Expr>();
  if (int rc = parse_expr(ps, ev, left, n, out->l.get()); rc != 0) return rc;
  if (out->l->simple() && out->l->term.is_string)
    return ps.fail(ErrorCode::kHistInvalidStrOperand, left);
  out->r = std::make_unique<Expr>();
  if (int rc = parse_expr(ps, ev, right, n, out->r.get()); rc != 0) return rc;
  if (out->r->simple() && out->r->term.is_string)
    return ps.fail(ErrorCode::kHistInvalidStrOperand, right);
  const HistField& a = out->l->term;
  const HistField& b = out->r->term;
  if (out->l->simple() && out->r->simple() && a.is_timestamp && b.is_timestamp &&
      a.flag != b.flag)
    return ps.fail_at0(ErrorCode::kHistTimestampMismatch);
  if (op == '/' && out->r->is_const && out->r->value == 0)
    return ps.fail(ErrorCode::kHistDivisionByZero, right);
  out->op = op;
  if (out->l->is_const && out->r->is_const) {  // folded, as the kernel folds it
    const uint64_t x = out->l->value, y = out->r->value;
    out->value = op == '+' ? x + y : op == '-' ? x - y : op == '*' ? x * y : x / y;
    out->is_const = true;
    out->op = 0;
    out->l.reset();
    out->r.reset();
    out->term = HistField{};
    out->term.is_const = true;
    out->term.constant = out->value;
    out->term.name = std::to_string(out->value);
    out->text = out->term.name;
    return 0;
  }
  out->text = out->l->text + op + out->r->text;
  return 0;
}

// NAME=EXPR. What the targets compute is a term, a constant, or one operator between two
// of those: a deeper expression is refused (README's limits).
int parse_var(Parser& ps, const events::CompiledEvent& ev, std::string_view name,
              std::string_view expr, HistVarDef* v) {
  v->name = std::string(name);
  bool ident = !name.empty() && !(name.front() >= '0' && name.front() <= '9');
  for (char c : name) ident = ident && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!ident) return ps.fail(ErrorCode::kHistCreateFail, name);
  if (expr.empty()) return ps.fail(ErrorCode::kHistEmptyAssignment, name);
  unsigned n = 0;
  Expr e;
  if (int rc = parse_expr(ps, ev, expr, &n, &e); rc != 0) return rc;
  v->expr = e.text;
  auto constant = [](uint64_t value) {
    HistField f;
    f.is_const = true;
    f.constant = value;
    f.name = std::to_string(value);
    return f;
  };
  if (e.op == 0) {
    v->a = e.term;
  } else if (e.op == 'u' && e.l->is_const) {
    v->a = constant(e.value);
  } else if (e.op != 'u' && e.l->simple() && e.r->simple()) {
    v->a = e.l->term;
    v->b = e.r->term;
    v->op = e.op;
  } else {
    return ps.fail(ErrorCode::kHistCreateFail, expr);
  }
  return 0;
}

// .ACTION(PARAMS), the rest of a handler's token after its closing paren.
int parse_action(Parser& ps, std::string_view tok, std::string_view rest, HistHandlerDef* m) {
  if (rest.empty() || rest.front() != '.') return ps.fail_at0(ErrorCode::kHistActionNotFound);
  rest.remove_prefix(1);
  const size_t open = rest.find('(');
  if (open == std::string_view::npos) return ps.fail_at0(ErrorCode::kHistActionNotFound);
  const std::string_view action = rest.substr(0, open);
  const bool closed = rest.back() == ')';
  const std::string_view params =
      rest.substr(open + 1, rest.size() - open - 1 - (closed ? 1 : 0));
  if (action.substr(0, 4) == "save" || action.substr(0, 8) == "snapshot") {
    if (action.substr(0, 8) == "snapshot" && !closed)
      return ps.fail(ErrorCode::kHistNoClosingParen, params);
    if (m->handler == HistHandler::kMatch) return ps.fail(ErrorCode::kHistActionMismatch, action);
    // No snapshot buffer here: the kernel's answer where it has none.
    if (action.substr(0, 8) == "snapshot") return -ENODEV;
    m->save = true;
  } else if (!closed) {
    return ps.fail(ErrorCode::kHistNoClosingParen, tok);
  }
  std::vector<std::string_view> list;
  if (!params.empty() || m->save) list = split(params, ',');
  if (list.size() > events::kHistMaxParams + (action == "trace" ? 1 : 0))
    return ps.fail_at0(ErrorCode::kHistTooManyParams);
  for (std::string_view& p : list) {
    p = strip(p);
    if (p.size() < 2) return ps.fail(ErrorCode::kHistInvalidParam, p);
  }
  if (m->save) {
    for (std::string_view p : list) m->params.emplace_back(p);
    return 0;
  }
  if (action.substr(0, 5) == "trace") {
    m->trace_keyword = true;
    if (list.empty()) return ps.fail(ErrorCode::kHistSynthEventNotFound, tok);
    m->synth = std::string(list.front());
    list.erase(list.begin());
  } else {
    if (action.empty()) return ps.fail_at0(ErrorCode::kHistActionNotFound);
    m->synth = std::string(action);
  }
  for (std::string_view p : list) m->params.emplace_back(p);
  return 0;
}

// onmatch(SYSTEM.EVENT).ACTION(PARAMS)
int parse_onmatch(Parser& ps, std::string_view tok, HistHandlerDef* m) {
  std::string_view rest = tok.substr(8);  // after "onmatch("
  const size_t close = rest.find(')');
  if (close == std::string_view::npos) return ps.fail(ErrorCode::kHistNoClosingParen, tok);
  const std::string_view target = rest.substr(0, close);
  const size_t dot = target.find('.');
  if (dot == std::string_view::npos) return ps.fail(ErrorCode::kHistSubsysNotFound, tok);
  m->system = std::string(target.substr(0, dot));
  m->event = std::string(target.substr(dot + 1));
  if (m->system.empty() || m->event.empty()) return ps.fail(ErrorCode::kHistInvalidSubsysEvent, target);
  return parse_action(ps, tok, rest.substr(close + 1), m);
}

// onmax($VAR).ACTION(PARAMS) and onchange($VAR).ACTION(PARAMS)
int parse_ontrack(Parser& ps, std::string_view tok, HistHandlerDef* m) {
  const size_t open = tok.find('(');
  m->handler = tok.substr(0, open) == "onmax" ? HistHandler::kMax : HistHandler::kChange;
  std::string_view rest = tok.substr(open + 1);
  const size_t close = rest.find(')');
  if (close == std::string_view::npos) return -EINVAL;  // the kernel logs nothing here
  m->track = std::string(rest.substr(0, close));
  return parse_action(ps, tok, rest.substr(close + 1), m);
}

const char* flag_suffix(HistFlag f) {
  switch (f) {
    case HistFlag::kHex: return ".hex";
    case HistFlag::kSym: return ".sym";
    case HistFlag::kSymOffset: return ".sym-offset";
    case HistFlag::kExecname: return ".execname";
    case HistFlag::kLog2: return ".log2";
    case HistFlag::kBuckets: return ".buckets";
    case HistFlag::kUsecs: return ".usecs";
    case HistFlag::kPercent: return ".percent";
    case HistFlag::kGraph: return ".graph";
    default: return "";
  }
}

std::string field_text(const HistField& f) {
  if (!f.var.empty() || f.is_const) return f.name;
  std::string s = f.name + flag_suffix(f.flag);
  if (f.flag == HistFlag::kBuckets) s += "=" + std::to_string(f.buckets);
  return s;
}

uint32_t key_size_of(const HistField& f) {
  return f.is_string ? events::kHistMaxStringKey : f.is_stack ? events::kHistStackBytes : 8;
}

}  // namespace

events::Diagnostic hist_diagnostic(ErrorCode code, std::string_view command, int pos,
                                   std::string_view group, std::string_view event) {
  events::Diagnostic d;
  d.code = code;
  d.err = events::error_errno(code);
  d.pos = pos;
  d.command = std::string(command);
  d.location = "hist:" + std::string(group) + ":" + std::string(event);
  return d;
}

int parse_hist(std::string_view text, const events::CompiledEvent& ev, std::string_view group,
               std::string_view event, HistSpec* out, events::Diagnostic* err) {
  *err = events::Diagnostic{};
  *out = HistSpec{};
  text = strip(text);
  // The command word ends at ':' or a blank.
  const size_t end = text.find_first_of(": \t");
  std::string_view word = text.substr(0, end);
  std::string_view param = end == std::string_view::npos ? std::string_view{} : strip(text.substr(end + 1));
  if (!word.empty() && word.front() == '!') {
    out->remove = true;
    word.remove_prefix(1);
  }
  if (word != "hist") return -EINVAL;
  Parser ps{"hist:" + std::string(param), group, event, err};
  if (param.empty()) return -EINVAL;
  // The filter: from an "if" with a blank on each side.
  size_t p = 0;
  std::string_view filter;
  bool has_filter = false;
  while ((p = param.find("if", p)) != std::string_view::npos) {
    if (p == 0) return -EINVAL;
    if (!is_blank(param[p - 1])) {
      ++p;
      continue;
    }
    if (p + 2 >= param.size() - 1) return -EINVAL;
    if (param[p + 2] != ' ' && param[p + 2] != '\t') {
      ++p;
      continue;
    }
    has_filter = true;
    filter = param.substr(p + 3);  // after "if" and one blank
    param = strip(param.substr(0, p - 1));
    break;
  }
  std::string_view keys_str, vals_str, sort_str;
  bool have_keys = false, have_vals = false, have_sort = false;
  for (std::string_view tok : split(param, ':')) {
    const size_t eq = tok.find('=');
    if (eq != std::string_view::npos) {
      if (eq + 1 == tok.size()) return ps.fail(ErrorCode::kHistEmptyAssignment, tok);
      const std::string_view lhs = tok.substr(0, eq), rhs = tok.substr(eq + 1);
      if (lhs == "key" || lhs == "keys") {
        keys_str = rhs;
        have_keys = true;
      } else if (lhs == "val" || lhs == "vals" || lhs == "values") {
        vals_str = rhs;
        have_vals = true;
      } else if (lhs == "sort") {
        sort_str = rhs;
        have_sort = true;
      } else if (lhs == "name") {
        out->name = std::string(rhs);
      } else if (lhs == "clock") {
        // Only timestamps use a clock, and none is taken: nothing to set.
      } else if (lhs == "size") {
        uint64_t size = 0;
        if (!events::kstrtoull(rhs, 0, &size)) return -EINVAL;
        uint32_t bits = 0;
        while (bits < 64 && (uint64_t{1} << bits) < size) ++bits;
        if (size == 0 || bits < events::kHistMinBits || bits > events::kHistMaxBits) return -EINVAL;
        out->bits = bits;
      } else {
        // Variables: NAME=EXPR[,NAME=EXPR...]
        for (std::string_view def : split(tok, ',')) {
          const size_t deq = def.find('=');
          if (deq == std::string_view::npos) return ps.fail(ErrorCode::kHistCreateFail, def);
          HistVarDef v;
          if (int rc = parse_var(ps, ev, def.substr(0, deq), def.substr(deq + 1), &v); rc != 0)
            return rc;
          for (const HistVarDef& o : out->vars)
            if (o.name == v.name) return ps.fail(ErrorCode::kHistDuplicateVar, v.name);
          if (out->vars.size() == events::kHistMaxVars)
            return ps.fail_at0(ErrorCode::kHistTooManyVars);
          out->vars.push_back(std::move(v));
        }
      }
    } else if (tok == "pause") {
      out->pause = true;
    } else if (tok == "cont" || tok == "continue") {
      out->cont = true;
    } else if (tok == "clear") {
      out->clear = true;
    } else if (tok.substr(0, 8) == "onmatch(" || tok.substr(0, 6) == "onmax(" ||
               tok.substr(0, 9) == "onchange(") {
      HistHandlerDef m;
      const int rc = tok.substr(0, 8) == "onmatch("
                         ? parse_onmatch(ps, tok, &m)
                         : parse_ontrack(ps, tok, &m);
      if (rc != 0) return rc;
      // One event to fire and one tracked variable per histogram (the hit path's).
      const bool fires = !m.save;
      const bool tracks = m.handler != HistHandler::kMatch;
      for (const HistHandlerDef& o : out->actions) {
        if (m.save && o.save) return ps.fail_at0(ErrorCode::kHistTooManySaveActions);
        if ((fires && !o.save) || (tracks && o.handler != HistHandler::kMatch))
          return ps.fail(ErrorCode::kHistCreateFail, tok);
      }
      if (out->actions.size() == 2) return ps.fail(ErrorCode::kHistCreateFail, tok);
      out->actions.push_back(std::move(m));
    } else {
      return -EINVAL;
    }
  }
  if (!have_keys) return -EINVAL;
  // Values first, then keys, then the sort keys, as the kernel makes them.
  if (have_vals) {
    std::vector<std::string_view> vs = split(vals_str, ',');
    size_t i = 0;
    for (; i < vs.size() && out->vals.size() + 1 < events::kHistMaxVals; ++i) {
      if (vs[i] == "hitcount") continue;
      HistField f;
      if (int rc = parse_term(ps, ev, vs[i], false, &f); rc != 0) return rc;
      if (f.is_const) return ps.fail(ErrorCode::kHistCreateFail, vs[i]);
      if (f.is_string) return -EINVAL;
      out->vals.push_back(std::move(f));
    }
    if (i < vs.size() && !(i + 1 == vs.size() && vs[i] == "hitcount")) return -EINVAL;
  }
  {
    std::vector<std::string_view> ks = split(keys_str, ',');
    if (ks.size() > events::kHistMaxKeys) return -EINVAL;
    for (std::string_view k : ks) {
      HistField f;
      if (k == "stacktrace" || k == "common_stacktrace") {
        if (ev.synthetic) return ps.fail(ErrorCode::kHistCreateFail, k);
        f.name = std::string(k);
        f.is_stack = true;
        out->keys.push_back(std::move(f));
        continue;
      }
      if (int rc = parse_term(ps, ev, k, true, &f); rc != 0) return rc;
      out->keys.push_back(std::move(f));
    }
  }
  if (!have_sort) {
    out->sort.push_back({});
  } else {
    std::vector<std::string_view> ss = split(sort_str, ',');
    for (size_t i = 0; i < ss.size(); ++i) {
      if (ss[i].empty()) return ps.fail(ErrorCode::kHistEmptySortField, "sort=");
      if (i == events::kHistMaxSortKeys - 1 && i + 1 < ss.size())
        return ps.fail(ErrorCode::kHistTooManySortFields, "sort=");
      std::string_view name = ss[i], mod;
      bool has_mod = false;
      if (const size_t dot = name.find('.'); dot != std::string_view::npos) {
        mod = name.substr(dot + 1);
        name = name.substr(0, dot);
        has_mod = true;
      }
      if (name.empty()) return ps.fail(ErrorCode::kHistEmptySortField, "sort=");
      HistSortKey sk;
      if (has_mod) {
        if (mod == "descending") sk.descending = true;
        else if (mod != "ascending") return ps.fail(ErrorCode::kHistInvalidSortModifier, mod);
      }
      if (name != "hitcount") {
        sk.field = -2;
        const int nv = static_cast<int>(out->vals.size());
        for (int j = 0; j < nv && sk.field == -2; ++j)
          if (out->vals[static_cast<size_t>(j)].name == name) sk.field = j;
        for (int j = 0; j < static_cast<int>(out->keys.size()) && sk.field == -2; ++j)
          if (out->keys[static_cast<size_t>(j)].name == name) sk.field = nv + j;
        if (sk.field == -2) return ps.fail(ErrorCode::kHistInvalidSortField, name);
      }
      out->sort.push_back(sk);
    }
  }
  for (const HistField& v : out->vals) {
    if (v.var.empty()) continue;
    if (std::none_of(out->vars.begin(), out->vars.end(),
                     [&](const HistVarDef& d) { return d.name == v.var; }))
      return ps.fail(ErrorCode::kHistVarNotFound, v.name);
  }
  // onmax($VAR)/onchange($VAR): a variable of this histogram; save(): numeric fields of
  // this event.
  for (HistHandlerDef& a : out->actions) {
    if (a.handler == HistHandler::kMatch) continue;
    if (a.track.empty() || a.track.front() != '$') return ps.fail(ErrorCode::kHistOnxNotVar, a.track);
    const std::string_view var = std::string_view(a.track).substr(1);
    if (std::none_of(out->vars.begin(), out->vars.end(),
                     [&](const HistVarDef& d) { return d.name == var; }))
      return ps.fail(ErrorCode::kHistOnxVarNotFound, var);
    if (!a.save) continue;
    for (const std::string& param : a.params) {
      HistField f;
      if (!hist_find_field(ev, param, &f) || f.is_string)
        return ps.fail(ErrorCode::kHistFieldVarCreateFail, param);
      a.saved.push_back(std::move(f));
    }
  }
  uint32_t key_bytes = 0;
  for (const HistField& k : out->keys) key_bytes += key_size_of(k);
  if (key_bytes > events::kHistMaxKeyBytes) return -EINVAL;
  if (has_filter) {
    out->has_filter = true;
    while (!filter.empty() && is_blank(filter.back())) filter.remove_suffix(1);
    out->filter = std::string(filter);
  }
  return 0;
}

std::string HistSpec::identity() const {
  std::string s = name.empty() ? "" : "name=" + name + ":";
  s += "keys=";
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? "," : "") + field_text(keys[i]);
  s += ":vals=hitcount";
  for (const HistField& v : vals) s += "," + field_text(v);
  for (size_t i = 0; i < vars.size(); ++i) s += (i ? "," : ":") + vars[i].text();
  s += ":sort=";
  for (size_t i = 0; i < sort.size(); ++i) {
    if (i) s += ",";
    const int f = sort[i].field;
    const int nv = static_cast<int>(vals.size());
    s += f < 0 ? "hitcount" : field_text(f < nv ? vals[static_cast<size_t>(f)] : keys[static_cast<size_t>(f - nv)]);
    if (sort[i].descending) s += ".descending";
  }
  for (const HistHandlerDef& m : actions) s += m.text();  // actions_match()
  if (has_filter) s += " if " + filter;
  return s;
}

std::string HistSpec::text() const {
  std::string id = identity();
  const size_t filter_at = has_filter ? id.rfind(" if " + filter) : std::string::npos;
  std::string head = filter_at == std::string::npos ? id : id.substr(0, filter_at);
  std::string tail = filter_at == std::string::npos ? "" : id.substr(filter_at);
  // The kernel prints the size, the clock and the actions after the sort keys.
  // identity() ends with the actions: they go after the size and the clock.
  std::string acts;
  for (const HistHandlerDef& m : actions) acts += m.text();
  head.resize(head.size() - acts.size());
  std::string extra = ":size=" + std::to_string(1u << bits);
  if (uses_timestamp()) extra += ":clock=global";
  return "hist:" + head + extra + acts + tail;
}

bool HistSpec::uses_timestamp() const {
  auto ts = [](const HistField& f) { return f.is_timestamp; };
  return std::any_of(vals.begin(), vals.end(), ts) ||
         std::any_of(vars.begin(), vars.end(),
                     [&](const HistVarDef& v) { return ts(v.a) || ts(v.b); });
}

std::string HistVarDef::text() const {
  if (!expr.empty()) return name + "=" + expr;
  std::string s = name + "=" + field_text(a);
  if (op) s += op + field_text(b);
  return s;
}

std::string HistHandlerDef::text() const {
  std::string s = handler == HistHandler::kMatch ? ":onmatch(" + system + "." + event + ")."
                  : handler == HistHandler::kMax ? ":onmax(" + track + ")."
                                                 : ":onchange(" + track + ").";
  if (save) {
    s += "save(";
    for (size_t i = 0; i < params.size(); ++i) s += (i ? "," : "") + params[i];
    return s + ")";
  }
  s += trace_keyword ? "trace(" + synth : synth + "(";
  for (size_t i = 0; i < params.size(); ++i) s += (i || trace_keyword ? "," : "") + params[i];
  return s + ")";
}

events::HistGeometry HistSpec::geometry() const {
  events::HistGeometry g;
  g.key_bytes = 0;
  for (const HistField& k : keys) g.key_bytes += key_size_of(k);
  g.nvals = static_cast<uint32_t>(vals.size());
  g.capacity_bits = bits;
  g.with_comm = std::any_of(keys.begin(), keys.end(),
                            [](const HistField& k) { return k.flag == HistFlag::kExecname; });
  g.nvars = static_cast<uint32_t>(vars.size());
  for (const HistHandlerDef& a : actions) {
    if (a.handler == HistHandler::kMatch) continue;
    g.track = a.handler == HistHandler::kMax ? events::HistTrackKind::kMax
                                             : events::HistTrackKind::kChange;
    g.nsave = a.save ? static_cast<uint32_t>(a.params.size()) : 0;
  }
  return g;
}

namespace {

events::HistOperand operand_of(const HistField& f) {
  events::HistOperand o;
  if (f.is_timestamp) {
    o.source = events::HistSource::kTimestamp;
    if (f.flag == HistFlag::kUsecs) o.transform = events::HistTransform::kUsecs;
    return o;
  }
  if (f.is_const) {
    o.source = events::HistSource::kConst;
    o.value = f.constant;
    return o;
  }
  if (f.is_stack) {
    o.source = events::HistSource::kStack;
    o.key_size = events::kHistStackBytes;
    return o;
  }
  o.source = f.is_cpu ? events::HistSource::kCpu
             : f.is_string ? events::HistSource::kString
                           : events::HistSource::kNumber;
  o.size = static_cast<uint8_t>(f.is_string || f.is_cpu ? 4 : f.size);
  o.is_signed = f.is_signed;
  o.offset = f.offset;
  o.key_size = key_size_of(f);
  if (f.flag == HistFlag::kLog2) o.transform = events::HistTransform::kLog2;
  if (f.flag == HistFlag::kBuckets) {
    o.transform = events::HistTransform::kBuckets;
    o.buckets = f.buckets;
  }
  return o;
}

}  // namespace

events::HistOperand hist_operand(const HistField& f) { return operand_of(f); }

bool hist_find_field(const events::CompiledEvent& ev, std::string_view name, HistField* f) {
  f->name = std::string(name);
  if (find_field(ev, name, f)) return true;
  if (name == "common_cpu" || name == "cpu" || name == "CPU") {
    f->is_cpu = true;
    f->name = "common_cpu";
    f->size = 4;
    return true;
  }
  return false;
}

events::HistProgram HistSpec::program() const {
  events::HistProgram p;
  uint32_t at = 0;
  p.nkeys = static_cast<uint32_t>(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    p.keys[i] = operand_of(keys[i]);
    p.keys[i].key_offset = at;
    at += p.keys[i].key_size;
  }
  for (const HistHandlerDef& a : actions) {
    if (a.handler == HistHandler::kMatch) continue;
    p.track.kind = a.handler == HistHandler::kMax ? events::HistTrackKind::kMax
                                                  : events::HistTrackKind::kChange;
    p.track.fires = !a.save;
    for (size_t v = 0; v < vars.size(); ++v)
      if ("$" + vars[v].name == a.track) p.track.var = static_cast<uint32_t>(v);
    for (const HistField& f : a.saved)
      if (p.track.nsave < events::kHistMaxParams) p.track.save[p.track.nsave++] = operand_of(f);
  }
  p.nvals = static_cast<uint32_t>(vals.size());
  for (size_t i = 0; i < vals.size(); ++i) {
    p.vals[i] = operand_of(vals[i]);
    if (!vals[i].var.empty()) {  // a variable of this histogram (parse_hist checked)
      p.vals[i].source = events::HistSource::kVar;
      for (size_t v = 0; v < vars.size(); ++v)
        if (vars[v].name == vals[i].var) p.vals[i].offset = static_cast<uint32_t>(v);
    }
  }
  return p;
}

// ---- the hist file ---------------------------------------------------------------------

namespace {

struct Row {
  const std::string* key;
  const events::HistEntry* e;
};

uint64_t key_word(const std::string& key, uint32_t at) {
  uint64_t v = 0;
  if (at + 8 <= key.size()) std::memcpy(&v, key.data() + at, 8);
  return v;
}

// The kernel's tracing_map_sort_entries: by the first sort key, and within its ties by
// the second; the rest of a tie in key order, so that the output is stable.
void sort_rows(const HistSpec& spec, std::vector<Row>* rows) {
  std::vector<uint32_t> key_at;
  uint32_t at = 0;
  for (const HistField& k : spec.keys) {
    key_at.push_back(at);
    at += key_size_of(k);
  }
  const int nv = static_cast<int>(spec.vals.size());
  auto cmp_one = [&](const HistSortKey& sk, const Row& a, const Row& b) -> int {
    if (sk.field < nv) {
      const uint64_t x = sk.field < 0 ? a.e->hitcount : a.e->vals[sk.field];
      const uint64_t y = sk.field < 0 ? b.e->hitcount : b.e->vals[sk.field];
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const size_t k = static_cast<size_t>(sk.field - nv);
    const HistField& f = spec.keys[k];
    if (f.is_stack) return 0;  // the kernel has no order of stacks either
    if (f.is_string) {
      const int c = std::strncmp(a.key->data() + key_at[k], b.key->data() + key_at[k],
                                 events::kHistMaxStringKey);
      return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    const uint64_t x = key_word(*a.key, key_at[k]), y = key_word(*b.key, key_at[k]);
    if (f.is_signed && f.flag != HistFlag::kLog2 && f.flag != HistFlag::kBuckets) {
      const auto sx = static_cast<int64_t>(x), sy = static_cast<int64_t>(y);
      return sx < sy ? -1 : sx > sy ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  };
  std::stable_sort(rows->begin(), rows->end(), [&](const Row& a, const Row& b) {
    for (const HistSortKey& sk : spec.sort) {
      int c = cmp_one(sk, a, b);
      if (sk.descending) c = -c;
      if (c != 0) return c < 0;
    }
    return false;
  });
}

void appendf(std::string* out, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void appendf(std::string* out, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) out->append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof buf - 1));
}

// The kernel's __get_percentage: 100 times the percentage of val in total.
unsigned percentage(uint64_t val, uint64_t total) {
  if (total == 0) return val ? ~0u : 0;
  if (val < UINT64_MAX / 10000) return static_cast<unsigned>(val * 10000 / total);
  total /= 10000;
  if (total == 0) return val ? ~0u : 0;
  return static_cast<unsigned>(val / total);
}

}  // namespace

std::string format_hist(const HistSpec& spec, bool paused, const tracee::HistSnapshot& snap,
                        const HistSymbolizer& sym, int n) {
  std::string out;
  if (n > 0) out += "\n\n";
  out += "# event histogram\n#\n# trigger info: ";
  out += spec.text();
  out += paused ? " [paused]\n" : " [active]\n";
  out += "#\n\n";
  std::vector<Row> rows;
  rows.reserve(snap.entries.size());
  for (const auto& [key, e] : snap.entries) rows.push_back({&key, &e});
  sort_rows(spec, &rows);
  // Totals and maxima of the values printed as .percent or .graph (0: hitcount).
  uint64_t total[events::kHistMaxVals] = {}, max[events::kHistMaxVals] = {};
  for (const Row& r : rows)
    for (size_t v = 0; v < spec.vals.size(); ++v) {
      total[v + 1] += r.e->vals[v];
      max[v + 1] = std::max(max[v + 1], r.e->vals[v]);
    }
  for (const Row& r : rows) {
    out += "{ ";
    uint32_t at = 0;
    bool multiline = false;
    for (size_t k = 0; k < spec.keys.size(); ++k) {
      const HistField& f = spec.keys[k];
      if (k) out += ", ";
      const uint64_t v = key_word(*r.key, at);
      const char* name = f.name.c_str();
      if (f.is_stack) {
        // One caller a line, as the kernel's hist_trigger_stacktrace_print.
        out += f.name + ":\n";
        for (uint32_t i = 0; i < events::kHistStackDepth; ++i) {
          const uint64_t addr = key_word(*r.key, at + 8 * i);
          if (addr == 0) break;
          std::string s;
          if (!sym || !sym(addr, true, &s)) {
            char hex[32];
            std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(addr));
            s = hex;
          }
          out += std::string(9, ' ') + s + "\n";
        }
        multiline = true;
        at += key_size_of(f);
        continue;
      }
      switch (f.flag) {
        case HistFlag::kHex: appendf(&out, "%s: %llx", name, static_cast<unsigned long long>(v)); break;
        case HistFlag::kSym:
        case HistFlag::kSymOffset: {
          std::string s;
          if (!sym || !sym(v, f.flag == HistFlag::kSymOffset, &s)) {
            char hex[32];
            std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(v));
            s = hex;
          }
          appendf(&out, f.flag == HistFlag::kSym ? "%s: [%llx] %-45s" : "%s: [%llx] %-55s", name,
                  static_cast<unsigned long long>(v), s.c_str());
          break;
        }
        case HistFlag::kExecname:
          appendf(&out, "%s: %-16s[%10llu]", name, r.e->comm.c_str(), static_cast<unsigned long long>(v));
          break;
        case HistFlag::kLog2: appendf(&out, "%s: ~ 2^%-2llu", name, static_cast<unsigned long long>(v)); break;
        case HistFlag::kBuckets:
          appendf(&out, "%s: ~ %llu-%llu", name, static_cast<unsigned long long>(v),
                  static_cast<unsigned long long>(v + f.buckets - 1));
          break;
        default:
          if (f.is_string) {
            const std::string s(r.key->data() + at, strnlen(r.key->data() + at, key_size_of(f)));
            appendf(&out, "%s: %-50s", name, s.c_str());
          } else {
            appendf(&out, "%s: %10llu", name, static_cast<unsigned long long>(v));
          }
          break;
      }
      at += key_size_of(f);
    }
    out += multiline ? "}" : " }";
    appendf(&out, " hitcount: %10llu", static_cast<unsigned long long>(r.e->hitcount));
    for (size_t v = 0; v < spec.vals.size(); ++v) {
      const HistField& f = spec.vals[v];
      const uint64_t val = r.e->vals[v];
      const char* vname = (f.var.empty() ? f.name : f.var).c_str();
      out += " ";
      if (f.flag == HistFlag::kPercent) {
        const unsigned pc = percentage(val, total[v + 1]);
        if (pc == ~0u) appendf(&out, " %s (%%):[ERROR]", vname);
        else appendf(&out, " %s (%%): %3u.%02u", vname, pc / 100, pc % 100);
      } else if (f.flag == HistFlag::kGraph) {
        const unsigned pc = percentage(val, max[v + 1]);
        std::string bar;
        if (pc == ~0u) {
          bar = "[ERROR]";
        } else {
          const size_t len = std::min<size_t>(pc * 20u / 10000u, 20);
          bar = std::string(len, '#') + std::string(20 - len, ' ');
        }
        appendf(&out, " %s: %20s", vname, bar.c_str());
      } else if (f.flag == HistFlag::kHex) {
        appendf(&out, " %s: %10llx", vname, static_cast<unsigned long long>(val));
      } else {
        appendf(&out, " %s: %10llu", vname, static_cast<unsigned long long>(val));
      }
    }
    // onmax/onchange: the tracked value, and the fields kept with it.
    for (const HistHandlerDef& a : spec.actions) {
      if (a.handler == HistHandler::kMatch) continue;
      appendf(&out, a.handler == HistHandler::kMax ? "\n\tmax: %10llu" : "\n\tchanged: %10llu",
              static_cast<unsigned long long>(r.e->track_value));
      for (size_t i = 0; i < a.saved.size() && i < events::kHistMaxParams; ++i)
        appendf(&out, "  %s: %10llu", a.saved[i].name.c_str(),
                static_cast<unsigned long long>(r.e->saved[i]));
    }
    out += "\n";
  }
  appendf(&out, "\nTotals:\n    Hits: %llu\n    Entries: %u\n    Dropped: %llu\n",
          static_cast<unsigned long long>(snap.totals.hits), static_cast<unsigned>(rows.size()),
          static_cast<unsigned long long>(snap.totals.drops));
  return out;
}

}  // namespace probefs::fs
