// Probe points from DWARF (see dwarf_points.h for the rules).
#include "tools/dwarf_points.h"

#include "tools/cxx_names.h"

#include <dwarf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>

namespace probefs::tools {
namespace {

// Whether the shorter of two paths is a tail of the longer ("prog.c" and "/src/prog.c").
bool tail_matches(std::string_view a, std::string_view b) {
  size_t n = std::min(a.size(), b.size());
  return a.substr(a.size() - n) == b.substr(b.size() - n);
}

const char* die_name(Dwarf_Die* die) {
  const char* n = dwarf_diename(die);
  return n ? n : "";
}

// The function's mangled name, through its declaration or abstract origin; else, with
// IMAGE, the symbol table's name of the code at its entry (GCC gives a lambda's
// operator() no linkage name in DWARF); "" for C.
std::string linkage_name(Dwarf_Die* die, const ElfImage* image = nullptr) {
  Dwarf_Attribute attr;
  const char* n = nullptr;
  if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) != nullptr ||
      dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr) != nullptr)
    n = dwarf_formstring(&attr);
  if (n != nullptr) return n;
  Dwarf_Addr entry = 0;
  if (image != nullptr && dwarf_tag(die) == DW_TAG_subprogram && dwarf_entrypc(die, &entry) == 0)
    if (const ElfSymbol* s = image->function_at(entry); s && s->value == entry && s->name.starts_with("_Z"))
      return s->name;
  return "";
}

// Whether function DIE is one PATTERN names: a C++ pattern (is_cxx_name) against its
// qualified name, signature or mangled name; else perf's glob over the DIE's own name.
bool function_matches(const std::string& pattern, Dwarf_Die* die, const ElfImage* image = nullptr) {
  if (is_cxx_name(pattern)) return cxx_name_matches(pattern, linkage_name(die, image), die_name(die));
  return glob_match(pattern, die_name(die));
}

std::string decl_file(Dwarf_Die* die) {
  const char* f = dwarf_decl_file(die);
  return f ? f : "";
}

int decl_line(Dwarf_Die* die) {
  int line = 0;
  return dwarf_decl_line(die, &line) == 0 ? line : 0;
}

// The entry of a function or an inlined instance: DW_AT_entry_pc/low_pc, else the start of
// its first range.
bool entry_of(Dwarf_Die* die, Dwarf_Addr* addr) {
  if (dwarf_entrypc(die, addr) == 0) return true;
  Dwarf_Addr base, start, end;
  return dwarf_ranges(die, 0, &base, &start, &end) > 0 && (*addr = start, true);
}

bool is_definition(Dwarf_Die* die) {
  return dwarf_tag(die) == DW_TAG_subprogram && !dwarf_hasattr(die, DW_AT_declaration);
}

bool has_code(Dwarf_Die* die) {
  Dwarf_Addr a;
  return dwarf_entrypc(die, &a) == 0 || dwarf_hasattr(die, DW_AT_ranges);
}

// Calls FN on every DIE under ROOT, depth first in DIE order; FN returns whether to descend
// into the DIE's children.
void walk_children(Dwarf_Die* root, const std::function<bool(Dwarf_Die*)>& fn) {
  Dwarf_Die child;
  if (dwarf_child(root, &child) != 0) return;
  do {
    if (fn(&child)) walk_children(&child, fn);
  } while (dwarf_siblingof(&child, &child) == 0);
}

// The innermost inlined instance under ROOT that holds ADDR.
bool innermost_inline(Dwarf_Die* root, Dwarf_Addr addr, Dwarf_Die* out) {
  bool found = false;
  Dwarf_Die scope = *root;
  for (bool deeper = true; deeper;) {
    deeper = false;
    walk_children(&scope, [&](Dwarf_Die* d) {
      if (deeper) return false;
      if (dwarf_tag(d) == DW_TAG_inlined_subroutine && dwarf_haspc(d, addr) > 0) {
        *out = *d;
        deeper = found = true;
        return false;
      }
      return true;
    });
    if (deeper) scope = *out;
  }
  return found;
}

