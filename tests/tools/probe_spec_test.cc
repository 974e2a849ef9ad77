// The spec parser against perf probe 6.1: the expected points and arguments are the lines
// `perf probe -v` printed for the same specs ("symbol:... file:... line:..." and "parsing
// arg: ... into ..."), the expected errors the messages it printed; plus -L ranges, globs,
// names and the definitions written to the tracefs.
#include "tools/probe_spec.h"
#include "tools/sdt_notes.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>
#include <vector>

#include "tools/cxx_names.h"
#include "tools/trace_probe.h"

namespace probefs::tools {
namespace {

// A point in the words of perf -v's "symbol:%s file:%s line:%d offset:%lu return:%d lazy:%s".
std::string perf_point_line(const ProbePoint& pp) {
  auto or_null = [](const std::string& s) { return s.empty() ? std::string("(null)") : s; };
  return "symbol:" + or_null(pp.function) + " file:" + or_null(pp.file) +
         " line:" + std::to_string(pp.line) + " offset:" + std::to_string(pp.offset) +
         " return:" + (pp.retprobe ? "1" : "0") + " lazy:" + (pp.has_lazy ? pp.lazy : "(null)");
}

// An argument in the words of perf -v's "parsing arg: TEXT into ..." (an index as "[N]" in
// decimal, a member through '->' or an index "(1)", through '.' "(0)").
std::string perf_arg_line(const ProbeArg& arg) {
  std::string out;
  if (!arg.name.empty()) out += "name:" + arg.name + " ";
  if (arg.user_access) out += "user_access ";
  if (!arg.type.empty()) out += "type:" + arg.type + " ";
  out += arg.var;
  for (const ArgField& f : arg.fields) {
    bool index = f.kind == ArgField::Kind::kIndex;
    out += ", " + (index ? "[" + std::to_string(f.index) + "]" : f.name) +
           (f.kind == ArgField::Kind::kDot ? "(0)" : "(1)");
  }
  return out;
}

struct GoodPoint {
  const char* spec;
  const char* perf_line;
  const char* group = "";
  const char* event = "";
  uint64_t address = 0;  // with has_address
  bool has_address = false;
};

TEST(ProbeSpec, PointsAsPerfReadsThem) {
  const GoodPoint cases[] = {
      {"price_order", "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:(null)"},
      {"price_order:3", "symbol:price_order file:(null) line:3 offset:0 return:0 lazy:(null)"},
      {"price_order:0x3", "symbol:price_order file:(null) line:3 offset:0 return:0 lazy:(null)"},
      {"price_order:010", "symbol:price_order file:(null) line:8 offset:0 return:0 lazy:(null)"},
      {"price_order:-11", "symbol:price_order file:(null) line:-11 offset:0 return:0 lazy:(null)"},
      {"price_order:0", "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:(null)"},
      {"price_order:3:4", "symbol:price_order file:(null) line:4 offset:0 return:0 lazy:(null)"},
      {"price_order+16", "symbol:price_order file:(null) line:0 offset:16 return:0 lazy:(null)"},
      {"price_order+0x10", "symbol:price_order file:(null) line:0 offset:16 return:0 lazy:(null)"},
      {"price_order+4+8", "symbol:price_order file:(null) line:0 offset:8 return:0 lazy:(null)"},
      {"price_order%return", "symbol:price_order file:(null) line:0 offset:0 return:1 lazy:(null)"},
      {"price_order;subtotal*",
       "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:subtotal*"},
      {"price_order;a:b+c=d",
       "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:a:b+c=d"},
      {"price_order;", "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:"},
      {"price_order;foo%return",
       "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:foo%return"},
      {"price_order@probe_prog.c",
       "symbol:price_order file:probe_prog.c line:0 offset:0 return:0 lazy:(null)"},
      {"price_order@probe_prog.c:3",
       "symbol:price_order file:probe_prog.c line:3 offset:0 return:0 lazy:(null)"},
      {"price_order+4@probe_prog.c",
       "symbol:price_order file:probe_prog.c line:0 offset:4 return:0 lazy:(null)"},
      {"price_order%return@probe_prog.c",
       "symbol:price_order file:probe_prog.c line:0 offset:0 return:1 lazy:(null)"},
      {"price_order@probe_prog.c;sub*",
       "symbol:price_order file:probe_prog.c line:0 offset:0 return:0 lazy:sub*"},
      {"probe_prog.c:40", "symbol:(null) file:probe_prog.c line:40 offset:0 return:0 lazy:(null)"},
      {"probe_prog.c;subtotal*",
       "symbol:(null) file:probe_prog.c line:0 offset:0 return:0 lazy:subtotal*"},
      {"src/probe_prog.c:40",
       "symbol:(null) file:src/probe_prog.c line:40 offset:0 return:0 lazy:(null)"},
      // A '+' anywhere, or no '.' before the ':', makes the first part a function.
      {"probe_prog.c;a+b", "symbol:probe_prog.c file:(null) line:0 offset:0 return:0 lazy:a+b"},
      {"dir/prog:40", "symbol:dir/prog file:(null) line:40 offset:0 return:0 lazy:(null)"},
      {"prog.c@foo.c:3", "symbol:prog.c file:foo.c line:3 offset:0 return:0 lazy:(null)"},
      {"price_*", "symbol:price_* file:(null) line:0 offset:0 return:0 lazy:(null)"},
      {"price_order\\@GLIBC_2.2.5",
       "symbol:price_order@GLIBC_2.2.5 file:(null) line:0 offset:0 return:0 lazy:(null)"},
      {"foo\\:bar.c:4", "symbol:(null) file:foo:bar.c line:4 offset:0 return:0 lazy:(null)"},
      {"foo\\+bar.c:4", "symbol:(null) file:foo+bar.c line:4 offset:0 return:0 lazy:(null)"},
      {"ev=price_order", "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:(null)",
       "", "ev"},
      {"grp:ev=price_order:3",
       "symbol:price_order file:(null) line:3 offset:0 return:0 lazy:(null)", "grp", "ev"},
      {"_g1:_e2=probe_prog.c:40",
       "symbol:(null) file:probe_prog.c line:40 offset:0 return:0 lazy:(null)", "_g1", "_e2"},
      {"sdt_a=price_order", "symbol:price_order file:(null) line:0 offset:0 return:0 lazy:(null)",
       "", "sdt_a"},
      {"e=0x1139", "symbol:0x1139 file:(null) line:0 offset:0 return:0 lazy:(null)", "", "e",
       0x1139, true},
      {"0x1139%return", "symbol:0x1139 file:(null) line:0 offset:0 return:1 lazy:(null)", "", "",
       0x1139, true},
      {"0x10+4", "symbol:0x10 file:(null) line:0 offset:4 return:0 lazy:(null)", "", "", 0x10,
       true},
  };
  for (const GoodPoint& c : cases) {
    SCOPED_TRACE(c.spec);
    Result<ProbeSpec> spec = parse_probe_spec(c.spec);
    ASSERT_TRUE(spec.ok()) << spec.error().message;
    const ProbePoint& pp = spec->point;
    EXPECT_EQ(perf_point_line(pp), c.perf_line);
    EXPECT_EQ(spec->group, c.group);
    EXPECT_EQ(spec->event, c.event);
    EXPECT_EQ(pp.has_address, c.has_address);
    EXPECT_EQ(pp.address, c.address);
    EXPECT_EQ(pp.has_line, pp.line != 0);
    EXPECT_EQ(pp.has_offset, pp.offset != 0);
    EXPECT_EQ(spec->text, c.spec);
    EXPECT_TRUE(spec->args.empty());
  }
}

struct GoodArg {
  const char* arg;
  const char* perf_line;
  char kind;  // 'v' variable, 'r' raw, '$' $params / $vars
};

// SDT points: sdt_PROVIDER:NAME, %sdt_PROVIDER:NAME, and %NAME for any provider.
TEST(ProbeSpec, SdtNames) {
  struct Case {
    const char* spec;
    const char* provider;
    const char* name;
  } cases[] = {{"sdt_python:function__entry", "python", "function__entry"},
               {"%sdt_python:line", "python", "line"},
               {"%gc__start", "", "gc__start"},
               {"%return", "", "return"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Result<ProbeSpec> spec = parse_probe_spec(c.spec);
    ASSERT_TRUE(spec.ok()) << spec.error().message;
    EXPECT_TRUE(spec->point.sdt);
    EXPECT_EQ(spec->point.sdt_provider, c.provider);
    EXPECT_EQ(spec->point.sdt_name, c.name);
  }
}

// A note's argument spec as fetch arguments, as perf converts them.
TEST(SdtArguments, RegistersMemoryAndImmediates) {
  struct Case {
    const char* spec;
    const char* text;  // "" when refused
  } cases[] = {
      {"-4@%edx", "arg1=%dx:s32"},      {"8@%rbp", "arg1=%bp:u64"},
      {"8@%r12", "arg1=%r12:u64"},      {"-4@%eax", "arg1=%ax:s32"},
      {"1@%sil", "arg1=%si:u8"},        {"2@%r9w", "arg1=%r9:u16"},
      {"-4@%r10d", "arg1=%r10:s32"},    {"8@-16(%rbp)", "arg1=-16(%bp):u64"},
      {"4@8(%rsp)", "arg1=+8(%sp):u32"}, {"8@(%rdi)", "arg1=+0(%di):u64"},
      {"4@$5", "arg1=\\5:u32"},          {"-8@$-3", "arg1=\\-3:s64"},
      {"8@sym(%rip)", ""},              {"8@(%rax,%rbx,8)", ""},
      {"3@%eax", ""},                   {"8@%xmm0", ""},
      {"8", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    Result<TraceArg> a = sdt_argument(c.spec, 1);
    if (*c.text == 0) {
      EXPECT_FALSE(a.ok());
      continue;
    }
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(a->text(), c.text);
  }
  EXPECT_EQ(sdt_argument_specs(" 8@%rbp  8@%r12 -4@%eax"),
            (std::vector<std::string>{"8@%rbp", "8@%r12", "-4@%eax"}));
}

TEST(ProbeSpec, ArgumentsAsPerfReadsThem) {
  const GoodArg cases[] = {
      {"discount", "discount", 'v'},
      {"o->qty[2]", "o, qty(1), [2](1)", 'v'},
      {"o->bill->postcode", "o, bill(1), postcode(1)", 'v'},
      {"x=o->ship.zone", "name:x o, ship(1), zone(0)", 'v'},
      {"o->item:string", "type:string o, item(1)", 'v'},
      {"discount:x32", "type:x32 discount", 'v'},
      {"_x.y", "_x, y(0)", 'v'},
      {"o->a[1][2]", "o, a(1), [1](1), [2](1)", 'v'},
      {"o[-1]", "o, [-1](1)", 'v'},
      {"o[0x2]", "o, [2](1)", 'v'},
      {"o[1].x", "o, [1](1), x(0)", 'v'},
      {"o.", "o, (0)", 'v'},  // perf leaves the empty member to the DWARF lookup
      {"o@user", "user_access o", 'v'},
      {"o->x@user:u8", "type:u8 o, x@user(1)", 'v'},  // perf sees @user only at the end
      {"a=b=c", "name:a b=c", 'v'},
      {"x:a:b", "type:a:b x", 'v'},
      {"%di", "%di", 'r'},
      {"%di:u64", "type:u64 %di", 'r'},
      {"+8(%sp):s32", "type:s32 +8(%sp)", 'r'},
      {"-8(%bp)", "-8(%bp)", 'r'},
      {"@orders_seen:s64", "type:s64 @orders_seen", 'r'},
      {"$stack2", "$stack2", 'r'},
      {"$comm", "$comm", 'r'},
      {"$arg1", "$arg1", 'r'},
      {"$retval", "$retval", 'r'},
      {"\"abc\"", "\"abc\"", 'r'},
      {"\\123", "\\123", 'r'},
      {"1abc", "1abc", 'r'},
      {"$params", "$params", '$'},
      {"$vars", "$vars", '$'},
  };
  for (const GoodArg& c : cases) {
    SCOPED_TRACE(c.arg);
    Result<ProbeSpec> spec = parse_probe_spec(std::string("price_order ") + c.arg);
    ASSERT_TRUE(spec.ok()) << spec.error().message;
    ASSERT_EQ(spec->args.size(), 1u);
    const ProbeArg& arg = spec->args[0];
    EXPECT_EQ(perf_arg_line(arg), c.perf_line);
    EXPECT_EQ(arg.text, c.arg);
    EXPECT_EQ(arg.is_variable(), c.kind == 'v');
    EXPECT_EQ(arg.is_raw(), c.kind == 'r');
    if (!arg.is_variable()) {
      EXPECT_TRUE(arg.fields.empty());
    }
  }
}

// C++ names (beyond perf): "::" is part of the name, a parameter list keeps its blanks and
// qualifiers, an operator keeps its symbols; what follows the name is read as perf reads it.
TEST(ProbeSpec, CxxNamesAreOneFunction) {
  auto spec = parse_probe_spec("shop::Pricer::price(shop::Order const&, int) const this->tax_ o.item:string");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->point.function, "shop::Pricer::price(shop::Order const&, int) const");
  ASSERT_EQ(spec->args.size(), 2u);
  EXPECT_EQ(spec->args[0].var, "this");
  EXPECT_EQ(spec->args[1].type, "string");

  spec = parse_probe_spec("g:ev=shop::twice<int>%return $retval");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->group, "g");
  EXPECT_EQ(spec->event, "ev");
  EXPECT_EQ(spec->point.function, "shop::twice<int>");
  EXPECT_TRUE(spec->point.retprobe);

  spec = parse_probe_spec("shop::Pricer::operator< other");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->point.function, "shop::Pricer::operator<");
  ASSERT_EQ(spec->args.size(), 1u);

