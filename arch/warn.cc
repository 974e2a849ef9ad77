// PROBEFS_WARN_ON_ONCE's counters and list (arch/warn.h). Runs wherever the macro does,
// the hit path included: atomics and raw system calls only.
#include "arch/warn.h"

#include "arch/syscall.h"

namespace probefs::arch {
namespace {

// Distinct call sites that have warned. A site past the table is still counted and
// printed, only not listed (there are far fewer call sites than this).
constexpr uint32_t kMaxListed = 128;
WarnSite* g_listed[kMaxListed];
uint32_t g_nlisted = 0;  // atomic: slots claimed

// No strlen: nothing here may call libc. (The empty asm keeps the compiler from turning
// the loop into a call to strlen.)
size_t length(const char* s) {
  size_t n = 0;
  while (s[n]) {
    ++n;
    asm("" : "+r"(n));
  }
  return n;
}

// "probefs: warning: TEXT (FILE:LINE)\n" on stderr, in one writev.
void print(const WarnSite* site) {
  const char* file = site->file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') file = p + 1;
  char line[12];
  size_t at = sizeof line;
  line[--at] = ')';
  for (unsigned v = site->line > 0 ? static_cast<unsigned>(site->line) : 0;;) {
    line[--at] = static_cast<char>('0' + v % 10);
    v /= 10;
    if (v == 0) break;
  }
  static const char kHead[] = "probefs: warning: ";
  struct IoVec {  // struct iovec
    const void* base;
    size_t len;
  } iov[] = {
      {kHead, sizeof kHead - 1}, {site->text, length(site->text)}, {" (", 2},
      {file, length(file)},      {":", 1},                         {line + at, sizeof line - at},
      {"\n", 1},
  };
  raw_syscall(__NR_writev, 2, reinterpret_cast<long>(iov), sizeof iov / sizeof iov[0]);
}

}  // namespace

void warn(WarnSite* site) {
  if (__atomic_fetch_add(&site->count, 1, __ATOMIC_RELAXED) != 0) return;
  const uint32_t slot = __atomic_fetch_add(&g_nlisted, 1, __ATOMIC_RELAXED);
  if (slot < kMaxListed) __atomic_store_n(&g_listed[slot], site, __ATOMIC_RELEASE);
  print(site);
}

size_t warnings(Warning* out, size_t max) {
  uint32_t n = __atomic_load_n(&g_nlisted, __ATOMIC_ACQUIRE);
  if (n > kMaxListed) n = kMaxListed;
  size_t listed = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const WarnSite* s = __atomic_load_n(&g_listed[i], __ATOMIC_ACQUIRE);
    if (!s) continue;  // being listed right now
    if (listed < max)
      out[listed] = {s->text, s->file, s->line, __atomic_load_n(&s->count, __ATOMIC_RELAXED)};
    ++listed;
  }
  return listed;
}

}  // namespace probefs::arch