// The out-of-line function of CU that holds ADDR.
bool real_function_at(Dwarf_Die* cu, Dwarf_Addr addr, Dwarf_Die* out) {
  struct Arg { Dwarf_Addr addr; Dwarf_Die* out; bool found; } arg{addr, out, false};
  dwarf_getfuncs(
      cu,
      [](Dwarf_Die* fn, void* p) {
        auto* a = static_cast<Arg*>(p);
        if (dwarf_tag(fn) == DW_TAG_subprogram && dwarf_haspc(fn, a->addr) > 0) {
          *a->out = *fn;
          a->found = true;
          return int{DWARF_CB_ABORT};
        }
        return int{DWARF_CB_OK};
      },
      &arg, 0);
  return arg.found;
}

// The functions at ADDR from the out-of-line one inward through its inlined instances.
std::vector<Dwarf_Die> functions_at(Dwarf_Die* cu, Dwarf_Addr addr) {
  std::vector<Dwarf_Die> chain;
  Dwarf_Die fn;
  if (!real_function_at(cu, addr, &fn)) return chain;
  chain.push_back(fn);
  for (;;) {
    Dwarf_Die next;
    bool found = false;
    walk_children(&chain.back(), [&](Dwarf_Die* d) {
      if (found) return false;
      if (dwarf_tag(d) == DW_TAG_inlined_subroutine && dwarf_haspc(d, addr) > 0) {
        next = *d;
        found = true;
        return false;
      }
      return true;
    });
    if (!found) break;
    chain.push_back(next);
  }
  return chain;
}

// One row of a CU's line table.
struct Row {
  Dwarf_Addr addr;
  int line;
  const char* file;
  bool stmt, end_sequence;
};

std::vector<Row> line_rows(Dwarf_Die* cu) {
  std::vector<Row> rows;
  Dwarf_Lines* lines;
  size_t n;
  if (dwarf_getsrclines(cu, &lines, &n) != 0) return rows;
  rows.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Dwarf_Line* l = dwarf_onesrcline(lines, i);
    Row r{};
    bool flag = false;
    if (!l || dwarf_lineaddr(l, &r.addr) != 0 || dwarf_lineno(l, &r.line) != 0) continue;
    r.file = dwarf_linesrc(l, nullptr, nullptr);
    r.stmt = dwarf_linebeginstatement(l, &flag) == 0 && flag;
    r.end_sequence = dwarf_lineendsequence(l, &flag) == 0 && flag;
    rows.push_back(r);
  }
  return rows;
}

std::string call_file(Dwarf_Die* inl) {
  Dwarf_Attribute a;
  Dwarf_Word idx;
  Dwarf_Files* files;
  Dwarf_Die cu;
  if (!dwarf_attr(inl, DW_AT_call_file, &a) || dwarf_formudata(&a, &idx) != 0) return "";
  if (!dwarf_diecu(inl, &cu, nullptr, nullptr) || dwarf_getsrcfiles(&cu, &files, nullptr) != 0)
    return "";
  const char* f = dwarf_filesrc(files, idx, nullptr, nullptr);
  return f ? f : "";
}

int call_line(Dwarf_Die* inl) {
  Dwarf_Attribute a;
  Dwarf_Word line;
  return dwarf_attr(inl, DW_AT_call_line, &a) && dwarf_formudata(&a, &line) == 0
             ? static_cast<int>(line)
             : 0;
}