  spec = parse_probe_spec("ns::f:3 x");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->point.function, "ns::f");
  EXPECT_EQ(spec->point.line, 3);

  spec = parse_probe_spec("std::vector<int, std::allocator<int> >::size+4");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->point.function, "std::vector<int, std::allocator<int> >::size");
  EXPECT_EQ(spec->point.offset, 4u);

  spec = parse_probe_spec("main::{lambda(shop::Order const&, int)#1}::operator() o.qty");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->point.function, "main::{lambda(shop::Order const&, int)#1}::operator()");

  spec = parse_probe_spec("_ZNK4shop6Pricer5priceERKNS_5OrderEi discount");
  ASSERT_TRUE(spec) << spec.error().message;
  EXPECT_EQ(spec->point.function, "_ZNK4shop6Pricer5priceERKNS_5OrderEi");
}

TEST(ProbeSpec, CxxLineRanges) {
  auto r = parse_line_range("shop::Pricer::price(shop::Order const&, int) const:1-2");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->function, "shop::Pricer::price(shop::Order const&, int) const");
  EXPECT_EQ(r->start, 1);
  EXPECT_EQ(r->end, 2);
  r = parse_line_range("shop::twice<int>@probe_shop.cc");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->function, "shop::twice<int>");
  EXPECT_EQ(r->file, "probe_shop.cc");
  r = parse_line_range("price_order:2");  // C as before
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->function, "price_order");
  EXPECT_EQ(r->start, 2);
}

