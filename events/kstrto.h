// The kernel's kstrto*() number rules, shared by the definition and filter parsers. They
// are user-visible: "0X1370", "0x01370" and "4976" are one number, a leading "0" means
// octal, a leading '+' and one trailing newline are tolerated, nothing else is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

namespace probefs::events {

inline int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'z') return c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return 99;
}

inline bool is_xdigit(char c) { return digit_value(c) < 16; }

// Base 0: "0x" + hex digit -> 16, leading "0" -> 8, else 10. Returns the digits' start.
inline size_t fixup_radix(std::string_view s, unsigned* base) {
  if (*base == 0) {
    if (s.size() >= 1 && s[0] == '0') {
      if (s.size() >= 3 && (s[1] | 0x20) == 'x' && is_xdigit(s[2])) {
        *base = 16;
        return 2;
      }
      *base = 8;
      return 0;
    }
    *base = 10;
    return 0;
  }
  if (*base == 16 && s.size() >= 2 && s[0] == '0' && (s[1] | 0x20) == 'x') return 2;
  return 0;
}

inline bool kstrtoull(std::string_view s, unsigned base, uint64_t* out) {
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  size_t i = fixup_radix(s, &base);
  uint64_t v = 0;
  size_t start = i;
  for (; i < s.size(); ++i) {
    int d = digit_value(s[i]);
    if (d >= static_cast<int>(base)) break;
    if (v > (std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(d)) / base)
      return false;  // ERANGE
    v = v * base + static_cast<uint64_t>(d);
  }
  if (i == start) return false;
  if (i < s.size() && s[i] == '\n') ++i;
  if (i != s.size()) return false;
  *out = v;
  return true;
}

inline bool kstrtoll(std::string_view s, unsigned base, int64_t* out) {
  uint64_t v;
  if (!s.empty() && s[0] == '-') {
    if (!kstrtoull(s.substr(1), base, &v)) return false;
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) + 1) return false;
    *out = static_cast<int64_t>(0 - v);
    return true;
  }
  if (!kstrtoull(s, base, &v)) return false;
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

}  // namespace probefs::events