// Calls FN (until it returns false) on each instance of the abstract function ORIGIN in
// CU: inlined ones and out-of-line ones, in DIE order. An inlined instance "called" from
// the function's own declaration line is a duplicate GCC leaves, not a call.
void for_each_instance(Dwarf_Die* cu, Dwarf_Die* origin, const std::function<bool(Dwarf_Die*)>& fn) {
  const Dwarf_Off want = dwarf_dieoffset(origin);
  bool go_on = true;
  walk_children(cu, [&](Dwarf_Die* d) {
    if (!go_on) return false;
    int tag = dwarf_tag(d);
    Dwarf_Attribute a;
    Dwarf_Die o;
    if ((tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram) || !has_code(d) ||
        !dwarf_attr(d, DW_AT_abstract_origin, &a) || !dwarf_formref_die(&a, &o) ||
        dwarf_dieoffset(&o) != want)
      return true;
    if (tag == DW_TAG_inlined_subroutine && call_line(d) == decl_line(&o) &&
        call_file(d) == decl_file(&o))
      return true;
    go_on = fn(d);
    return true;
  });
}

// The line an address stands for: a function's declaration line at its entry, else the
// first statement row at the address.
bool line_of(Dwarf_Die* cu, const std::vector<Row>& rows, Dwarf_Addr addr, std::string* file,
             int* line) {
  Dwarf_Die fn;
  Dwarf_Addr entry;
  if (real_function_at(cu, addr, &fn) && entry_of(&fn, &entry) && entry == addr) {
    *file = decl_file(&fn);
    *line = decl_line(&fn);
    return *line > 0 && !file->empty();
  }
  auto it = std::upper_bound(rows.begin(), rows.end(), addr,
                             [](Dwarf_Addr a, const Row& r) { return a < r.addr; });
  if (it == rows.begin()) return false;
  Dwarf_Addr at = std::prev(it)->addr;
  auto first = std::lower_bound(rows.begin(), rows.end(), at,
                                [](const Row& r, Dwarf_Addr a) { return r.addr < a; });
  for (; first != rows.end() && first->addr == at; ++first) {
    if (!first->stmt) continue;
    if (!first->file) return false;
    *file = first->file;
    *line = first->line;
    return true;
  }
  return false;
}

// A source line with its place in a function's or CU's code.
struct LineHit {
  std::string file;
  int line;
  Dwarf_Addr addr;
};

// The statement rows of ROOT (a CU, or a function whose inlined code is left out but for
// its call lines), then the declaration lines of functions and the call lines of inlined
// instances, which the line table does not show.
std::vector<LineHit> walk_lines(Dwarf_Die* root, Dwarf_Die* cu, const std::vector<Row>& rows) {
  std::vector<LineHit> hits;
  const bool whole_cu = dwarf_tag(root) == DW_TAG_compile_unit;
  const std::string root_file = whole_cu ? "" : decl_file(root);
  const int root_line = whole_cu ? 0 : decl_line(root);
  for (const Row& r : rows) {
    if (r.end_sequence || !r.stmt) continue;
    if (!whole_cu) {
      if (dwarf_haspc(root, r.addr) <= 0) continue;
      Dwarf_Die inl;
      if (innermost_inline(root, r.addr, &inl)) {
        bool call_site = call_file(&inl) == root_file && call_line(&inl) == r.line;
        if (!call_site && (decl_line(&inl) != root_line || decl_file(&inl) != root_file))
          continue;
      }
    }
    hits.push_back({r.file ? r.file : "", r.line, r.addr});
  }
  // Declaration lines at entries, and call lines of inlined instances (all of them for a
  // CU; a function's own only one level down).
  auto func_lines = [&](Dwarf_Die* fn, bool recursive) {
    Dwarf_Addr entry;
    if (int l = decl_line(fn); l > 0 && !decl_file(fn).empty() && entry_of(fn, &entry))
      hits.push_back({decl_file(fn), l, entry});
    walk_children(fn, [&](Dwarf_Die* d) {
      if (dwarf_tag(d) != DW_TAG_inlined_subroutine) return true;
      Dwarf_Addr e;
      std::string f = call_file(d);
      if (int l = call_line(d); !f.empty() && l > 0 && entry_of(d, &e)) {
        hits.push_back({f, l, e});
        if (recursive && decl_line(d) > 0 && !decl_file(d).empty())
          hits.push_back({decl_file(d), decl_line(d), e});
      }
      return recursive;
    });
  };
  if (whole_cu) {
    struct Arg { std::function<void(Dwarf_Die*)> fn; } arg{[&](Dwarf_Die* d) { func_lines(d, true); }};
    dwarf_getfuncs(
        cu,
        [](Dwarf_Die* fn, void* p) {
          static_cast<Arg*>(p)->fn(fn);
          return int{DWARF_CB_OK};
        },
        &arg, 0);
  } else {
    func_lines(root, false);
  }
  return hits;
}