TEST(CxxNames, MatchingAndEventNames) {
  const char* const price2 = "_ZNK4shop6Pricer5priceERKNS_5OrderEi";
  const char* const price1 = "_ZNK4shop6Pricer5priceERKNS_5OrderE";
  EXPECT_TRUE(cxx_name_matches("shop::Pricer::price", price2, "price"));
  EXPECT_TRUE(cxx_name_matches("shop::*::price", price1, "price"));
  EXPECT_TRUE(cxx_name_matches("shop::Pricer::price(shop::Order const&,int)const", price2, "price"));
  EXPECT_FALSE(cxx_name_matches("shop::Pricer::price(shop::Order const&, int) const", price1, "price"));
  EXPECT_TRUE(cxx_name_matches(price1, price1, "price"));
  EXPECT_FALSE(cxx_name_matches("shop::Other::price", price2, "price"));
  EXPECT_TRUE(is_overload(price1, "price", price2, "price"));
  // A constructor's variants are one function.
  EXPECT_FALSE(is_overload("_ZN4shop6PricerC1Ed", "Pricer", "_ZN4shop6PricerC2Ed", "Pricer"));
  EXPECT_EQ(cxx_event_name(price2, "price", false), "shop_Pricer_price");
  EXPECT_EQ(cxx_event_name(price2, "price", true), "shop_Pricer_price__shop_Order_const_int_const");
  EXPECT_EQ(cxx_event_name("_ZNK4shop6PricerltERKS0_", "operator<", false), "shop_Pricer_operator_lt");
  EXPECT_EQ(cxx_event_name("_ZN4shop6PricerD2Ev", "~Pricer", false), "shop_Pricer_dtor_Pricer");
  EXPECT_EQ(cxx_event_name("", "plain_c", false), "plain_c");
  // Past 63 characters: the head and a hash of the mangled name, still a tracefs name.
  const std::string long_name = cxx_event_name(
      "_ZNSt6vectorIN4shop5OrderESaIS1_EE17_M_realloc_insertIJS1_EEEvN9__gnu_cxx17__normal_"
      "iteratorIPS1_S3_EEDpOT_", "", true);
  EXPECT_LE(long_name.size(), 63u);
  EXPECT_EQ(long_name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"),
            std::string::npos) << long_name;
  EXPECT_FALSE(is_cxx_name("price_order"));
  EXPECT_FALSE(is_cxx_name("my_operator_x"));
  EXPECT_TRUE(is_cxx_name("operator new"));
}

