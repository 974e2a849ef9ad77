// Property: a definition read back and parsed again is the same definition — the same
// read-back text, format file and fetch program — over many generated definitions.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "events/compile.h"
#include "events/parse.h"

namespace probefs::events {
namespace {

struct Gen {
  std::mt19937_64 rng;
  explicit Gen(uint64_t seed) : rng(seed) {}
  size_t pick(size_t n) { return static_cast<size_t>(rng() % n); }
  template <class T>
  const T& one(const std::vector<T>& v) {
    return v[pick(v.size())];
  }

  std::string number() {
    uint64_t v = rng() % 0x10000;
    switch (pick(3)) {
      case 0: return std::to_string(v);
      case 1: {
        char b[32];
        snprintf(b, sizeof b, "0x%lx", static_cast<unsigned long>(v));
        return b;
      }
      default: return "0";
    }
  }

  std::string fetch(bool kprobe, bool ret, bool entry, int depth) {
    std::vector<std::string> loads = {"%di", "%si", "%dx", "%cx", "%ax", "%r8", "%r15", "%sp",
                                      "%ip", "%flags", "$stack",
                                      "$stack" + std::to_string(pick(8)), "@" + number(),
                                      "\\" + number(), "\\-" + std::to_string(pick(100))};
    if (ret) loads.push_back("$retval");
    if (kprobe && (ret || entry)) loads.push_back("$arg" + std::to_string(1 + pick(8)));
    if (kprobe) loads.push_back("@g_sym+" + std::to_string(pick(64)));
    if (!kprobe) loads.push_back("@+" + number());
    std::string f = one(loads);
    for (int d = 0; d < depth; ++d) {
      const char* sign = pick(2) ? "+" : "-";
      const char* u = pick(4) == 0 ? "u" : "";
      f = std::string(sign) + u + std::to_string(pick(64)) + "(" + f + ")";
    }
    return f;
  }

  std::string arg(bool kprobe, bool ret, bool entry, int i) {
    int depth = static_cast<int>(pick(3));
    std::string f = fetch(kprobe, ret, entry, depth);
    static const std::vector<std::string> types = {"u8", "u16", "u32", "u64", "s8", "s16", "s32",
                                                   "s64", "x8", "x16", "x32", "x64", "char"};
    std::string t;
    switch (pick(6)) {
      case 0: break;  // default type
      case 1: t = ":" + one(types); break;
      case 2: if (depth) t = ":string"; break;
      case 3: if (depth) t = ":" + one(types) + "[" + std::to_string(1 + pick(8)) + "]"; break;
      case 4: t = ":b" + std::to_string(1 + pick(4)) + "@" + std::to_string(pick(4)) + "/32"; break;
      default: if (kprobe) t = ":symbol"; break;
    }
    if (pick(5) == 0) return "$comm";  // unnamed: read back as argN
    return "v" + std::to_string(i) + "=" + f + t;
  }

  std::string definition() {
    bool kprobe = pick(2);
    bool ret = pick(3) == 0;
    std::string head = ret ? "r" : "p";
    if (kprobe && ret && pick(3) == 0) head += std::to_string(1 + pick(100));
    if (pick(4)) head += ":" + std::string(pick(2) ? "grp" + std::to_string(pick(9)) + "/" : "") +
                         "ev" + std::to_string(pick(1000));
    std::string place;
    bool entry = false;
    if (kprobe) {
      static const std::vector<std::string> syms = {"main", "libc:malloc", "libc.so.6:free",
                                                    "ld-linux-x86-64.so.2:_dl_start"};
      place = one(syms);
      if (!ret && pick(2)) place.append("+").append(std::to_string(pick(100)));
      else entry = !ret;
      if (pick(5) == 0) place = "0x" + std::to_string(400000 + pick(1000));
    } else {
      place = "/usr/bin/prog:" + number();
      if (pick(4) == 0) place += "%return";
      if (pick(4) == 0) place += "(" + number() + ")";
    }
    std::string line = head + " " + place;
    int n = static_cast<int>(pick(6));
    bool is_ret = ret || place.find("%return") != std::string::npos;
    bool at_entry = entry && place.find('+') == std::string::npos && place.rfind("0x", 0) != 0;
    for (int i = 0; i < n; ++i) line.append(" ").append(arg(kprobe, is_ret, at_entry, i));
    return line;
  }
};

bool resolve(std::string_view, uint64_t* a) {
  *a = 0x5000;
  return true;
}

TEST(Property, ReadBackReparses) {
  Gen g(20261129);
  int defined = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string line = g.definition();
    ParseResult r = parse_dynamic_command(line);
    if (r.status != ParseStatus::kDefine) continue;  // generated text can be invalid
    ++defined;
    std::string text = read_back(r.def);
    ParseResult again = parse_dynamic_command(text);
    ASSERT_EQ(again.status, ParseStatus::kDefine) << line << "\n -> " << text;
    EXPECT_EQ(read_back(again.def), text) << line;
    CompiledEvent a, b;
    Diagnostic err;
    ASSERT_TRUE(compile(r.def, resolve, &a, &err)) << line;
    ASSERT_TRUE(compile(again.def, resolve, &b, &err)) << text;
    EXPECT_EQ(format_file(a, 7), format_file(b, 7)) << line;
    ASSERT_EQ(a.program.insns.size(), b.program.insns.size()) << line;
    for (size_t i = 0; i < a.program.insns.size(); ++i) {
      EXPECT_EQ(a.program.insns[i].op, b.program.insns[i].op);
      EXPECT_EQ(a.program.insns[i].offset, b.program.insns[i].offset);
      EXPECT_EQ(a.program.insns[i].imm, b.program.insns[i].imm);
      EXPECT_EQ(a.program.insns[i].param, b.program.insns[i].param);
    }
  }
  // The generator must mostly produce valid definitions for the property to mean much.
  EXPECT_GT(defined, 2000);
}

}  // namespace
}  // namespace probefs::events
