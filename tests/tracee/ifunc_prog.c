/* A program for the IFUNC tests (ifunc_test.cc): it calls libc's memcpy, strlen, strcmp
 * and memset through wrappers that count, in a window where nothing else of the program
 * calls them, and says where its dynamic linker put IFUNC implementations. Driven line by
 * line over stdin; it prints "ready" first.
 *
 *   window N      N rounds of: memcpy once, strlen twice, strcmp three times, memset four
 *                 times, each through its wrapper: "ok MEMCPY STRLEN STRCMP MEMSET" (the
 *                 wrappers' counts of this window)
 *   addr NAME     "ok 0xADDR": dlsym(RTLD_DEFAULT, NAME), which for an IFUNC runs its
 *                 resolver and binds nothing
 *   dlopen PATH   dlopen(PATH, RTLD_NOW): "ok"
 *   bound         probefs_ifunc_call_bound(1) and probefs_ifunc_call_hidden(1) of
 *                 libprobefs_ifunc_b: "ok R1 R2"
 *   quit          exits 0
 *
 * A test enables its probes only while the program waits for a `window` line and disables
 * them once it has the answer, so the window is the only code that runs under them. The
 * loop that reads commands, parses them and writes answers therefore calls no libc
 * function but read and write (no stdio, no string functions): a hit there would count.
 * The calls go through volatile pointers, so that no compiler turns them into inline code
 * or a builtin (the file is built with -fno-builtin as well).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int probefs_ifunc_call_bound(int x);
int probefs_ifunc_call_hidden(int x);

static void *(*volatile v_memcpy)(void *, const void *, size_t) = memcpy;
static size_t (*volatile v_strlen)(const char *) = strlen;
static int (*volatile v_strcmp)(const char *, const char *) = strcmp;
static void *(*volatile v_memset)(void *, int, size_t) = memset;
/* Taken, so that a GLOB_DAT slot of this program holds strstr's implementation. */
char *(*volatile v_strstr)(const char *, const char *) = strstr;

static unsigned long n_memcpy, n_strlen, n_strcmp, n_memset;

static void *w_memcpy(void *d, const void *s, size_t n) {
  ++n_memcpy;
  return v_memcpy(d, s, n);
}
static size_t w_strlen(const char *s) {
  ++n_strlen;
  return v_strlen(s);
}
static int w_strcmp(const char *a, const char *b) {
  ++n_strcmp;
  return v_strcmp(a, b);
}
static void *w_memset(void *d, int c, size_t n) {
  ++n_memset;
  return v_memset(d, c, n);
}

/* ---- output without stdio ---- */

static char out[256];
static size_t out_len;

static void put(const char *s) {
  while (*s && out_len < sizeof out) out[out_len++] = *s++;
}
static void put_dec(unsigned long v) {
  char d[24];
  int n = 0;
  do d[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
  while (n && out_len < sizeof out) out[out_len++] = d[--n];
}
static void put_hex(unsigned long v) {
  char d[24];
  int n = 0;
  do d[n++] = "0123456789abcdef"[v & 15]; while ((v >>= 4) != 0);
  put("0x");
  while (n && out_len < sizeof out) out[out_len++] = d[--n];
}
static void flush_line(void) {
  if (out_len < sizeof out) out[out_len++] = '\n';
  size_t at = 0;
  while (at < out_len) {
    ssize_t w = write(1, out + at, out_len - at);
    if (w <= 0) _exit(4);
    at += (size_t)w;
  }
  out_len = 0;
}

/* ---- input without stdio ---- */

static char line[4096];

/* The next line of stdin, without its newline; 0 at the end. */
static int next_line(void) {
  size_t n = 0;
  for (;;) {
    char c;
    ssize_t r = read(0, &c, 1);
    if (r <= 0) return 0;
    if (c == '\n') break;
    if (n + 1 < sizeof line) line[n++] = c;
  }
  line[n] = 0;
  return 1;
}

/* The rest of `line` after the word `w` and a blank, or NULL. */
static const char *after(const char *w) {
  const char *p = line;
  while (*w)
    if (*p++ != *w++) return NULL;
  if (*p == 0) return p;
  return *p == ' ' ? p + 1 : NULL;
}

static unsigned long parse_dec(const char *p) {
  unsigned long v = 0;
  while (*p >= '0' && *p <= '9') v = v * 10 + (unsigned long)(*p++ - '0');
  return v;
}

static void window(unsigned long rounds) {
  static char src[128] = "the quick brown fox jumps over the lazy dog";
  static char dst[128];
  static const char *const words[] = {"", "a", "memcpy", "a longer string, past 32 bytes of it"};
  n_memcpy = n_strlen = n_strcmp = n_memset = 0;
  unsigned long sum = 0;
  for (unsigned long i = 0; i < rounds; ++i) {
    w_memcpy(dst, src, 1 + i % 100);
    sum += w_strlen(words[i % 4]) + w_strlen(dst + i % 8);
    sum += (unsigned long)(w_strcmp(words[i % 4], words[(i + 1) % 4]) > 0);
    sum += (unsigned long)(w_strcmp(dst, src) == 0) + (unsigned long)(w_strcmp("x", "x") == 0);
    for (int k = 0; k < 4; ++k) w_memset(dst + 100, (int)(i + k), 1 + (i * 7 + k) % 28);
  }
  if (sum == 0 && rounds != 0) _exit(3);  /* the calls did nothing: a broken probe */
  put("ok ");
  put_dec(n_memcpy);
  put(" ");
  put_dec(n_strlen);
  put(" ");
  put_dec(n_strcmp);
  put(" ");
  put_dec(n_memset);
}

int main(void) {
  put("ready");
  flush_line();
  while (next_line()) {
    const char *arg;
    if ((arg = after("window")) != NULL) {
      window(parse_dec(arg));
    } else if ((arg = after("addr")) != NULL) {
      put("ok ");
      put_hex((unsigned long)dlsym(RTLD_DEFAULT, arg));
    } else if ((arg = after("dlopen")) != NULL) {
      put(dlopen(arg, RTLD_NOW) != NULL ? "ok" : "error");
    } else if (after("bound") != NULL) {
      put("ok ");
      put_dec((unsigned long)probefs_ifunc_call_bound(1));
      put(" ");
      put_dec((unsigned long)probefs_ifunc_call_hidden(1));
    } else if (after("quit") != NULL) {
      return 0;
    } else {
      put("unknown");
    }
    flush_line();
  }
  return 0;
}