TEST(ProbeSpec, WordsAreSplitOnWhiteSpaceOnly) {
  Result<ProbeSpec> spec = parse_probe_spec("  price_order+4 \t$retval  x=%ax\n\"a b\" ");
  ASSERT_TRUE(spec.ok()) << spec.error().message;
  EXPECT_EQ(spec->point.offset, 4u);
  std::vector<std::string> texts;
  for (const ProbeArg& a : spec->args) texts.push_back(a.text);
  // perf does not honour quotes either: "a b" is two arguments.
  EXPECT_EQ(texts, (std::vector<std::string>{"$retval", "x=%ax", "\"a", "b\""}));
  EXPECT_EQ(spec->args[1].name, "x");
  EXPECT_EQ(spec->args[1].var, "%ax");

  std::string many = "price_order";
  for (int i = 0; i < 128; ++i) many += " a" + std::to_string(i);
  EXPECT_TRUE(parse_probe_spec(many).ok());
}

struct BadSpec {
  const char* spec;
  const char* message;
  int code = -EINVAL;
};

TEST(ProbeSpec, BadSpecsGetPerfsMessages) {
  const BadSpec cases[] = {
      {"price_order%return;foo",
       "Semantic error :Offset/Line/Lazy pattern can't be used with return probe."},
      {"price_order:3%return",
       "Semantic error :Offset/Line/Lazy pattern can't be used with return probe."},
      {"price_order%return:3",
       "Semantic error :Offset/Line/Lazy pattern can't be used with return probe."},
      {"probe_prog.c:40%return",
       "Semantic error :Offset/Line/Lazy pattern can't be used with return probe."},
      {"price_order+4:3", "Semantic error :Offset can't be used with line number."},
      {"probe_prog.c:3+4", "Semantic error :Offset can't be used with line number."},
      {"price_order:3;x", "Semantic error :Lazy pattern can't be used with line number."},
      {"price_order+4;x", "Semantic error :Lazy pattern can't be used with offset."},
      {"price_order:3a", "Semantic error :There is non-digit char in line number."},
      {"e=sdt_foo:bar", "Semantic error :There is non-digit char in line number."},
      {"price_order+4a", "Semantic error :There is non-digit character in offset."},
      {"price_order%foo", "Semantic error :%foo is not supported.", -EOPNOTSUPP},
      {"price_order@x.c@y.c", "Semantic error :SRC@SRC is not allowed."},
      {"probe_prog.c:0", "Semantic error :File always requires line number or lazy pattern."},
      {"@", "Semantic error :File always requires line number or lazy pattern."},
      {"+4", "Semantic error :Offset requires an entry function."},
      {"0x12zz", "Semantic error :Invalid absolute address."},
      {"0x", "Semantic error :Invalid absolute address."},
      {"1bad=price_order",
       "Semantic error :1bad is bad for event name -it must follow C symbol-naming rule."},
      {"g-x:ev=price_order",
       "Semantic error :g-x is bad for event name -it must follow C symbol-naming rule."},
      {"grp:1ev=price_order",
       "Semantic error :1ev is bad for event name -it must follow C symbol-naming rule."},
      {"grp:=price_order",
       "Semantic error : is bad for event name -it must follow C symbol-naming rule."},
      {"a:b:c=price_order",
       "Semantic error :b:c is bad for event name -it must follow C symbol-naming rule."},
      {"grp\\:x:ev=price_order",
       "Semantic error :grp\\:x is bad for event name -it must follow C symbol-naming rule."},
      {"probe_prog.c:40=x",
       "Semantic error :probe_prog.c is bad for event name -it must follow C symbol-naming "
       "rule."},
      {"sdt_a:b;c", "Semantic error :sdt_a:b;c must be an SDT name."},
      {"%a+3", "Semantic error :a+3 must be an SDT name."},
      {"price_order o[x]", "Semantic error :Array index must be a number."},
      {"price_order o[]", "Semantic error :Array index must be a number."},
      {"price_order o[1", "Semantic error :Array index must be a number."},
      {"price_order o-x", "Semantic error :Argument parse error: o-x"},
      {"price_order o->a-b", "Semantic error :Argument parse error: a-b"},
      {"price_order o[1]x", "Semantic error :Argument parse error: [1]x"},
      {"price_order%return o->id",
       "Semantic error :You can't specify local variable for kretprobe."},
      // Where perf takes the spec and fails only later (or crashes), with messages of ours.
      {"", "No probe point is given."},
      {":3", "No function or source file is given: :3"},
      {"ev=%return", "No function or source file is given: ev=%return"},
      {";foo", "No function or source file is given: ;foo"},
      {"%sdt_foo:bar@1234", "Cached probes are not supported: %sdt_foo:bar@1234", -EOPNOTSUPP},
      {"%foo:bar", "Semantic error :foo:bar must be an SDT name."},
      {"price_order =x", "Semantic error :Argument parse error: =x"},
      {"price_order n=", "Semantic error :Argument parse error: n="},
      {"price_order discount:", "Semantic error :Argument parse error: discount:"},
  };
  for (const BadSpec& c : cases) {
    SCOPED_TRACE(c.spec);
    Result<ProbeSpec> spec = parse_probe_spec(c.spec);
    ASSERT_FALSE(spec.ok());
    EXPECT_EQ(spec.error().message, c.message);
    EXPECT_EQ(spec.error().code, c.code);
  }
}

