// tools/dwarf_vars on real DWARF: the bundled program at -O0 and -O2 and its library, and a
// small program of all kinds of types compiled here at -O0 (DWARF 5 and 4) and -O2.
//
// The expected texts are what perf probe 6.1 writes for the same argument at the same address
// ("Writing event: ..." of `perf probe -v -n -x BIN 'FUNC ARGS'`, gcc 12.2), unless a comment
// says where we deliberately differ and why. perf's addresses: at -O0 after the prologue
// (the line table's next row after the entry, price_order+20), at -O2 the entry.
#include "tools/dwarf_vars.h"

#include <dwarf.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tools/debuginfo.h"
#include "tools/elf_image.h"

namespace probefs::tools {
namespace {

// An object with its DWARF, opened as the helper opens them.
struct Object {
  std::unique_ptr<ElfImage> image;
  std::unique_ptr<DebugInfo> debug;
};

std::unique_ptr<Object> open_object(const std::string& path) {
  auto obj = std::make_unique<Object>();
  Result<std::unique_ptr<ElfImage>> image = ElfImage::open(path);
  if (!image) {
    ADD_FAILURE() << path << ": " << image.error().message;
    return nullptr;
  }
  obj->image = std::move(*image);
  Result<std::unique_ptr<DebugInfo>> debug = DebugInfo::open(*obj->image, {});
  if (!debug) {
    ADD_FAILURE() << path << ": " << debug.error().message;
    return nullptr;
  }
  obj->debug = std::move(*debug);
  return obj;
}

// Every DIE of every CU, depth first, to F(die, cu); F returns true to stop.
template <class F>
bool each_die(Dwarf* dw, F&& f) {
  Dwarf_Off off = 0, next;
  size_t header;
  while (dwarf_nextcu(dw, off, &next, &header, nullptr, nullptr, nullptr) == 0) {
    Dwarf_Die cu;
    if (dwarf_offdie(dw, off + header, &cu) != nullptr) {
      std::vector<Dwarf_Die> todo;
      Dwarf_Die child;
      if (dwarf_child(&cu, &child) == 0) todo.push_back(child);
      while (!todo.empty()) {
        Dwarf_Die d = todo.back();
        todo.pop_back();
        Dwarf_Die more;
        if (dwarf_siblingof(&d, &more) == 0) todo.push_back(more);
        if (dwarf_child(&d, &more) == 0) todo.push_back(more);
        if (f(d, cu)) return true;
      }
    }
    off = next;
  }
  return false;
}

bool named(Dwarf_Die* d, const std::string& name) {
  const char* n = dwarf_diename(d);
  return n != nullptr && name == n;
}

// The function's out-of-line code (a DW_TAG_subprogram with an entry), or its inlined
// instances in DIE order.
std::vector<Dwarf_Die> instances(const Object& obj, const std::string& name, int tag) {
  std::vector<Dwarf_Die> out;
  each_die(obj.debug->dwarf(), [&](Dwarf_Die d, Dwarf_Die) {
    Dwarf_Addr entry;
    if (dwarf_tag(&d) == tag && named(&d, name) && dwarf_entrypc(&d, &entry) == 0) out.push_back(d);
    return false;
  });
  return out;
}

Dwarf_Die cu_of(Dwarf_Die die) {
  Dwarf_Die cu;
  EXPECT_NE(dwarf_diecu(&die, &cu, nullptr, nullptr), nullptr);
  return cu;
}

// The place at PC whose scope is SCOPE: dwarf_getscopes' list from SCOPE outwards, SCOPE
// put first when the list does not hold it (an inlined instance's entry outside its ranges).
VarContext place(const Object& obj, Dwarf_Die scope, Dwarf_Addr pc) {
  VarContext ctx;
  ctx.pc = pc;
  ctx.cfi = obj.debug->cfi();
  ctx.image = obj.image.get();
  Dwarf_Die cu = cu_of(scope);
  Dwarf_Die* scopes = nullptr;
  int n = dwarf_getscopes(&cu, pc, &scopes);
  bool seen = false;
  for (int i = 0; i < n; ++i) {
    seen = seen || dwarf_dieoffset(&scopes[i]) == dwarf_dieoffset(&scope);
    if (seen) ctx.scopes.push_back(scopes[i]);
  }
  std::free(scopes);
  if (!seen) ctx.scopes = {scope, cu};
  return ctx;
}

// Where perf probes FUNC: at -O0 (BODY) past the prologue, the line table's next row after
// the entry; else the entry; plus OFFSET.
enum class At { kEntry, kBody };
VarContext function_place(const Object& obj, const std::string& func, At at,
                          Dwarf_Addr offset = 0) {
  std::vector<Dwarf_Die> fns = instances(obj, func, DW_TAG_subprogram);
  if (fns.empty()) {
    ADD_FAILURE() << "no function " << func;
    return {};
  }
  Dwarf_Addr pc = 0;
  dwarf_entrypc(&fns[0], &pc);
  if (at == At::kBody) {
    Dwarf_Die cu = cu_of(fns[0]);
    Dwarf_Lines* lines = nullptr;
    size_t n = 0;
    EXPECT_EQ(dwarf_getsrclines(&cu, &lines, &n), 0);
    Dwarf_Addr next = 0;
    for (size_t i = 0; i < n; ++i) {
      Dwarf_Addr a;
      if (dwarf_lineaddr(dwarf_onesrcline(lines, i), &a) == 0 && a > pc && (next == 0 || a < next))
        next = a;
    }
    pc = next;
  }
  return place(obj, fns[0], pc + offset);
}

// One argument as the spec parser gives it: [NAME=]VAR{->F|.F|[N]}[:TYPE], or a raw one.
ProbeArg arg(std::string s) {
  ProbeArg a;
  a.text = s;
  size_t eq = s.find('=');
  if (eq != std::string::npos && eq < s.find_first_of("(:")) {
    a.name = s.substr(0, eq);
    s = s.substr(eq + 1);
  }
  size_t colon = s.rfind(':');
  if (colon != std::string::npos) {
    a.type = s.substr(colon + 1);
    s = s.substr(0, colon);
  }
  size_t end = s.find_first_of("-.[");
  if (!(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) end = std::string::npos;
  a.var = s.substr(0, end);
  while (end < s.size()) {
    ArgField f;
    if (s[end] == '[') {
      f.kind = ArgField::Kind::kIndex;
      size_t close = s.find(']', end);
      f.index = std::stol(s.substr(end + 1, close - end - 1));
      end = close + 1;
    } else {
      f.kind = s[end] == '.' ? ArgField::Kind::kDot : ArgField::Kind::kArrow;
      size_t start = end + (s[end] == '.' ? 1 : 2);
      end = s.find_first_of("-.[", start);
      f.name = s.substr(start, end == std::string::npos ? end : end - start);
    }
    a.fields.push_back(f);
  }
  return a;
}

std::string text(const TraceArg& t) {
  return (t.name.empty() ? "" : t.name + "=") + t.fetch + (t.type.empty() ? "" : ":" + t.type);
}

// The arguments (space separated) translated and written as in a definition, or the first
// error as "ERROR(code) message".
std::string translate(const VarContext& ctx, const std::string& args) {
  std::string out;
  size_t pos = 0;
  while (pos < args.size()) {
    size_t end = args.find(' ', pos);
    if (end == std::string::npos) end = args.size();
    Result<std::vector<TraceArg>> r = translate_arg(ctx, arg(args.substr(pos, end - pos)));
    if (!r) return "ERROR(" + std::to_string(r.error().code) + ") " + r.error().message;
    for (const TraceArg& t : *r) out += (out.empty() ? "" : " ") + text(t);
    pos = end + 1;
  }
  return out;
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

class DwarfVars : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    o0_ = open_object(PROBE_PROG_O0).release();
    o2_ = open_object(PROBE_PROG_O2).release();
    lib_ = open_object(PROBE_LIB).release();
  }
  static void TearDownTestSuite() {
    delete o0_;
    delete o2_;
    delete lib_;
  }
  void SetUp() override {
    ASSERT_NE(o0_, nullptr);
    ASSERT_NE(o2_, nullptr);
    ASSERT_NE(lib_, nullptr);
  }
  static Object* o0_;
  static Object* o2_;
  static Object* lib_;
};
Object* DwarfVars::o0_ = nullptr;
Object* DwarfVars::o2_ = nullptr;
Object* DwarfVars::lib_ = nullptr;

TEST_F(DwarfVars, ParametersAndLocalsOnTheStackAtO0) {
  VarContext ctx = function_place(*o0_, "price_order", At::kBody);
  EXPECT_EQ(translate(ctx, "o discount coupon subtotal"),
            "o=-56(%bp):x64 discount=-60(%bp):s32 coupon=-72(%bp):x64 subtotal=-24(%bp):s64");
}

TEST_F(DwarfVars, ParametersInRegistersAtO2) {
  VarContext ctx = function_place(*o2_, "price_order", At::kEntry);
  EXPECT_EQ(translate(ctx, "o discount coupon"), "o=%di:x64 discount=%si:s32 coupon=%dx:x64");
}

TEST_F(DwarfVars, MembersThroughPointersAndValues) {
  const std::string members =
      "o->item o->qty[2] o->bill->postcode o->ship.zone o->note:string o->item:string";
  EXPECT_EQ(translate(function_place(*o0_, "price_order", At::kBody), members),
            "item=+4(-56(%bp)) qty=+32(-56(%bp)):s32 postcode=+8(+56(-56(%bp))):s64 "
            "zone=+40(-56(%bp)):s16 note=+0(+64(-56(%bp))):string item=+4(-56(%bp)):string");
  EXPECT_EQ(translate(function_place(*o2_, "price_order", At::kEntry), members + " o->id:x"),
            "item=+4(%di) qty=+32(%di):s32 postcode=+8(+56(%di)):s64 zone=+40(%di):s16 "
            "note=+0(+64(%di)):string item=+4(%di):string id=+0(%di):x32");
}

TEST_F(DwarfVars, IndexesAndWholeStructures) {
  // A structure wider than 64 bits is cut down to x64, as perf does.
  EXPECT_EQ(translate(function_place(*o0_, "price_order", At::kBody),
                      "o[1] o->item[3] coupon[0] o->ship"),
            "o=+72(-56(%bp)):x64 item=+7(-56(%bp)):s8 coupon=+0(-72(%bp)):s8 "
            "ship=+40(-56(%bp)):x64");
}

TEST_F(DwarfVars, TypesGivenAndNamesMadeFromThem) {
  EXPECT_EQ(translate(function_place(*o0_, "price_order", At::kBody),
                      "coupon:string k=discount:x32 discount:x discount:u discount:s coupon:s "
                      "o->id:x32 x=o->id:u8 discount:char discount:symbol"),
            "coupon_string=+0(-72(%bp)):string k=-60(%bp):x32 discount_x=-60(%bp):x32 "
            "discount_u=-60(%bp):u32 discount_s=-60(%bp):s32 coupon_s=-72(%bp):s64 "
            "id=+0(-56(%bp)):x32 x=+0(-56(%bp)):u8 discount_char=-60(%bp):char "
            "discount_symbol=-60(%bp):symbol");
  // perf names this "discount_b3@0/32", which the kernel refuses as an argument name.
  EXPECT_EQ(translate(function_place(*o0_, "price_order", At::kBody), "discount:b3@0/32"),
            "discount_b3_0_32=-60(%bp):b3@0/32");
}

TEST_F(DwarfVars, ParamsAndVars) {
  VarContext o0 = function_place(*o0_, "price_order", At::kBody);
  EXPECT_EQ(translate(o0, "$params"), "o=-56(%bp):x64 discount=-60(%bp):s32 coupon=-72(%bp):x64");
  EXPECT_EQ(translate(o0, "$vars"),
            "o=-56(%bp):x64 discount=-60(%bp):s32 coupon=-72(%bp):x64 subtotal=-24(%bp):s64 "
            "capped=-32(%bp):s32");
  EXPECT_EQ(translate(o0, "$params subtotal"),
            "o=-56(%bp):x64 discount=-60(%bp):s32 coupon=-72(%bp):x64 subtotal=-24(%bp):s64");
  // At -O2's entry only the parameters have locations (subtotal is DW_OP_lit0, capped has
  // none yet).
  EXPECT_EQ(translate(function_place(*o2_, "price_order", At::kEntry), "$vars"),
            "o=%di:x64 discount=%si:s32 coupon=%dx:x64");
  // main's round, k and o live in blocks that do not hold main's first line; items is a
  // function's static (perf: items=@items+0).
  const ElfSymbol* items = nullptr;
  for (const ElfSymbol& s : o0_->image->symbols())
    if (s.name.rfind("items.", 0) == 0) items = &s;
  ASSERT_NE(items, nullptr);
  EXPECT_EQ(translate(function_place(*o0_, "main", At::kBody), "$vars"),
            "argc=-164(%bp):s32 argv=-176(%bp):x64 rounds=-16(%bp):s32 items=@+" +
                hex(items->value) + " bill=-64(%bp):x64");
}

TEST_F(DwarfVars, RawArgumentsPassThrough) {
  VarContext ctx = function_place(*o0_, "price_order", At::kBody);
  EXPECT_EQ(translate(ctx, "%di +0(%di):u8 n=%si:u32 $arg1 @orders_seen $comm $stack3 \\1"),
            "%di +0(%di):u8 n=%si:u32 $arg1 @orders_seen $comm $stack3 \\1");
}

TEST_F(DwarfVars, ReturnProbes) {
  VarContext ctx = function_place(*o2_, "price_order", At::kEntry);
  ctx.retprobe = true;
  EXPECT_EQ(translate(ctx, "$retval r=$retval:s64 $retval:x32 %ax"),
            "$retval r=$retval:s64 $retval:x32 %ax");
  const std::string refused =
      "ERROR(-22) Semantic error :You can't specify local variable for kretprobe.";
  EXPECT_EQ(translate(ctx, "o"), refused);  // perf's parser says so
  // perf writes "$params" and "$vars" as they are, which the kernel refuses.
  EXPECT_EQ(translate(ctx, "$params"), refused);
  EXPECT_EQ(translate(ctx, "$vars"), refused);
  // perf writes "$retval" on an entry probe; the kernel refuses it with these words.
  ctx.retprobe = false;
  EXPECT_EQ(translate(ctx, "$retval"), "ERROR(-22) $retval is not available on probe");
}

TEST_F(DwarfVars, GlobalsInUprobeSyntax) {
  // perf writes "@orders_seen+0", which uprobe_events refuses. "@+OFF" is read at the
  // probed mapping's start + OFF: in this PIE text's address is its file offset, so OFF is
  // the variable's address, .data and .bss alike.
  VarContext ctx = function_place(*o2_, "price_order", At::kEntry);
  ASSERT_EQ(o2_->image->file_offset(ctx.pc), ctx.pc);
  const ElfSymbol* seen = o2_->image->find_object("orders_seen");
  const ElfSymbol* total = o2_->image->find_object("static_total");
  const ElfSymbol* greeting = o2_->image->find_object("greeting");
  ASSERT_TRUE(seen && total && greeting);
  EXPECT_EQ(translate(ctx, "orders_seen static_total greeting:string"),
            "orders_seen=@+" + hex(seen->value) + ":s64 static_total=@+" + hex(total->value) +
                ":s32 greeting_string=+0(@+" + hex(greeting->value) + "):string");
}

TEST_F(DwarfVars, GlobalsInKprobeSyntax) {
  VarContext ctx = function_place(*o2_, "price_order", At::kEntry);
  ctx.kprobe_syntax = true;
  EXPECT_EQ(translate(ctx, "orders_seen static_total greeting:string"),
            "orders_seen=@orders_seen+0:s64 static_total=@static_total+0:s32 "
            "greeting_string=+0(@greeting+0):string");
  // A function's static: perf writes "@items+0", but its symbol is "items.N".
  VarContext in_main = function_place(*o2_, "main", At::kEntry);
  in_main.kprobe_syntax = true;
  std::string symbol;
  for (const ElfSymbol& s : o2_->image->symbols())
    if (s.name.rfind("items.", 0) == 0) symbol = s.name;
  ASSERT_FALSE(symbol.empty());
  EXPECT_EQ(translate(in_main, "items items[1]"),
            "items=@" + symbol + "+0 items=@" + symbol + "+8:x64");
  in_main.kprobe_syntax = false;
  const ElfSymbol* items = o2_->image->find_object(symbol);
  ASSERT_NE(items, nullptr);
  EXPECT_EQ(translate(in_main, "items[1]"), "items=@+" + hex(items->value + 8) + ":x64");
}

TEST_F(DwarfVars, Bitfields) {
  // perf 6.1: "Failed to get the offset of priority." (gcc 12 writes DWARF 5's
  // DW_AT_data_bit_offset). The kernel counts the bit offset from the low bit.
  EXPECT_EQ(translate(function_place(*o0_, "price_order", At::kBody),
                      "o->priority o->rush o->weight o->priority:u8 o->rush:string"),
            "priority=+20(-56(%bp)):b3@0/32 rush=+20(-56(%bp)):b1@3/32 "
            "weight=+20(-56(%bp)):b9@4/32 priority=+20(-56(%bp)):u8 rush=+20(-56(%bp)):b1@3/32");
  EXPECT_EQ(translate(function_place(*o2_, "price_order", At::kEntry), "o->weight"),
            "weight=+20(%di):b9@4/32");
}

TEST_F(DwarfVars, FrameBaseThroughTheCfi) {
  // main's DW_AT_frame_base is DW_OP_call_frame_cfa; at its entry the CFA is %sp+8.
  VarContext ctx = function_place(*o2_, "main", At::kEntry);
  EXPECT_EQ(translate(ctx, "bill bill.postcode argc"),
            "bill=-152(%sp):x64 postcode=-144(%sp):s64 argc=%di:s32");
  ctx.cfi = nullptr;  // perf: "DW_OP 9c is not supported."
  EXPECT_EQ(translate(ctx, "bill"),
            "ERROR(-95) Sorry, we don't support this variable location yet.");
}

TEST_F(DwarfVars, LocationListAtTwoAddresses) {
  // subtotal at -O2: DW_OP_lit0 first, then nothing, then %bx. perf at price_order+0x20:
  // "Failed to find the location of the 'subtotal' variable at this address.", at +0x80:
  // subtotal=%bx:s64.
  std::vector<Dwarf_Die> fn = instances(*o2_, "price_order", DW_TAG_subprogram);
  ASSERT_EQ(fn.size(), 1u);
  Dwarf_Die var;
  ASSERT_TRUE(each_die(o2_->debug->dwarf(), [&](Dwarf_Die d, Dwarf_Die) {
    var = d;
    return dwarf_tag(&d) == DW_TAG_variable && named(&d, "subtotal");
  }));
  Dwarf_Attribute loc;
  ASSERT_NE(dwarf_attr(&var, DW_AT_location, &loc), nullptr);
  Dwarf_Addr base, start, end, in_register = 0, gap = 0, last_end = 0;
  Dwarf_Op* ops;
  size_t nops;
  for (ptrdiff_t off = 0;
       (off = dwarf_getlocations(&loc, off, &base, &start, &end, &ops, &nops)) > 0;) {
    if (last_end != 0 && start > last_end && gap == 0) gap = last_end;
    if (nops == 1 && ops[0].atom == DW_OP_reg3 && in_register == 0) in_register = start;
    last_end = end;
  }
  ASSERT_NE(in_register, 0u);
  ASSERT_NE(gap, 0u);
  EXPECT_EQ(translate(place(*o2_, fn[0], in_register), "subtotal o"), "subtotal=%bx:s64 o=%cx:x64");
  EXPECT_EQ(translate(place(*o2_, fn[0], gap), "subtotal"),
            "ERROR(-2) Failed to find the location of the 'subtotal' variable at this address.");
}

TEST_F(DwarfVars, ExpressionsAreNotTakenForLocations) {
  // At the inlined clamp's entry, capped is a computation on %si (DW_OP_breg4 0; DW_OP_dup;
  // ... DW_OP_stack_value). perf takes its first operation as the location and writes
  // capped=+0(%si):s32 (and lists it in $vars and -V).
  std::vector<Dwarf_Die> fn = instances(*o2_, "price_order", DW_TAG_subprogram);
  std::vector<Dwarf_Die> inl = instances(*o2_, "clamp", DW_TAG_inlined_subroutine);
  ASSERT_EQ(fn.size(), 1u);
  Dwarf_Addr pc = 0;
  for (Dwarf_Die& d : inl) {
    Dwarf_Addr entry;
    if (dwarf_entrypc(&d, &entry) == 0 && dwarf_haspc(&fn[0], entry) == 1) pc = entry;
  }
  ASSERT_NE(pc, 0u);
  VarContext ctx = place(*o2_, fn[0], pc);
  EXPECT_EQ(translate(ctx, "capped"),
            "ERROR(-95) Sorry, we don't support this variable location yet.");
  EXPECT_EQ(translate(ctx, "$vars"), "o=%cx:x64 discount=%si:s32 coupon=%dx:x64");
}

TEST_F(DwarfVars, InlinedInstances) {
  std::vector<Dwarf_Die> o0 = instances(*o0_, "clamp", DW_TAG_inlined_subroutine);
  ASSERT_EQ(o0.size(), 2u);
  for (Dwarf_Die& d : o0) {
    Dwarf_Addr entry;
    ASSERT_EQ(dwarf_entrypc(&d, &entry), 0);
    VarContext ctx = place(*o0_, d, entry);
    EXPECT_EQ(translate(ctx, "v lo hi r"),
              "v=-36(%bp):s32 lo=-40(%bp):s32 hi=-44(%bp):s32 r=-48(%bp):s32");
    EXPECT_EQ(translate(ctx, "$vars"),  // the instance's DIE order
              "hi=-44(%bp):s32 lo=-40(%bp):s32 v=-36(%bp):s32 r=-48(%bp):s32");
  }
  // At -O2 the instances' parameters have empty location ranges at their entries. perf
  // fails "clamp $vars" as a whole; one place expands to nothing.
  std::vector<Dwarf_Die> o2 = instances(*o2_, "clamp", DW_TAG_inlined_subroutine);
  ASSERT_EQ(o2.size(), 2u);
  for (Dwarf_Die& d : o2) {
    Dwarf_Addr entry;
    ASSERT_EQ(dwarf_entrypc(&d, &entry), 0);
    VarContext ctx = place(*o2_, d, entry);
    EXPECT_EQ(translate(ctx, "v"),
              "ERROR(-2) Failed to find the location of the 'v' variable at this address.");
    EXPECT_EQ(translate(ctx, "$vars"), "");
  }
}

TEST_F(DwarfVars, StaticFunction) {
  EXPECT_EQ(translate(function_place(*o0_, "scale", At::kBody), "v by scaled $params"),
            "v=-20(%bp):s32 by=-24(%bp):s32 scaled=-4(%bp):s32 v=-20(%bp):s32 by=-24(%bp):s32");
  // At -O2 scale is a clone for by == 2: by is DW_AT_const_value, an immediate.
  EXPECT_EQ(translate(function_place(*o2_, "scale", At::kEntry), "$vars"), "v=%di:s32 by=\\2:s32");
}

TEST_F(DwarfVars, LibraryFunction) {
  VarContext ctx = function_place(*lib_, "lib_checksum", At::kEntry);
  EXPECT_EQ(translate(ctx, "s n s:string"), "s=%di:x64 n=%si:s32 s_string=+0(%di):string");
  EXPECT_EQ(translate(ctx, "$vars"), "s=%di:x64 n=%si:s32");
  EXPECT_EQ(translate(ctx, "sum"),  // DW_OP_lit0; DW_OP_stack_value
            "ERROR(-95) Sorry, we don't support this variable location yet.");
}

TEST_F(DwarfVars, Errors) {
  VarContext ctx = function_place(*o0_, "price_order", At::kBody);
  const std::pair<const char*, const char*> cases[] = {
      {"nosuch", "ERROR(-2) Failed to find the location of the 'nosuch' variable at this address."},
      {"o->nosuch", "ERROR(-22) o(type:order) has no member nosuch."},
      {"o.id", "ERROR(-22) Semantic error: id must be referred by '->'"},
      {"o->ship->zone", "ERROR(-22) Semantic error: zone must be referred by '.'"},
      {"discount->x", "ERROR(-22) discount is not a data structure nor a union."},
      {"discount.x", "ERROR(-22) discount is not a data structure nor a union."},
      {"discount[1]", "ERROR(-22) discount is not a data structure nor a union."},
      {"o->id->x", "ERROR(-22) id is not a data structure nor a union."},
      {"o->qty.x", "ERROR(-22) qty is not a data structure nor a union."},
      {"o->qty[1].x", "ERROR(-22) [1] is not a data structure nor a union."},
      {"o->ship[1]", "ERROR(-22) Semantic error: ship is not a pointer nor array."},
      {"o:string", "ERROR(-22) Failed to cast into string: o is not (unsigned) char *."},
      {"discount:string",
       "ERROR(-22) Failed to cast into string: discount(int) is not a pointer nor array."},
      {"o->ship:ustring",
       "ERROR(-22) Failed to cast into string: ship(address) is not a pointer nor array."},
  };
  for (const auto& [spec, want] : cases) EXPECT_EQ(translate(ctx, spec), want) << spec;
  VarContext o2 = function_place(*o2_, "price_order", At::kEntry);
  EXPECT_EQ(translate(o2, "o->bill.postcode"),
            "ERROR(-22) Semantic error: postcode must be referred by '->'");
  // Without the object the uprobe offset of a global cannot be had.
  o2.image = nullptr;
  EXPECT_EQ(translate(o2, "orders_seen"),
            "ERROR(-2) Failed to find the address of the 'orders_seen' variable.");
}

TEST_F(DwarfVars, MissingVariablesAndNames) {
  VarContext ctx = function_place(*o2_, "price_order", At::kEntry);
  Result<std::vector<TraceArg>> missing = translate_arg(ctx, arg("capped"));
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(is_missing_variable(missing.error()));
  Result<std::vector<TraceArg>> unknown = translate_arg(ctx, arg("nosuch"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(is_missing_variable(unknown.error()));
  Result<std::vector<TraceArg>> unsupported = translate_arg(ctx, arg("subtotal"));
  ASSERT_FALSE(unsupported.ok());
  EXPECT_FALSE(is_missing_variable(unsupported.error()));
  EXPECT_FALSE(is_missing_variable(make_error(-ENOENT, "Failed to get the offset of x.")));

  EXPECT_EQ(arg_name(arg("o->bill->postcode")), "postcode");
  EXPECT_EQ(arg_name(arg("o->qty[2]")), "qty");
  EXPECT_EQ(arg_name(arg("o[1]")), "o");
  EXPECT_EQ(arg_name(arg("k=o->id")), "k");
  EXPECT_EQ(arg_name(arg("coupon:string")), "coupon_string");
  EXPECT_EQ(arg_name(arg("%di")), "");
  EXPECT_EQ(arg_name(arg("n=%di")), "n");
}

TEST_F(DwarfVars, AvailableVariables) {
  // perf -V price_order (at the entry: -V skips no prologue) and -V --externs; stdin is
  // <stdio.h>'s declaration, at its copy-relocated symbol.
  VarContext o0 = function_place(*o0_, "price_order", At::kEntry);
  using V = std::vector<std::string>;
  EXPECT_EQ(available_variables(o0, false), (V{"char*\tcoupon", "int\tcapped", "int\tdiscount",
                                               "long int\tsubtotal", "struct order*\to"}));
  EXPECT_EQ(
      available_variables(o0, true),
      (V{"FILE*\tstdin", "char*\tcoupon", "char*\tgreeting", "int\tcapped", "int\tdiscount",
         "int\tstatic_total", "long int\torders_seen", "long int\tsubtotal", "struct order*\to"}));
  VarContext o2 = function_place(*o2_, "price_order", At::kEntry);
  EXPECT_EQ(available_variables(o2, false),
            (V{"char*\tcoupon", "int\tdiscount", "struct order*\to"}));
  EXPECT_EQ(available_variables(o2, true),
            (V{"FILE*\tstdin", "char*\tcoupon", "char*\tgreeting", "int\tdiscount",
               "int\tstatic_total", "long int\torders_seen", "struct order*\to"}));
  // An inlined instance's variables are the instance's.
  std::vector<Dwarf_Die> inl = instances(*o0_, "clamp", DW_TAG_inlined_subroutine);
  ASSERT_FALSE(inl.empty());
  Dwarf_Addr entry;
  ASSERT_EQ(dwarf_entrypc(&inl[0], &entry), 0);
  EXPECT_EQ(available_variables(place(*o0_, inl[0], entry), false),
            (V{"int\thi", "int\tlo", "int\tr", "int\tv"}));
}

// A program of the types the bundled one lacks, compiled here with the system's compiler.
constexpr char kKindsSource[] = R"(#include <stdbool.h>
enum color { RED, GREEN = 300 };
union num { int i; float f; };
struct bits { unsigned a : 3; int b : 5; unsigned char c : 2; unsigned long long d : 40; };
struct outer {
  int head;
  struct { int ax; int ay; };
  union { int ux; long uy; };
  int mat[2][3];
  void *vp;
  int (*fn)(int);
  const char name[4];
};
typedef struct { int a; short b; } pair_t;
__thread int tcount = 1;
extern int gdecl;
int gdecl = 5;
__attribute__((noinline)) int kinds(bool bo, unsigned u, unsigned char uc, enum color col,
                                    float fl, union num un, struct bits *bi, struct outer *ou,
                                    pair_t pr) {
  return bo + (int)u + uc + col + (int)fl + un.i + bi->a + ou->head + pr.a + tcount + gdecl;
}
int main(void) {
  struct bits b = {1, 2, 3, 4};
  struct outer o = {0};
  union num un = {1};
  pair_t pr = {1, 2};
  return kinds(true, 6, 3, GREEN, 1.5f, un, &b, &o, pr);
}
)";

class Kinds : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/dwarf_vars_test.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = new std::string(tmpl);
    std::ofstream(*dir_ + "/kinds.c") << kKindsSource;
    const std::pair<const char*, const char*> builds[] = {
        {"k0", "-O0"}, {"k4", "-O0 -gdwarf-4"}, {"k2", "-O2"}};
    for (const auto& [name, flags] : builds) {
      std::string cmd = "timeout 120 cc -g " + std::string(flags) + " -o " + *dir_ + "/" + name +
                        " " + *dir_ + "/kinds.c";
      if (std::system(cmd.c_str()) != 0) return;
    }
    k0_ = open_object(*dir_ + "/k0").release();
    k4_ = open_object(*dir_ + "/k4").release();
    k2_ = open_object(*dir_ + "/k2").release();
  }
  static void TearDownTestSuite() {
    delete k0_;
    delete k4_;
    delete k2_;
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    ASSERT_NE(k0_, nullptr) << "could not compile and open the test program";
    ASSERT_NE(k4_, nullptr);
    ASSERT_NE(k2_, nullptr);
  }
  static std::string* dir_;
  static Object* k0_;
  static Object* k4_;
  static Object* k2_;
};
std::string* Kinds::dir_ = nullptr;
Object* Kinds::k0_ = nullptr;
Object* Kinds::k4_ = nullptr;
Object* Kinds::k2_ = nullptr;

TEST_F(Kinds, TypesOfParameters) {
  // Signed types are sN, all others xN: bool, unsigned, enums, floats, unions, pointers.
  EXPECT_EQ(translate(function_place(*k0_, "kinds", At::kBody), "$params"),
            "bo=-4(%bp):x8 u=-8(%bp):x32 uc=-12(%bp):x8 col=-16(%bp):x32 fl=-20(%bp):x32 "
            "un=-24(%bp):x32 bi=-32(%bp):x64 ou=+16(%bp):x64 pr=+24(%bp):x64");
  // At -O2 fl is in %xmm0 (DWARF register 17): perf fails the whole $params with "Sorry, we
  // don't support this variable location yet."; it is left out here.
  EXPECT_EQ(translate(function_place(*k2_, "kinds", At::kEntry), "$params"),
            "bo=%di:x8 u=%si:x32 uc=%dx:x8 col=%cx:x32 un=%r8:x32 bi=%r9:x64 ou=+8(%sp):x64 "
            "pr=+16(%sp):x64");
  EXPECT_EQ(translate(function_place(*k2_, "kinds", At::kEntry), "fl"),
            "ERROR(-95) Sorry, we don't support this variable location yet.");
}

TEST_F(Kinds, AnonymousMembersUnionsAndArrays) {
  EXPECT_EQ(translate(function_place(*k0_, "kinds", At::kBody),
                      "ou->ax ou->ay ou->ux ou->uy ou->vp ou->fn ou->name ou->name:string pr.a "
                      "pr.b un.f"),
            "ax=+4(+16(%bp)):s32 ay=+8(+16(%bp)):s32 ux=+16(+16(%bp)):s32 "
            "uy=+16(+16(%bp)):s64 vp=+48(+16(%bp)):x64 fn=+56(+16(%bp)):x64 "
            "name=+64(+16(%bp)) name=+64(+16(%bp)):string a=+24(%bp):s32 b=+28(%bp):s16 "
            "f=-24(%bp):x32");
  // perf steps a two-dimensional array by its element: mat=+28(+16(%bp)):s32 for mat[1],
  // and "[1] is not a data structure nor a union." for mat[1][2].
  EXPECT_EQ(translate(function_place(*k0_, "kinds", At::kBody), "ou->mat[1] ou->mat[1][2]"),
            "mat=+36(+16(%bp)) mat=+44(+16(%bp)):s32");
  EXPECT_EQ(translate(function_place(*k0_, "kinds", At::kBody), "ou->vp[1]"),
            "ERROR(-2) Failed to get the type of vp.");
  // At -O2 pr is on the stack, un in %r8.
  EXPECT_EQ(translate(function_place(*k2_, "kinds", At::kEntry), "pr.a pr.b"),
            "a=+16(%sp):s32 b=+20(%sp):s16");
  EXPECT_EQ(translate(function_place(*k2_, "kinds", At::kEntry), "un.f"),
            "ERROR(-95) Structure on a register is not supported yet.");
}

TEST_F(Kinds, BitfieldsInDwarf4And5) {
  const std::string fields = "bi->a bi->b bi->c bi->d";
  const std::string want =
      "a=+0(-32(%bp)):b3@0/32 b=+0(-32(%bp)):b5@3/32 c=+1(-32(%bp)):b2@0/8 "
      "d=+0(-32(%bp)):b40@10/64";
  // perf on DWARF 4 takes DW_AT_bit_offset, counted from the high bit, as the kernel's
  // offset from the low bit: a=+0(-32(%bp)):b3@29/32 b=...:b5@24/32 c=+1(...):b2@6/8
  // d=...:b40@14/64. On DWARF 5: "Failed to get the offset of a.".
  EXPECT_EQ(translate(function_place(*k4_, "kinds", At::kBody), fields), want);
  EXPECT_EQ(translate(function_place(*k0_, "kinds", At::kBody), fields), want);
}

TEST_F(Kinds, ThreadLocalsAndDeclarations) {
  VarContext ctx = function_place(*k0_, "kinds", At::kBody);
  // perf writes tcount=@tcount+0:s32, an address that is not the variable's.
  EXPECT_EQ(translate(ctx, "tcount"),
            "ERROR(-95) Sorry, we don't support this variable location yet.");
  // gdecl is found as its declaration (external, no location): its symbol has the address.
  const ElfSymbol* gdecl = k0_->image->find_object("gdecl");
  ASSERT_NE(gdecl, nullptr);
  EXPECT_EQ(translate(ctx, "gdecl"), "gdecl=@+" + hex(gdecl->value) + ":s32");
  ctx.kprobe_syntax = true;
  EXPECT_EQ(translate(ctx, "gdecl"), "gdecl=@gdecl+0:s32");
}

TEST_F(Kinds, TypeNames) {
  // perf -V kinds, but for tcount (perf lists it; it cannot be fetched here).
  using V = std::vector<std::string>;
  EXPECT_EQ(available_variables(function_place(*k0_, "kinds", At::kEntry), true),
            (V{"_Bool\tbo", "enum color\tcol", "float\tfl", "int\tgdecl", "pair_t\tpr",
               "struct bits*\tbi", "struct outer*\tou", "union num\tun", "unsigned char\tuc",
               "unsigned int\tu"}));
  // Members, by perf's rules: arrays as pointers, qualifiers dropped, void unnamed.
  std::vector<std::pair<std::string, std::string>> want = {{"mat", "int*"},
                                                           {"vp", "(unknown_type)"},
                                                           {"fn", "(function_type)*"},
                                                           {"name", "char*"},
                                                           {"head", "int"}};
  for (const auto& [member, type] : want) {
    bool found = each_die(k0_->debug->dwarf(), [&](Dwarf_Die d, Dwarf_Die) {
      if (dwarf_tag(&d) != DW_TAG_member || !named(&d, member)) return false;
      Dwarf_Attribute attr;
      Dwarf_Die t;
      EXPECT_NE(dwarf_formref_die(dwarf_attr(&d, DW_AT_type, &attr), &t), nullptr);
      EXPECT_EQ(type_name(&t), type) << member;
      return true;
    });
    EXPECT_TRUE(found) << member;
  }
  EXPECT_EQ(type_name(nullptr), "(unknown_type)");
}

}  // namespace
}  // namespace probefs::tools