// The CU's source file whose path ends with NAME ("" when it has none).
std::string cu_file(Dwarf_Die* cu, const std::string& name) {
  Dwarf_Files* files;
  size_t n;
  if (dwarf_getsrcfiles(cu, &files, &n) != 0) return "";
  for (size_t i = 0; i < n; ++i) {
    const char* f = dwarf_filesrc(files, i, nullptr, nullptr);
    if (f && tail_matches(name, f)) return f;
  }
  return "";
}

// Whether the CU was built with optimization: its producer's last "-O" option is not -O0.
bool optimized(Dwarf_Die* cu) {
  Dwarf_Attribute a;
  const char* producer = dwarf_attr(cu, DW_AT_producer, &a) ? dwarf_formstring(&a) : nullptr;
  if (!producer) return false;
  const char* last = nullptr;
  for (const char* p = producer; (p = strstr(p, " -O")); p += 3) last = p;
  return last && last[3] != '0';
}

// The address after the prologue: the line table's next row after the entry's, unless that
// one is past the function's end.
Dwarf_Addr past_prologue(Dwarf_Die* fn, const std::vector<Row>& rows, Dwarf_Addr entry) {
  Dwarf_Addr high = 0;
  if (dwarf_highpc(fn, &high) != 0) return entry;
  // The entry's row (not the end of a sequence that stops where the function starts: a
  // C++ CU's line table switches files there), then the next one after it.
  auto it = std::find_if(rows.begin(), rows.end(),
                         [&](const Row& r) { return r.addr == entry && !r.end_sequence; });
  while (it != rows.end() && it->addr == entry) ++it;
  if (it == rows.end()) return entry;
  Dwarf_Addr next = it->addr;
  return next > entry && next < high ? next : entry;
}

// Whether TEXT, without whitespace, matches the glob PATTERN without whitespace.
bool lazy_match(const std::string& text, const std::string& pattern) {
  auto squeeze = [](const std::string& s) {
    std::string out;
    for (char c : s)
      if (!isspace(static_cast<unsigned char>(c))) out += c;
    return out;
  };
  return glob_match(squeeze(pattern), squeeze(text));
}

}  // namespace