TEST(ProbeSpec, TooManyArgumentsAndTooLongNames) {
  std::string many = "price_order";
  for (int i = 0; i < 129; ++i) many += " a" + std::to_string(i);
  Result<ProbeSpec> spec = parse_probe_spec(many);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.error().message, "Semantic error :Too many probe arguments (129).");
  EXPECT_EQ(spec.error().code, -ERANGE);

  // The kernel takes names of up to 63 characters; perf (and we) refuse longer with -E2BIG.
  std::string e63(63, 'e');
  EXPECT_TRUE(parse_probe_spec(e63 + "=price_order").ok());
  EXPECT_TRUE(parse_probe_spec(e63 + ":ev=price_order").ok());
  for (std::string too_long : {e63 + "e=price_order", e63 + "e:ev=price_order"}) {
    spec = parse_probe_spec(too_long);
    ASSERT_FALSE(spec.ok()) << too_long;
    EXPECT_EQ(spec.error().code, -E2BIG);
    bool group = too_long.find(':') != std::string::npos;
    EXPECT_EQ(spec.error().message,
              std::string("Too long ") + (group ? "group" : "event") + " name (" + e63 + "e)");
  }
}

struct GoodRange {
  const char* text;
  const char* function;
  const char* file;
  long start;
  long end;
  bool has_end;
};

