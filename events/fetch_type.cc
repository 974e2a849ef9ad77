// The kernel's fetch types, as user-visible facts: names, the type the format file
// declares, the print conversion, the size in the record and signedness.
#include <cstring>
#include <string_view>

#include "events/definition.h"

namespace probefs::events {
namespace {

constexpr FetchType kTypes[] = {
    {"u8", "u8", "%u", 1, false, false, PrintKind::kUnsigned},
    {"u16", "u16", "%u", 2, false, false, PrintKind::kUnsigned},
    {"u32", "u32", "%u", 4, false, false, PrintKind::kUnsigned},
    {"u64", "u64", "%Lu", 8, false, false, PrintKind::kUnsigned},
    {"s8", "s8", "%d", 1, true, false, PrintKind::kSigned},
    {"s16", "s16", "%d", 2, true, false, PrintKind::kSigned},
    {"s32", "s32", "%d", 4, true, false, PrintKind::kSigned},
    {"s64", "s64", "%Ld", 8, true, false, PrintKind::kSigned},
    {"x8", "u8", "0x%x", 1, false, false, PrintKind::kHex},
    {"x16", "u16", "0x%x", 2, false, false, PrintKind::kHex},
    {"x32", "u32", "0x%x", 4, false, false, PrintKind::kHex},
    {"x64", "u64", "0x%Lx", 8, false, false, PrintKind::kHex},
    {"char", "u8", "'%c'", 1, false, false, PrintKind::kChar},
    {"string", "__data_loc char[]", "\\\"%s\\\"", 4, true, true, PrintKind::kString},
    {"ustring", "__data_loc char[]", "\\\"%s\\\"", 4, true, true, PrintKind::kString},
    {"symbol", "u64", "%pS", 8, false, false, PrintKind::kSymbol},
    {"symstr", "__data_loc char[]", "\\\"%s\\\"", 4, true, true, PrintKind::kString},
};

const FetchType* by_name(std::string_view name) {
  for (const FetchType& t : kTypes)
    if (name == t.name) return &t;
  return nullptr;
}

}  // namespace

const FetchType* default_fetch_type() { return by_name("x64"); }

const FetchType* find_fetch_type(const char* name, ProbeSyntax syntax) {
  if (!name) return default_fetch_type();
  std::string_view n(name);
  if (syntax == ProbeSyntax::kUprobe && (n == "symbol" || n == "symstr")) return nullptr;
  if (!n.empty() && n[0] == 'b') {
    // b<width>@<offset>/<container>: only the container decides the type here; the
    // width and offset are checked when the bitfield stage is built.
    size_t slash = n.find('/');
    if (slash == std::string_view::npos) return nullptr;
    std::string_view bs = n.substr(slash + 1);
    if (bs == "8") return by_name("u8");
    if (bs == "16") return by_name("u16");
    if (bs == "32") return by_name("u32");
    if (bs == "64") return by_name("u64");
    return nullptr;
  }
  return by_name(n);
}

}  // namespace probefs::events
