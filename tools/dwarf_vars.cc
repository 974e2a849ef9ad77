// Variables at a probe address -> fetch arguments (see dwarf_vars.h): the lookup, location,
// member and type rules of perf probe 6.1, on libdw.
#include "tools/dwarf_vars.h"

#include <dwarf.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace probefs::tools {
namespace {

// perf's names for the x86-64 DWARF registers 0..15.
constexpr const char* kRegisters[] = {"%ax", "%dx", "%cx",  "%bx",  "%si",  "%di",  "%bp",  "%sp",
                                      "%r8", "%r9", "%r10", "%r11", "%r12", "%r13", "%r14", "%r15"};

constexpr char kNotSupported[] = "Sorry, we don't support this variable location yet.";
constexpr char kRegisterStruct[] = "Structure on a register is not supported yet.";
constexpr char kMissingPrefix[] = "Failed to find the location of the '";
constexpr char kMissingSuffix[] = "' variable at this address.";

Error missing(const std::string& var) {
  return make_error(-ENOENT, kMissingPrefix + var + kMissingSuffix);
}

// perf prints a DIE without a name through printf's "%s" of NULL.
std::string name_of(Dwarf_Die* die) {
  const char* n = dwarf_diename(die);
  return n != nullptr ? n : "(null)";
}

bool has_attr(Dwarf_Die* die, unsigned name) {
  Dwarf_Attribute attr;
  return dwarf_attr(die, name, &attr) != nullptr;
}

std::optional<Dwarf_Word> udata(Dwarf_Die* die, unsigned name) {
  Dwarf_Attribute attr;
  Dwarf_Word v;
  if (dwarf_formudata(dwarf_attr_integrate(die, name, &attr), &v) != 0) return std::nullopt;
  return v;
}

std::string signed_text(int64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%+" PRId64, v);
  return buf;
}

// perf's is_c_varname: what starts like a C identifier is looked up in the DWARF.
bool is_c_varname(const std::string& s) {
  return !s.empty() && (std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_');
}

// What the kernel takes as an argument name.
std::string sanitize(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  return s;
}

// perf's die_find_child: ROOT's children in order, descending where VISIT says.
enum class Walk { kFound, kDescend, kNext };
template <class Visit>
bool walk_children(Dwarf_Die* root, Visit&& visit, Dwarf_Die* found) {
  Dwarf_Die child;
  if (dwarf_child(root, &child) != 0) return false;
  do {
    Walk w = visit(&child);
    if (w == Walk::kFound) {
      *found = child;
      return true;
    }
    if (w == Walk::kDescend && walk_children(&child, visit, found)) return true;
  } while (dwarf_siblingof(&child, &child) == 0);
  return false;
}

bool is_variable_tag(int tag) { return tag == DW_TAG_formal_parameter || tag == DW_TAG_variable; }

// ---- types ----

bool is_qualifier(int tag) {
  return tag == DW_TAG_const_type || tag == DW_TAG_volatile_type || tag == DW_TAG_restrict_type ||
         tag == DW_TAG_shared_type || tag == DW_TAG_atomic_type;
}

// Chains of types longer than this are taken for broken DWARF (a cycle).
constexpr int kMaxTypeDepth = 64;

// TYPE without qualifiers (and typedefs with TYPEDEFS), in place.
bool strip(Dwarf_Die* type, bool typedefs) {
  for (int depth = 0; depth < kMaxTypeDepth; ++depth) {
    int tag = dwarf_tag(type);
    if (!is_qualifier(tag) && !(typedefs && tag == DW_TAG_typedef)) return true;
    Dwarf_Attribute attr;
    Dwarf_Die next;
    if (dwarf_formref_die(dwarf_attr_integrate(type, DW_AT_type, &attr), &next) == nullptr)
      return false;
    *type = next;
  }
  return false;
}

bool type_ref(Dwarf_Die* die, Dwarf_Die* type) {
  Dwarf_Attribute attr;
  return dwarf_formref_die(dwarf_attr_integrate(die, DW_AT_type, &attr), type) != nullptr;
}

// A C type as a chain of members and indexes sees it: a DWARF type without qualifiers and
// typedefs, or inside a multi-dimensional array the array less its first DIMS dimensions.
struct CType {
  Dwarf_Die die{};
  bool known = false;
  size_t dims = 0;
  int tag() const { return known ? dwarf_tag(const_cast<Dwarf_Die*>(&die)) : 0; }
};

// What DIE's DW_AT_type is, qualifiers and typedefs left out.
CType real_type(Dwarf_Die* die) {
  CType t;
  t.known = type_ref(die, &t.die) && strip(&t.die, true);
  return t;
}

// The element counts of an array type, -1 where unknown (a flexible array member).
std::vector<int64_t> array_counts(Dwarf_Die* array) {
  std::vector<int64_t> counts;
  Dwarf_Die sub;
  if (dwarf_child(array, &sub) != 0) return counts;
  do {
    if (dwarf_tag(&sub) != DW_TAG_subrange_type) continue;
    std::optional<Dwarf_Word> count = udata(&sub, DW_AT_count);
    std::optional<Dwarf_Word> upper = udata(&sub, DW_AT_upper_bound);
    Dwarf_Word lower = udata(&sub, DW_AT_lower_bound).value_or(0);
    if (count)
      counts.push_back(static_cast<int64_t>(*count));
    else if (upper && *upper + 1 >= lower)
      counts.push_back(static_cast<int64_t>(*upper + 1 - lower));
    else
      counts.push_back(-1);
  } while (dwarf_siblingof(&sub, &sub) == 0);
  return counts;
}

// What T[i] is.
CType element_of(const CType& t) {
  if (t.tag() == DW_TAG_array_type) {
    Dwarf_Die die = t.die;
    if (t.dims + 1 < array_counts(&die).size()) return CType{t.die, true, t.dims + 1};
  }
  Dwarf_Die die = t.die;
  return real_type(&die);
}

std::optional<uint64_t> size_of(const CType& t) {
  if (!t.known) return std::nullopt;
  Dwarf_Die die = t.die;
  if (t.tag() == DW_TAG_array_type) {
    std::vector<int64_t> counts = array_counts(&die);
    CType elem = real_type(&die);
    std::optional<uint64_t> size = size_of(elem);
    for (size_t i = t.dims; size && i < counts.size(); ++i) {
      if (counts[i] < 0) return std::nullopt;
      *size *= static_cast<uint64_t>(counts[i]);
    }
    return size;
  }
  if (std::optional<Dwarf_Word> bytes = udata(&die, DW_AT_byte_size)) return *bytes;
  if (t.tag() == DW_TAG_pointer_type) return 8;
  return std::nullopt;
}

bool is_signed(Dwarf_Die* type) {
  std::optional<Dwarf_Word> enc = udata(type, DW_AT_encoding);
  return enc &&
         (*enc == DW_ATE_signed || *enc == DW_ATE_signed_char || *enc == DW_ATE_signed_fixed);
}

bool type_text(Dwarf_Die* type, std::string* out, int depth = 0) {
  Dwarf_Die t = *type;
  if (depth > kMaxTypeDepth || !strip(&t, false)) return false;
  int tag = dwarf_tag(&t);
  if (tag == DW_TAG_pointer_type || tag == DW_TAG_array_type ||
      tag == DW_TAG_reference_type || tag == DW_TAG_rvalue_reference_type) {
    Dwarf_Die inner;
    if (!type_ref(&t, &inner) || !type_text(&inner, out, depth + 1)) return false;
    *out += tag == DW_TAG_reference_type ? "&" : tag == DW_TAG_rvalue_reference_type ? "&&" : "*";
    return true;
  }
  if (tag == DW_TAG_subroutine_type) {
    *out += "(function_type)";
    return true;
  }
  const char* name = dwarf_diename(&t);
  if (name == nullptr) return false;
  if (tag == DW_TAG_union_type) *out += "union ";
  if (tag == DW_TAG_structure_type) *out += "struct ";
  if (tag == DW_TAG_enumeration_type) *out += "enum ";
  *out += name;
  return true;
}

// ---- fetches ----

// A fetch as perf builds it: a base (a register, an immediate, or a global's address) and
// the dereferences around it, innermost first. A global's first entry is the offset from
// its address, which "@ADDR+OFF" already reads.
struct Fetch {
  std::string base;
  bool global = false;
  Dwarf_Addr address = 0;
  std::string dwarf_name;  // a global's DWARF name, kprobe syntax's last resort
  std::vector<int64_t> derefs;
};

Result<Fetch> register_fetch(unsigned regno, bool deref, int64_t offset) {
  if (regno >= std::size(kRegisters)) return make_error(-ENOTSUP, kNotSupported);
  Fetch f;
  f.base = kRegisters[regno];
  if (deref) f.derefs.push_back(offset);
  return f;
}

// A single-operation register location: DW_OP_regN, DW_OP_bregN, DW_OP_regx, DW_OP_bregx.
// ADD is added to a breg's offset; a reg with DEREF becomes memory at the register + ADD
// (perf's reading of a frame base in a register).
Result<Fetch> register_location(const Dwarf_Op& op, bool deref, int64_t add) {
  if (op.atom >= DW_OP_reg0 && op.atom <= DW_OP_reg31)
    return register_fetch(op.atom - DW_OP_reg0, deref, add);
  if (op.atom == DW_OP_regx) return register_fetch(static_cast<unsigned>(op.number), deref, add);
  if (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg31)
    return register_fetch(op.atom - DW_OP_breg0, true, static_cast<int64_t>(op.number) + add);
  if (op.atom == DW_OP_bregx)
    return register_fetch(static_cast<unsigned>(op.number), true,
                          static_cast<int64_t>(op.number2) + add);
  return make_error(-ENOTSUP, kNotSupported);
}

// The translation of one place: its scope, real function and CU.
class Translator {
 public:
  explicit Translator(const VarContext& ctx) : ctx_(ctx) {
    for (Dwarf_Die d : ctx.scopes) {
      if (dwarf_tag(&d) == DW_TAG_subprogram || dwarf_tag(&d) == DW_TAG_inlined_subroutine) {
        scope_ = d;
        has_scope_ = true;
        break;
      }
    }
    if (!ctx.scopes.empty()) {
      Dwarf_Die last = ctx.scopes.back();
      has_cu_ = dwarf_diecu(&last, &cu_, nullptr, nullptr) != nullptr;
    }
    // perf's die_find_realfunc: the CU's own subprogram holding pc, whose frame base and
    // entry count (an inlined instance has neither).
    Dwarf_Die child;
    if (has_cu_ && dwarf_child(&cu_, &child) == 0) {
      do {
        if (dwarf_tag(&child) == DW_TAG_subprogram && dwarf_haspc(&child, ctx.pc) == 1) {
          function_ = child;
          has_function_ = true;
          break;
        }
      } while (dwarf_siblingof(&child, &child) == 0);
    }
    // A function nested in another's DIE (a lambda's operator(), a local class's method)
    // is not among the CU's children: the place's own subprogram then.
    for (size_t i = 0; !has_function_ && i < ctx.scopes.size(); ++i) {
      Dwarf_Die d = ctx.scopes[i];
      if (dwarf_tag(&d) == DW_TAG_subprogram && dwarf_haspc(&d, ctx.pc) == 1) {
        function_ = d;
        has_function_ = true;
      }
    }
  }

  Result<std::vector<TraceArg>> translate(const ProbeArg& arg);
  std::vector<std::string> available(bool externs, bool range);

 private:
  std::string range_of(Dwarf_Die* var);
  bool located_later(Dwarf_Die* var);
  bool find(const std::string& name, Dwarf_Die* out);
  Result<Fetch> locate(Dwarf_Die* var, const std::string& shown);
  Result<Fetch> static_location(Dwarf_Die* var, const Dwarf_Op* op);
  Result<Fetch> frame_based(int64_t offset);
  Result<TraceArg> variable(const ProbeArg& arg);
  std::vector<std::string> expand(bool vars);
  Result<std::string> render(const Fetch& f);
  Result<std::string> global_text(const Fetch& f);

  const VarContext& ctx_;
  Dwarf_Die scope_{}, function_{}, cu_{};
  bool has_scope_ = false, has_function_ = false, has_cu_ = false;
};

// perf's die_find_variable_at: in the scope, depth first into what holds pc, the first
// parameter or variable of that name with a location, a constant value or external linkage;
// then the same among the CU's own children.
bool Translator::find(const std::string& name, Dwarf_Die* out) {
  auto at = [&name](Dwarf_Addr pc) {
    return [&name, pc](Dwarf_Die* d) {
      const char* n = dwarf_diename(d);
      if (is_variable_tag(dwarf_tag(d)) && n != nullptr && name == n &&
          (has_attr(d, DW_AT_external) || has_attr(d, DW_AT_location) ||
           has_attr(d, DW_AT_const_value)))
        return Walk::kFound;
      return dwarf_haspc(d, pc) == 1 ? Walk::kDescend : Walk::kNext;
    };
  };
  return (has_scope_ && walk_children(&scope_, at(ctx_.pc), out)) ||
         (has_cu_ && walk_children(&cu_, at(0), out));
}

Result<Fetch> Translator::static_location(Dwarf_Die* var, const Dwarf_Op* op) {
  Fetch f;
  f.global = true;
  f.derefs.push_back(0);
  const char* name = dwarf_diename(var);
  f.dwarf_name = name != nullptr ? name : "";
  if (op != nullptr) {
    f.address = op->number;
    return f;
  }
  // A declaration (extern int x;): its address is the ELF symbol's.
  const ElfSymbol* sym =
      ctx_.image != nullptr && name != nullptr ? ctx_.image->find_object(name) : nullptr;
  if (sym != nullptr) {
    f.address = sym->value;
    return f;
  }
  if (ctx_.kprobe_syntax && name != nullptr) return f;  // "@NAME+0" needs no address
  return make_error(-ENOENT, "Failed to find the address of the '" + f.dwarf_name + "' variable.");
}

// DW_OP_fbreg OFFSET through the real function's frame base at pc.
Result<Fetch> Translator::frame_based(int64_t offset) {
  Dwarf_Attribute attr;
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  if (!has_function_ || dwarf_attr(&function_, DW_AT_frame_base, &attr) == nullptr ||
      dwarf_getlocation_addr(&attr, ctx_.pc, &ops, &nops, 1) <= 0 || nops != 1)
    return make_error(-ENOTSUP, kNotSupported);
  if (ops[0].atom != DW_OP_call_frame_cfa) return register_location(ops[0], true, offset);
  if (ctx_.cfi == nullptr) return make_error(-ENOTSUP, kNotSupported);
  Dwarf_Frame* frame = nullptr;
  Dwarf_Op* cfa = nullptr;
  size_t ncfa = 0;
  if (dwarf_cfi_addrframe(ctx_.cfi, ctx_.pc, &frame) != 0 ||
      dwarf_frame_cfa(frame, &cfa, &ncfa) != 0) {
    std::free(frame);
    char buf[64];
    std::snprintf(buf, sizeof buf, "Failed to get call frame on 0x%" PRIx64,
                  static_cast<uint64_t>(ctx_.pc));
    return make_error(-ENOENT, buf);
  }
  // The CFA is a value (reg + off), not a location: memory at CFA + OFFSET.
  Result<Fetch> f = ncfa == 1 ? register_location(cfa[0], true, offset)
                              : Result<Fetch>(make_error(-ENOTSUP, kNotSupported));
  std::free(frame);  // CFA points into it
  return f;
}

// perf's convert_variable_location: where VAR is at pc. SHOWN names it in the message.
Result<Fetch> Translator::locate(Dwarf_Die* var, const std::string& shown) {
  Dwarf_Attribute attr;
  Dwarf_Op* ops = nullptr;
  size_t nops = 0;
  bool external = has_attr(var, DW_AT_external);
  bool has_location = dwarf_attr(var, DW_AT_location, &attr) != nullptr;
  if (external && !has_location) return static_location(var, nullptr);
  Dwarf_Attribute const_attr;
  if (!external && dwarf_attr(var, DW_AT_const_value, &const_attr) != nullptr) {
    Dwarf_Sword value;
    if (dwarf_formsdata(&const_attr, &value) != 0) return make_error(-ENOTSUP, kNotSupported);
    Fetch f;
    f.base = "\\" + std::to_string(value);
    return f;
  }
  if (!has_location) {
    Error e = missing(shown);
    e.code = -EINVAL;
    return e;
  }
  if (dwarf_getlocation_addr(&attr, ctx_.pc, &ops, &nops, 1) <= 0) {
    // perf's fentry rule: a parameter without a location at its function's very entry is
    // taken where it first has one.
    Dwarf_Addr entry = 0, high = 0;
    bool found = false;
    if (has_function_ && dwarf_tag(var) == DW_TAG_formal_parameter &&
        dwarf_entrypc(&function_, &entry) == 0 && entry == ctx_.pc &&
        dwarf_highpc(&function_, &high) == 0) {
      for (Dwarf_Addr a = ctx_.pc + 1; a <= high && !found; ++a)
        found = dwarf_getlocation_addr(&attr, a, &ops, &nops, 1) > 0;
    }
    if (!found) return missing(shown);
  }
  if (nops == 0) return missing(shown);
  if (nops != 1) return make_error(-ENOTSUP, kNotSupported);
  const Dwarf_Op& op = ops[0];
  if (op.atom == DW_OP_addr) return static_location(var, &op);
  if (op.atom == DW_OP_addrx || op.atom == DW_OP_GNU_addr_index) {
    Dwarf_Attribute addr_attr;
    Dwarf_Op resolved = op;
    if (dwarf_getlocation_attr(&attr, &op, &addr_attr) != 0 ||
        dwarf_formaddr(&addr_attr, &resolved.number) != 0)
      return make_error(-ENOTSUP, kNotSupported);
    return static_location(var, &resolved);
  }
  if (external) return make_error(-ENOTSUP, kNotSupported);  // thread-local and the like
  if (op.atom == DW_OP_fbreg) return frame_based(static_cast<int64_t>(op.number));
  return register_location(op, false, 0);
}

// perf's die_get_data_member_location: a constant or DW_OP_plus_uconst.
std::optional<uint64_t> member_offset(Dwarf_Die* member) {
  Dwarf_Attribute attr;
  if (dwarf_attr(member, DW_AT_data_member_location, &attr) == nullptr) return std::nullopt;
  Dwarf_Word offs;
  if (dwarf_formudata(&attr, &offs) == 0) return offs;
  Dwarf_Op* expr = nullptr;
  size_t n = 0;
  if (dwarf_getlocation(&attr, &expr, &n) != 0 || n != 1 || expr[0].atom != DW_OP_plus_uconst)
    return std::nullopt;
  return expr[0].number;
}

// A bitfield as the kernel's b<width>@<bit>/<container> reads it, from the low bit, at the
// byte offset it is read from.
struct Bitfield {
  uint64_t byte_offset = 0;
  int width = 0, bit = 0, container = 0;
};

Result<Bitfield> bitfield_of(Dwarf_Die* member, int width, const std::string& field) {
  CType type = real_type(member);
  std::optional<Dwarf_Word> unit = udata(member, DW_AT_byte_size);
  if (!unit) unit = size_of(type);
  Bitfield b;
  b.width = width;
  if (!unit || *unit == 0 || *unit > 8)
    return make_error(-ENOENT, "Failed to get the offset of " + field + ".");
  int bits = static_cast<int>(*unit * 8);
  if (std::optional<Dwarf_Word> data_bit = udata(member, DW_AT_data_bit_offset)) {
    // DWARF 5: bits from the start of the structure. Read from the aligned unit of the
    // type's size, or, for a packed field that straddles one, from its first byte.
    b.byte_offset = *data_bit / bits * *unit;
    b.bit = static_cast<int>(*data_bit - b.byte_offset * 8);
    b.container = bits;
    if (b.bit + width > bits) {
      b.byte_offset = *data_bit / 8;
      b.bit = static_cast<int>(*data_bit % 8);
      b.container = 8;
      while (b.container < b.bit + width) b.container *= 2;
    }
  } else {
    // DWARF 2-4: the storage unit at DW_AT_data_member_location, DW_AT_bit_offset counted
    // from its high bit (little-endian).
    std::optional<Dwarf_Word> high_bit = udata(member, DW_AT_bit_offset);
    std::optional<uint64_t> offs = member_offset(member);
    if (!offs || !high_bit || static_cast<int64_t>(*high_bit) + width > bits)
      return make_error(-ENOENT, "Failed to get the offset of " + field + ".");
    b.byte_offset = *offs;
    b.bit = bits - static_cast<int>(*high_bit) - width;
    b.container = bits;
  }
  if (b.container > 64) return make_error(-ENOTSUP, kNotSupported);
  return b;
}

// perf's die_find_member: NAME among STRUCT's members, looking into unnamed members; the
// path of members from STRUCT down to it.
// A type with members: C's struct and union, C++'s class.
bool is_record(int tag) {
  return tag == DW_TAG_structure_type || tag == DW_TAG_union_type || tag == DW_TAG_class_type;
}

bool is_reference(int tag) {
  return tag == DW_TAG_reference_type || tag == DW_TAG_rvalue_reference_type;
}

// libstdc++'s std::string (std::__cxx11::basic_string<char, ...>): its characters are at
// its _M_dataplus._M_p.
bool is_std_string(const CType& t) {
  if (!t.known || !is_record(t.tag())) return false;
  const char* n = dwarf_diename(const_cast<Dwarf_Die*>(&t.die));
  return n != nullptr && std::strncmp(n, "basic_string<char,", 18) == 0;
}

bool find_member(Dwarf_Die* st, const std::string& name, std::vector<Dwarf_Die>* path) {
  Dwarf_Die m;
  if (path->size() > kMaxTypeDepth || dwarf_child(st, &m) != 0) return false;
  do {
    if (dwarf_tag(&m) != DW_TAG_member) continue;
    const char* n = dwarf_diename(&m);
    if (n != nullptr && name == n) {
      path->push_back(m);
      return true;
    }
    CType t = real_type(&m);
    if (n == nullptr && t.known && is_record(t.tag())) {
      path->push_back(m);
      if (find_member(&t.die, name, path)) return true;
      path->pop_back();
    }
  } while (dwarf_siblingof(&m, &m) == 0);
  return false;
}

// Where a chain of members and indexes has got to.
struct Chain {
  Fetch fetch;
  CType type;
  std::string holder;               // what perf names in messages: the variable, a member
  std::optional<Dwarf_Die> member;  // the last step was this member (its bitfield)
};

Status step(Chain* c, const ArgField& field, const std::string& varname) {
  if (!c->type.known) return make_error(-ENOENT, "Failed to get the type of " + varname + ".");
  int tag = c->type.tag();
  bool index = field.kind == ArgField::Kind::kIndex;
  if (index && (tag == DW_TAG_array_type || tag == DW_TAG_pointer_type)) {
    CType elem = element_of(c->type);
    if (!elem.known) return make_error(-ENOENT, "Failed to get the type of " + varname + ".");
    std::optional<uint64_t> size = size_of(elem);
    if (!size && field.index != 0)
      return make_error(-ENOENT, "Failed to get the type of " + varname + ".");
    if (tag == DW_TAG_pointer_type)
      c->fetch.derefs.push_back(0);
    else if (c->fetch.derefs.empty())
      return make_error(-ENOTSUP, kRegisterStruct);
    c->fetch.derefs.back() += static_cast<int64_t>(size.value_or(0)) * field.index;
    c->type = elem;
    c->holder = "(null)";  // perf's holder is the array type, which has no name
    c->member.reset();
    return Ok{};
  }
  CType st = c->type;
  if (tag == DW_TAG_pointer_type || is_reference(tag)) {
    // A C++ reference is its object's address, members taken with '.'.
    const bool arrow = field.kind == ArgField::Kind::kArrow;
    if (tag == DW_TAG_pointer_type && !arrow)
      return make_error(-EINVAL, "Semantic error: " + field.name + " must be referred by '->'");
    if (is_reference(tag) && arrow)
      return make_error(-EINVAL, "Semantic error: " + field.name + " must be referred by '.'");
    st = element_of(c->type);
    if (!st.known) return make_error(-ENOENT, "Failed to get the type of " + varname + ".");
    if (!is_record(st.tag()))
      return make_error(-EINVAL, varname + " is not a data structure nor a union.");
    c->fetch.derefs.push_back(0);
  } else {
    if (!is_record(tag))
      return make_error(-EINVAL, varname + " is not a data structure nor a union.");
    if (index)
      return make_error(-EINVAL, "Semantic error: " + varname + " is not a pointer nor array.");
    if (field.kind == ArgField::Kind::kArrow)
      return make_error(-EINVAL, "Semantic error: " + field.name + " must be referred by '.'");
    if (c->fetch.derefs.empty()) return make_error(-ENOTSUP, kRegisterStruct);
  }
  std::vector<Dwarf_Die> path;
  if (!find_member(&st.die, field.name, &path))
    return make_error(
        -EINVAL, varname + "(type:" + name_of(&st.die) + ") has no member " + field.name + ".");
  CType in = st;
  for (Dwarf_Die& m : path) {
    if (in.tag() != DW_TAG_union_type) {
      std::optional<uint64_t> offs = member_offset(&m);
      std::optional<Dwarf_Word> width = udata(&m, DW_AT_bit_size);
      if (!offs && width) {
        Result<Bitfield> b = bitfield_of(&m, static_cast<int>(*width), field.name);
        if (!b) return b.error();
        offs = b->byte_offset;
      }
      if (!offs) return make_error(-ENOENT, "Failed to get the offset of " + field.name + ".");
      c->fetch.derefs.back() += static_cast<int64_t>(*offs);
    }
    in = real_type(&m);
  }
  c->type = in;
  c->holder = field.name;
  c->member = path.back();
  return Ok{};
}

// perf's convert_variable_type: the kernel type of what the chain reads, and for :string
// on a pointer the dereference.
Status convert_type(Chain* c, const std::string& cast, TraceArg* out) {
  bool stringy = cast == "string" || cast == "ustring";
  if (!cast.empty() && !stringy && cast != "x" && cast != "s" && cast != "u") {
    out->type = cast;
    return Ok{};
  }
  if (c->member) {
    if (std::optional<Dwarf_Word> width = udata(&*c->member, DW_AT_bit_size)) {
      Result<Bitfield> b = bitfield_of(&*c->member, static_cast<int>(*width), c->holder);
      if (!b) return b.error();
      out->type = "b" + std::to_string(b->width) + "@" + std::to_string(b->bit) + "/" +
                  std::to_string(b->container);
      return Ok{};
    }
  }
  if (!c->type.known)
    return make_error(-ENOENT, "Failed to get a type information of " + c->holder + ".");
  int tag = c->type.tag();
  // A reference to a value reads the value (a reference to an object stays its address).
  if (is_reference(tag)) {
    CType to = element_of(c->type);
    if (to.known && (!is_record(to.tag()) || (stringy && is_std_string(to)))) {
      c->fetch.derefs.push_back(0);
      c->type = to;
      tag = to.tag();
    }
  }
  // std::string as a string: the characters its data pointer points to.
  if (stringy && is_std_string(c->type)) {
    const std::string holder = c->holder;
    for (const char* m : {"_M_dataplus", "_M_p"}) {
      ArgField f;
      f.kind = ArgField::Kind::kDot;
      f.name = m;
      if (Status st = step(c, f, holder); !st) return st;
    }
    c->holder = holder;
    c->member.reset();
    tag = c->type.tag();
  }
  if (stringy) {
    if (tag != DW_TAG_pointer_type && tag != DW_TAG_array_type)
      return make_error(-EINVAL, "Failed to cast into string: " + c->holder + "(" +
                                     name_of(&c->type.die) + ") is not a pointer nor array.");
    CType elem = element_of(c->type);
    if (!elem.known) return make_error(-ENOENT, "Failed to get a type information.");
    const char* n = elem.dims == 0 ? dwarf_diename(&elem.die) : nullptr;
    if (n == nullptr || (std::strcmp(n, "char") != 0 && std::strcmp(n, "unsigned char") != 0))
      return make_error(-EINVAL,
                        "Failed to cast into string: " + c->holder + " is not (unsigned) char *.");
    if (tag == DW_TAG_pointer_type) c->fetch.derefs.push_back(0);
    out->type = cast;
    return Ok{};
  }
  // perf's size is DW_AT_byte_size: an array has none and gets the kernel's default.
  std::optional<Dwarf_Word> bytes =
      c->type.dims == 0 ? udata(&c->type.die, DW_AT_byte_size) : std::nullopt;
  if (tag == DW_TAG_array_type || !bytes || *bytes == 0) return Ok{};
  char prefix = !cast.empty() ? cast[0] : is_signed(&c->type.die) ? 's' : 'x';
  out->type = prefix + std::to_string(std::min<Dwarf_Word>(*bytes * 8, 64));
  return Ok{};
}

Result<std::string> Translator::render(const Fetch& f) {
  std::string text = f.base;
  size_t first = 0;
  if (f.global) {
    first = 1;
    Result<std::string> at = global_text(f);
    if (!at) return at;
    text = *at;
  }
  for (size_t i = first; i < f.derefs.size(); ++i)
    text = signed_text(f.derefs[i]) + "(" + text + ")";
  return text;
}

// A global's address and first offset: "@SYM+OFF" with the ELF symbol that holds it (kprobe
// syntax), or "@+OFF" from the probed mapping (uprobe syntax).
Result<std::string> Translator::global_text(const Fetch& f) {
  int64_t off = f.derefs[0];
  if (ctx_.kprobe_syntax) {
    if (ctx_.image != nullptr && f.address != 0) {
      const ElfSymbol* sym = nullptr;
      for (const ElfSymbol& s : ctx_.image->symbols())
        if (!s.function && f.address >= s.value &&
            (f.address < s.value + s.size || f.address == s.value))
          sym = &s;
      if (sym != nullptr)
        return "@" + sym->name + signed_text(static_cast<int64_t>(f.address - sym->value) + off);
    }
    return "@" + f.dwarf_name + signed_text(off);
  }
  std::optional<uint64_t> pc_offset =
      ctx_.image != nullptr ? ctx_.image->file_offset(ctx_.pc) : std::nullopt;
  uint64_t target = f.address + static_cast<uint64_t>(off);
  if (!pc_offset || target + *pc_offset < ctx_.pc)
    return make_error(-ENOENT,
                      "Failed to find the address of the '" + f.dwarf_name + "' variable.");
  char buf[32];
  std::snprintf(buf, sizeof buf, "@+0x%" PRIx64, target - ctx_.pc + *pc_offset);
  return std::string(buf);
}

Result<TraceArg> Translator::variable(const ProbeArg& arg) {
  TraceArg out;
  out.name = arg_name(arg);
  Dwarf_Die var;
  if (!find(arg.var, &var)) return missing(arg.var);
  Result<Fetch> where = locate(&var, arg.var);
  if (!where) return where.error();
  Chain c{*where, real_type(&var), name_of(&var), std::nullopt};
  std::string varname = arg.var;
  for (const ArgField& f : arg.fields) {
    if (Status s = step(&c, f, varname); !s) return s.error();
    varname = f.kind == ArgField::Kind::kIndex ? "[" + std::to_string(f.index) + "]" : f.name;
  }
  if (Status s = convert_type(&c, arg.type, &out); !s) return s.error();
  Result<std::string> fetch = render(c.fetch);
  if (!fetch) return fetch.error();
  out.fetch = *fetch;
  return out;
}

// perf's expand_probe_args: the names of the parameters (and with VARS the variables) that
// have a location here, in DIE order, depth first into what holds pc.
std::vector<std::string> Translator::expand(bool vars) {
  std::vector<std::string> names;
  if (!has_scope_) return names;
  Dwarf_Die unused;
  walk_children(
      &scope_,
      [&](Dwarf_Die* d) {
        int tag = dwarf_tag(d);
        const char* n = dwarf_diename(d);
        if ((tag == DW_TAG_formal_parameter || (vars && tag == DW_TAG_variable)) && n != nullptr &&
            locate(d, n).ok())
          names.push_back(n);
        return dwarf_haspc(d, ctx_.pc) == 1 ? Walk::kDescend : Walk::kNext;
      },
      &unused);
  return names;
}

Result<std::vector<TraceArg>> Translator::translate(const ProbeArg& arg) {
  constexpr char kRetLocal[] = "Semantic error :You can't specify local variable for kretprobe.";
  std::vector<TraceArg> out;
  if (arg.var == "$retval") {
    if (!ctx_.retprobe) return make_error(-EINVAL, "$retval is not available on probe");
    out.push_back(TraceArg{arg.name, arg.var, arg.type});
    return out;
  }
  if (arg.var == "$params" || arg.var == "$vars") {
    if (ctx_.retprobe) return make_error(-EINVAL, kRetLocal);
    for (const std::string& n : expand(arg.var == "$vars")) {
      ProbeArg one;
      one.var = n;
      one.text = n;
      Result<TraceArg> t = variable(one);
      if (!t) return t.error();
      out.push_back(*t);
    }
    return out;
  }
  if (!is_c_varname(arg.var)) {
    out.push_back(TraceArg{arg.name, arg.var, arg.type});
    return out;
  }
  if (ctx_.retprobe) return make_error(-EINVAL, kRetLocal);
  Result<TraceArg> t = variable(arg);
  if (!t) return t.error();
  out.push_back(*t);
  return out;
}

std::vector<std::string> Translator::available(bool externs, bool range) {
  std::vector<std::string> out;
  auto collect = [&](Dwarf_Die* d, bool external) {
    const char* n = dwarf_diename(d);
    if (!is_variable_tag(dwarf_tag(d)) || n == nullptr) return;
    // Not here but later in the function: perf shows a local (not a parameter) as [INV]
    // with --range, and leaves it out without.
    const bool here = locate(d, n).ok();
    const bool later = !here && range && dwarf_tag(d) == DW_TAG_variable && located_later(d);
    if (!here && !later) return;
    Dwarf_Die type;
    std::string text = range ? (external ? "[EXT]\t" : here ? "[VAL]\t" : "[INV]\t") : "";
    text += type_name(type_ref(d, &type) ? &type : nullptr) + "\t" + n;
    if (range && !external) {
      const std::string where = range_of(d);
      if (where == "-") return;  // perf leaves out what it cannot place
      text += "\t" + where;
    }
    out.push_back(std::move(text));
  };
  Dwarf_Die unused;
  if (has_scope_)
    walk_children(
        &scope_,
        [&](Dwarf_Die* d) {
          collect(d, false);
          return dwarf_haspc(d, ctx_.pc) == 1 ? Walk::kDescend : Walk::kNext;
        },
        &unused);
  if (externs && has_cu_)
    walk_children(
        &cu_,
        [&](Dwarf_Die* d) {
          collect(d, true);
          return Walk::kNext;
        },
        &unused);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Whether VAR has no location at pc but a readable one after it, at the first address
// up to the end of the real function that has one (perf's look ahead).
bool Translator::located_later(Dwarf_Die* var) {
  Dwarf_Attribute attr;
  Dwarf_Addr high = 0;
  Dwarf_Op* ops;
  size_t nops;
  if (!has_function_ || dwarf_attr(var, DW_AT_location, &attr) == nullptr ||
      dwarf_highpc(&function_, &high) != 0 ||
      dwarf_getlocation_addr(&attr, ctx_.pc, &ops, &nops, 1) != 0)
    return false;
  // The first address after pc that a location covers: where an entry starts, or pc + 1.
  Dwarf_Addr base, start, end, first = 0;
  for (ptrdiff_t off = 0; (off = dwarf_getlocations(&attr, off, &base, &start, &end, &ops, &nops)) > 0;) {
    const Dwarf_Addr from = std::max<Dwarf_Addr>(start, ctx_.pc + 1);
    if (start != end && end > from && from <= high && (first == 0 || from < first)) first = from;
  }
  if (first == 0) return false;
  VarContext there = ctx_;
  there.pc = first;
  const char* n = dwarf_diename(var);
  return Translator(there).locate(var, n != nullptr ? n : "").ok();
}

// --range: where VAR is valid, from the real function's entry, as perf prints it:
// "@<FUNC+[S-E,S-E...]>" for a location list, or the ranges of the scope that holds VAR
// for a single location. "-" when it cannot be told (perf then drops the variable).
std::string Translator::range_of(Dwarf_Die* var) {
  Dwarf_Addr entry = 0;
  const char* fname = has_function_ ? dwarf_diename(&function_) : nullptr;
  Dwarf_Attribute attr;
  if (fname == nullptr || dwarf_entrypc(&function_, &entry) != 0 ||
      dwarf_attr(var, DW_AT_location, &attr) == nullptr)
    return "-";
  std::string out;
  auto add = [&](Dwarf_Addr s, Dwarf_Addr e) {
    out += out.empty() ? "@<" + std::string(fname) + "+[" : ",";
    out += std::to_string(s - entry) + "-" + std::to_string(e - entry);
  };
  Dwarf_Addr base, start, end;
  Dwarf_Op* ops;
  size_t nops;
  for (ptrdiff_t off = 0; (off = dwarf_getlocations(&attr, off, &base, &start, &end, &ops, &nops)) > 0;) {
    if (start != 0) {
      add(start, end);
      continue;
    }
    // One location for the whole scope: the ranges of the scope that holds VAR.
    Dwarf_Die* scopes = nullptr;
    const int n = dwarf_getscopes_die(var, &scopes);
    if (n > 1)
      for (ptrdiff_t r = 0; (r = dwarf_ranges(&scopes[1], r, &base, &start, &end)) > 0;) add(start, end);
    free(scopes);
    if (n <= 1) return "-";
    break;
  }
  return out.empty() ? out : out + "]>";
}

}  // namespace

Result<std::vector<TraceArg>> translate_arg(const VarContext& ctx, const ProbeArg& arg) {
  return Translator(ctx).translate(arg);
}

bool is_missing_variable(const Error& error) {
  const std::string& m = error.message;
  return error.code == -ENOENT && m.rfind(kMissingPrefix, 0) == 0 &&
         m.size() > std::strlen(kMissingSuffix) &&
         m.compare(m.size() - std::strlen(kMissingSuffix), std::string::npos, kMissingSuffix) == 0;
}

std::string arg_name(const ProbeArg& arg) {
  if (!arg.name.empty()) return arg.name;
  if (!is_c_varname(arg.var)) return "";
  if (!arg.fields.empty()) {
    std::string last = arg.var;
    for (const ArgField& f : arg.fields)
      if (f.kind != ArgField::Kind::kIndex) last = f.name;
    return last;
  }
  return sanitize(arg.type.empty() ? arg.var : arg.var + "_" + arg.type);
}

std::vector<std::string> available_variables(const VarContext& ctx, bool externs, bool range) {
  return Translator(ctx).available(externs, range);
}

std::string type_name(Dwarf_Die* type) {
  std::string out;
  if (type == nullptr || !type_text(type, &out)) return "(unknown_type)";
  return out;
}

}  // namespace probefs::tools