TEST(LineRange, RangesAsPerfReadsThem) {
  const GoodRange cases[] = {
      {"price_order", "price_order", "", 0, 0, false},
      {"price_order:3", "price_order", "", 3, 0, false},
      {"price_order:3+2", "price_order", "", 3, 4, true},
      {"price_order:3+1", "price_order", "", 3, 3, true},
      {"price_order:3-5", "price_order", "", 3, 5, true},
      {"price_order:3-3", "price_order", "", 3, 3, true},
      {"price_order:-3", "price_order", "", -3, 0, false},
      {"price_order:0x3", "price_order", "", 3, 0, false},
      {"price_order@probe_prog.c:3", "price_order", "probe_prog.c", 3, 0, false},
      {"probe_prog.c:30-32", "", "probe_prog.c", 30, 32, true},
      {"probe_prog.c:30+3", "", "probe_prog.c", 30, 32, true},
      {"probe_prog.c", "", "probe_prog.c", 0, 0, false},
      {"a/b:3", "", "a/b", 3, 0, false},
  };
  for (const GoodRange& c : cases) {
    SCOPED_TRACE(c.text);
    Result<LineRange> r = parse_line_range(c.text);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->function, c.function);
    EXPECT_EQ(r->file, c.file);
    EXPECT_EQ(r->start, c.start);
    EXPECT_EQ(r->end, c.end);
    EXPECT_EQ(r->has_end, c.has_end);
  }
}