std::optional<std::string> source_under(const std::string& prefix, const std::string& path) {
  for (std::string_view rest = path;;) {
    std::string candidate = prefix + "/" + std::string(rest);
    if (access(candidate.c_str(), R_OK) == 0) return candidate;
    if (errno != ENOENT && errno != ENAMETOOLONG && errno != EROFS && errno != EFAULT)
      return std::nullopt;
    const size_t slash = rest.size() > 1 ? rest.find('/', 1) : std::string_view::npos;
    if (slash == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(slash);
  }
}

namespace {

std::vector<std::string> read_source(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

class Finder {
 public:
  Finder(const DebugInfo& dbg, const PlaceQuery& q) : dbg_(dbg), q_(q), p_(q.point) {}

  Result<std::vector<DwarfPlace>> run() {
    Dwarf_Off off = 0, next;
    size_t header;
    while (dwarf_nextcu(dbg_.dwarf(), off, &next, &header, nullptr, nullptr, nullptr) == 0) {
      if (dwarf_offdie(dbg_.dwarf(), off + header, &cu_) &&
          dwarf_tag(&cu_) == DW_TAG_compile_unit) {
        rows_ = line_rows(&cu_);
        file_ = p_.file.empty() ? "" : cu_file(&cu_, p_.file);
        if (p_.file.empty() || !file_.empty()) {
          if (!p_.function.empty()) {
            by_function();
          } else if (p_.has_lazy) {
            lazy(&cu_);
          } else {
            line_ = static_cast<int>(p_.line);
            by_line();
          }
          if (!error_.message.empty()) return error_;
        }
      }
      off = next;
    }
    return std::move(places_);
  }

 private:
  bool failed() const { return !error_.message.empty(); }
  void fail(int code, std::string msg) {
    if (!failed()) error_ = make_error(code, std::move(msg));
  }

  void by_function() {
    if (is_cxx_name(p_.function)) {
      // Every subprogram of the CU, nested ones too: a lambda's operator() and a local
      // class's methods live inside their function's DIE, where dwarf_getfuncs does not go.
      bool go_on = true;
      walk_children(&cu_, [&](Dwarf_Die* d) {
        if (!go_on) return false;
        const int tag = dwarf_tag(d);
        if (tag == DW_TAG_subprogram) go_on = function_cb(d);
        return go_on && (tag == DW_TAG_subprogram || tag == DW_TAG_namespace ||
                         tag == DW_TAG_class_type || tag == DW_TAG_structure_type ||
                         tag == DW_TAG_union_type || tag == DW_TAG_lexical_block);
      });
      return;
    }
    struct Arg { Finder* self; } arg{this};
    dwarf_getfuncs(
        &cu_,
        [](Dwarf_Die* fn, void* p) {
          return static_cast<Arg*>(p)->self->function_cb(fn) ? int{DWARF_CB_OK}
                                                            : int{DWARF_CB_ABORT};
        },
        &arg, 0);
  }

  // One subprogram of the CU; whether to go on with the CU's others.
  bool function_cb(Dwarf_Die* fn) {
    if (!is_definition(fn) || !function_matches(p_.function, fn, q_.image)) return true;
    std::string file = decl_file(fn);
    // An artificial function (a lambda's operator()) has no place of its own: its CU's.
    if (file.empty() && is_cxx_name(p_.function)) file = die_name(&cu_);
    if (file.empty()) return true;
    if (!p_.file.empty() && !tail_matches(p_.file, file)) return true;
    if (file_.empty()) file_ = file;
    if (p_.has_line) {
      line_ = decl_line(fn) + static_cast<int>(p_.line);
      by_line();
    } else if (has_code(fn)) {
      Dwarf_Addr entry = 0;
      entry_of(fn, &entry);
      if (entry != 0) {
        if (p_.has_lazy) {
          lazy(fn);
        } else {
          Dwarf_Addr at = entry;
          bool skip = q_.with_variables && !optimized(&cu_) && !p_.has_offset && !p_.retprobe;
          if (skip) at = past_prologue(fn, rows_, entry);
          add(fn, at + p_.offset, skip ? entry : 0);
        }
      }
    } else if (!q_.no_inlines) {
      // An abstract function: every instance of it, inlined or out of line.
      for_each_instance(&cu_, fn, [&](Dwarf_Die* d) {
        Dwarf_Addr e;
        if (p_.has_lazy)
          lazy(d);
        else if (entry_of(d, &e) && e != 0)
          add(d, e + p_.offset, 0);
        return !failed();
      });
    }
    // A glob, or a C++ name (its overloads, a constructor's variants), goes on.
    return (strpbrk(p_.function.c_str(), "*?[") != nullptr || is_cxx_name(p_.function)) &&
           !failed();
  }

  // Every statement row of line_ in file_, anywhere in the CU.
  void by_line() {
    for (const LineHit& h : walk_lines(&cu_, &cu_, rows_)) {
      if (failed()) return;
      if (h.line != line_ || !tail_matches(h.file, file_)) continue;
      if (!representative(h)) return;
      add_best(h.addr);
    }
  }

  // The lines of ROOT matching the lazy pattern.
  void lazy(Dwarf_Die* root) {
    std::string path = file_.empty() ? decl_file(root) : file_;
    std::string readable = path;
    if (!q_.source_prefix.empty()) {
      std::optional<std::string> found = source_under(q_.source_prefix, path);
      if (!found) {
        fail(-ENOENT, "Failed to find source file path.");
        return;
      }
      readable = *found;
    }
    std::vector<std::string> text = read_source(readable);
    if (text.empty()) {
      fail(-ENOENT, "Failed to open " + path + ": " + strerror(ENOENT));
      return;
    }
    std::set<int> lines;
    for (size_t i = 0; i < text.size(); ++i)
      if (lazy_match(text[i], p_.lazy)) lines.insert(static_cast<int>(i + 1));
    if (lines.empty()) {
      fail(-ENOENT, "No matched lines found in " + path + ".");
      return;
    }
    for (const LineHit& h : walk_lines(root, &cu_, rows_)) {
      if (failed()) return;
      if (lines.count(h.line) && tail_matches(h.file, path)) {
        line_ = h.line;
        add_best(h.addr);
      }
    }
  }

  // Refuses a line whose address stands for another line.
  bool representative(const LineHit& h) {
    std::string file;
    int line = 0;
    if (!line_of(&cu_, rows_, h.addr, &file, &line) || file != h.file || line == h.line)
      return true;
    std::string where = file;
    int shown = line;
    if (!p_.function.empty()) {
      for (Dwarf_Die& fn : functions_at(&cu_, h.addr)) {
        if (function_matches(p_.function, &fn, q_.image)) {
          where = die_name(&fn);
          shown = line - decl_line(&fn);
          break;
        }
      }
    }
    fail(-ENOENT, "This line is sharing the address with other lines.\nPlease try to probe at " +
                      where + ":" + std::to_string(shown) + " instead.");
    return false;
  }

  // A line's place, with the scope that best explains it.
  void add_best(Dwarf_Addr addr) {
    std::vector<Dwarf_Die> chain = functions_at(&cu_, addr);
    Dwarf_Die* best = nullptr;
    int diff = INT_MAX;
    for (Dwarf_Die& fn : chain) {
      if (!file_.empty() && decl_file(&fn) != file_) continue;
      if (!p_.function.empty()) {
        if (function_matches(p_.function, &fn, q_.image)) {
          best = &fn;
          break;
        }
      } else if (int l = decl_line(&fn); l < line_ && line_ - l < diff) {
        diff = line_ - l;
        best = &fn;
      }
    }
    if (!best && !chain.empty()) best = &chain.back();
    if (!best) {
      fail(-ENOENT, "Failed to find scope of probe point.");
      return;
    }
    Dwarf_Die scope = *best;
    add(&scope, addr, 0);
  }

  // A place in SCOPE (a function or an inlined instance).
  void add(Dwarf_Die* scope, Dwarf_Addr addr, Dwarf_Addr unskipped) {
    Dwarf_Die fn;
    if (dwarf_tag(scope) == DW_TAG_subprogram) {
      fn = *scope;
    } else if (!real_function_at(&cu_, addr, &fn)) {
      fail(-ENOENT, "Failed to find probe point in any functions.");
      return;
    }
    if (dwarf_haspc(&fn, addr) <= 0) {
      fail(-EINVAL, std::string("Specified offset is out of ") + die_name(&fn));
      return;
    }
    for (const DwarfPlace& p : places_)
      if (p.addr == addr) return;
    if (places_.size() == q_.max_probes) {
      fail(-ERANGE, "Too many( > " + std::to_string(q_.max_probes) + ") probe point found.");
      return;
    }
    DwarfPlace place;
    place.addr = addr;
    place.symbol = die_name(&fn);
    entry_of(&fn, &place.symbol_entry);
    place.scope_name = die_name(scope);
    place.linkage = linkage_name(scope, q_.image);
    place.inlined = dwarf_tag(scope) == DW_TAG_inlined_subroutine;
    place.scopes = scopes_at(scope, addr);
    place.prologue_skipped = unskipped != 0 && unskipped != addr;
    place.unskipped = unskipped;
    places_.push_back(std::move(place));
  }

  // SCOPE with the lexical blocks inside it that hold ADDR (not those of code inlined into
  // it), innermost first, then the CU.
  std::vector<Dwarf_Die> scopes_at(Dwarf_Die* scope, Dwarf_Addr addr) {
    std::vector<Dwarf_Die> out;
    Dwarf_Die* all = nullptr;
    int n = dwarf_getscopes(&cu_, addr, &all);
    int at = -1;
    for (int i = 0; i < n; ++i)
      if (dwarf_dieoffset(&all[i]) == dwarf_dieoffset(scope)) at = i;
    if (at >= 0) {
      int first = at;
      while (first > 0 && dwarf_tag(&all[first - 1]) == DW_TAG_lexical_block) --first;
      out.assign(all + first, all + at + 1);
    } else {
      out.push_back(*scope);
    }
    free(all);
    out.push_back(cu_);
    return out;
  }

  const DebugInfo& dbg_;
  const PlaceQuery& q_;
  const ProbePoint& p_;
  Dwarf_Die cu_{};
  std::vector<Row> rows_;
  std::string file_;  // the source file the place is in
  int line_ = 0;      // the absolute line looked for
  std::vector<DwarfPlace> places_;
  Error error_;
};

}  // namespace

Result<std::vector<DwarfPlace>> find_places(const DebugInfo& dbg, const PlaceQuery& query) {
  return Finder(dbg, query).run();
}

Result<std::string> describe_address(const DebugInfo& dbg, Dwarf_Addr addr, bool retprobe) {
  Dwarf_Die cu, fn;
  if (!dwarf_addrdie(dbg.dwarf(), addr, &cu) || !real_function_at(&cu, addr, &fn))
    return make_error(-ENOENT, "Failed to find the function at " + std::to_string(addr));
  std::vector<Row> rows = line_rows(&cu);
  Dwarf_Addr entry = 0;
  entry_of(&fn, &entry);
  std::string func = die_name(&fn), file = decl_file(&fn);
  int line = 0, base = decl_line(&fn);
  if (addr != entry) {
    // A line only where a statement row begins exactly at the address.
    for (const Row& r : rows)
      if (r.addr == addr && r.stmt && r.file) {
        line = r.line;
        file = r.file;
        break;
      }
    Dwarf_Die scope = fn, inl;
    while (line && innermost_inline(&scope, addr, &inl)) {
      Dwarf_Addr e;
      if (entry_of(&inl, &e) && e == addr) {
        line = call_line(&inl);
        file = call_file(&inl);
        break;
      }
      func = die_name(&inl);
      base = decl_line(&inl);
      scope = inl;
      break;
    }
    if (line && decl_file(&scope) != file) line = 0;
  }
  std::string s = func;
  if (retprobe)
    s += "%return";
  else if (addr != entry)
    s += line ? ":" + std::to_string(line - base) : "+" + std::to_string(addr - entry);
  if (!file.empty()) {
    std::string shown = file;
    if (shown.size() > 30) {
      size_t from = shown.size() - 30, slash = shown.find('/', from);
      shown = slash == std::string::npos ? shown.substr(from) : shown.substr(slash + 1);
    }
    s += "@" + shown;
  }
  return s;
}

Result<std::string> show_lines(const DebugInfo& dbg, const LineRange& range,
                               const std::string& source_prefix) {
  // Lines after a whole function's last one, shown for context.
  constexpr int kContext = 2;
  Dwarf_Off off = 0, next;
  size_t header;
  std::set<int> probeable;
  std::string path;
  long start = range.start, end = range.has_end ? range.end : INT_MAX, offset = 0;
  bool found = false;
  while (!found &&
         dwarf_nextcu(dbg.dwarf(), off, &next, &header, nullptr, nullptr, nullptr) == 0) {
    Dwarf_Die cu;
    if (dwarf_offdie(dbg.dwarf(), off + header, &cu) && dwarf_tag(&cu) == DW_TAG_compile_unit) {
      std::vector<Row> rows = line_rows(&cu);
      std::string file = range.file.empty() ? "" : cu_file(&cu, range.file);
      if (range.file.empty() || !file.empty()) {
        auto collect = [&](Dwarf_Die* root, const std::string& in_file) {
          for (const LineHit& h : walk_lines(root, &cu, rows)) {
            if (h.line < start || h.line > end || !tail_matches(h.file, in_file)) continue;
            // Only lines an address leads back to.
            std::string back_file;
            int back_line;
            if (line_of(&cu, rows, h.addr, &back_file, &back_line) &&
                (back_line != h.line || back_file != h.file))
              continue;
            probeable.insert(h.line);
          }
        };
        if (!range.function.empty()) {
          struct Arg { const LineRange* r; const std::string* file; Dwarf_Die fn; bool found; };
          Arg arg{&range, &file, {}, false};
          dwarf_getfuncs(
              &cu,
              [](Dwarf_Die* fn, void* p) {
                auto* a = static_cast<Arg*>(p);
                if (!is_definition(fn) || !function_matches(a->r->function, fn))
                  return int{DWARF_CB_OK};
                if (!a->file->empty() && !tail_matches(*a->file, decl_file(fn)))
                  return int{DWARF_CB_OK};
                a->fn = *fn;
                a->found = true;
                return int{DWARF_CB_ABORT};
              },
              &arg, 0);
          if (arg.found) {
            found = true;
            path = decl_file(&arg.fn);
            offset = decl_line(&arg.fn);
            start = offset + range.start;
            if (range.has_end) end = offset + range.end;
            if (has_code(&arg.fn)) {
              collect(&arg.fn, path);
            } else {
              for_each_instance(&cu, &arg.fn, [&](Dwarf_Die* d) {
                collect(d, path);
                return true;
              });
            }
          }
        } else {
          collect(&cu, file);
          if (!probeable.empty()) {
            found = true;
            path = file;
          }
        }
      }
    }
    off = next;
  }
  if (probeable.empty()) return make_error(-ENOENT, "Specified source line is not found.");

  if (!source_prefix.empty()) {
    std::optional<std::string> found = source_under(source_prefix, path);
    if (!found) return make_error(-ENOENT, "Failed to find source file path.");
    path = *found;  // and shown as perf shows it
  }
  std::vector<std::string> text = read_source(path);
  if (text.empty()) return make_error(-ENOENT, "Failed to open " + path + ": " + strerror(ENOENT));
  std::string out;
  if (!range.function.empty())
    out = "<" + range.function + "@" + path + ":" + std::to_string(start - offset) + ">\n";
  else
    out = "<" + path + ":" + std::to_string(start) + ">\n";
  auto show = [&](long l, bool numbered) {
    if (l < 1 || l > static_cast<long>(text.size())) return false;
    char num[32];
    if (numbered)
      snprintf(num, sizeof num, "%7ld  ", l - offset);
    else
      snprintf(num, sizeof num, "         ");
    out += num + text[static_cast<size_t>(l - 1)] + "\n";
    return true;
  };
  long l = start;
  for (int line : probeable) {
    for (; l < line; ++l) show(l, false);
    show(l++, true);
  }
  if (end == INT_MAX) end = l + kContext;
  while (l <= end && show(l, false)) ++l;
  return out;
}

}  // namespace probefs::tools