TEST(LineRange, BadRangesGetPerfsMessages) {
  const std::pair<const char*, const char*> cases[] = {
      {"price_order:5-3", "Semantic error :Start line must be smaller than end line."},
      {"price_order:3+0", "Semantic error :Start line must be smaller than end line."},
      {"price_order:3+-2", "Semantic error :Start line must be smaller than end line."},
      {"price_order:x", "Semantic error :'start line' is not a valid number."},
      {"price_order:", "Semantic error :'start line' is not a valid number."},
      {"price_order:3-", "Semantic error :'end line' is not a valid number."},
      {"price_order:3+", "Semantic error :'end line' is not a valid number."},
      {"price_order:3x", "Semantic error :Tailing with invalid str 'x'."},
      {"price_order:3-5x", "Semantic error :Tailing with invalid str 'x'."},
      {"price_order:3:4", "Semantic error :Tailing with invalid str ':4'."},
      {"1bad", "Semantic error :'1bad' is not a valid function name."},
      {"bad-name:3", "Semantic error :'bad-name' is not a valid function name."},
      {"price_order\\:3", "Semantic error :'price_order\\' is not a valid function name."},
      {"", "Semantic error :'' is not a valid function name."},
      // perf takes these and fails while reading DWARF.
      {"@probe_prog.c", "Semantic error :'' is not a valid function name."},
      {"probe_prog.c@x", "Semantic error :'probe_prog.c' is not a valid function name."},
  };
  for (const auto& [text, message] : cases) {
    SCOPED_TRACE(text);
    Result<LineRange> r = parse_line_range(text);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, message);
    EXPECT_EQ(r.error().code, -EINVAL);
  }
}

TEST(Glob, MatchesAsPerfDoes) {
  struct Case {
    const char* pattern;
    const char* name;
    bool match;
  };
  const Case cases[] = {
      {"price_order", "price_order", true}, {"price_order", "price_orders", false},
      {"price_*", "price_order", true},     {"*", "", true},
      {"*order", "price_order", true},      {"*_*_*", "a_b_c", true},
      {"*_*_*", "a_bc", false},             {"p*e*r", "price_order", true},
      {"p*e*x", "price_order", false},      {"?cale", "scale", true},
      {"?", "", false},                     {"s??le", "scale", true},
      {"[sp]cale", "scale", true},          {"[a-c]lamp", "clamp", true},
      {"[d-z]lamp", "clamp", false},        {"[!a-c]lamp", "clamp", false},
      {"[!x]cale", "scale", true},          {"[]]x", "]x", true},
      {"[a-]", "-", true},                  {"[a-c-e]", "d", true},
      {"[abc", "a", false},                 {"[z-a]", "b", false},
      {"[z-a]x", "zx", true},  // its first member matches before the bad range is seen
      {"\\*", "*", true},                   {"\\*", "a", false},
      {"a\\?", "a?", true},                 {"a\\", "a", false},
      {"*\\[*", "x[1]", true},              {"", "", true},
      {"", "a", false},                     {"**a", "ba", true},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(glob_match(c.pattern, c.name), c.match) << c.pattern << " vs " << c.name;
  }
}

TEST(Names, SanitizeEventName) {
  const std::pair<const char*, const char*> cases[] = {
      {"probe_prog", "probe_prog"}, {"probe-prog.so.6", "probe_prog_so_6"},
      {"msg:string", "msg_string"}, {"9prog", "_9prog"},
      {"a b", "a_b"},               {"", ""},
  };
  for (const auto& [in, out] : cases) EXPECT_EQ(sanitize_event_name(in), out) << in;
}

TEST(TraceProbe, ArgumentText) {
  EXPECT_EQ((TraceArg{"id", "-20(%bp)", "s32"}.text()), "id=-20(%bp):s32");
  EXPECT_EQ((TraceArg{"", "$retval", ""}.text()), "$retval");
  EXPECT_EQ((TraceArg{"", "%di", "u64"}.text()), "%di:u64");
  EXPECT_EQ((TraceArg{"o", "-56(%bp)", ""}.text()), "o=-56(%bp)");
}

TEST(TraceProbe, DefinitionsAsPerfWritesThem) {
  TraceProbe p;
  p.group = "probe_probe_prog_O0";
  p.event = "price_order";
  p.path = "/opt/bin/probe_prog_O0";
  p.file_offset = 0x11e7;
  p.symbol = "price_order";
  p.args = {{"qty", "+28(-56(%bp))", "s32"}, {"", "$comm", ""}};
  // perf's own line for "price_order o->qty[1]" (less the second argument).
  EXPECT_EQ(p.definition(false),
            "p:probe_probe_prog_O0/price_order /opt/bin/probe_prog_O0:0x11e7 "
            "qty=+28(-56(%bp)):s32 $comm");
  EXPECT_EQ(p.definition(true),
            "p:probe_probe_prog_O0/price_order probe_prog_O0:price_order qty=+28(-56(%bp)):s32 "
            "$comm");
  p.symbol_offset = 20;
  p.args.clear();
  EXPECT_EQ(p.definition(true), "p:probe_probe_prog_O0/price_order probe_prog_O0:price_order+20");

  TraceProbe r;
  r.group = "probe_probe_prog_O0";
  r.event = "price_order__return";
  r.retprobe = true;
  r.path = "/opt/bin/probe_prog_O0";
  r.file_offset = 0x11d3;
  r.symbol = "price_order";
  EXPECT_EQ(r.definition(false),
            "r:probe_probe_prog_O0/price_order__return /opt/bin/probe_prog_O0:0x11d3");
  EXPECT_EQ(r.definition(true),
            "r:probe_probe_prog_O0/price_order__return probe_prog_O0:price_order");
  r.file_offset = 0;
  EXPECT_EQ(r.definition(false),
            "r:probe_probe_prog_O0/price_order__return /opt/bin/probe_prog_O0:0x0");
}

}  // namespace
}  // namespace probefs::tools
