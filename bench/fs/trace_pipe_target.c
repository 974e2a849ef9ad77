/* The program trace_pipe_bench traces: it calls bench_hit(a, b), a function with two
 * integer arguments, when the bench asks, one byte on stdin per command. With `pipe` it
 * writes to stdout, instead of each call, the text line a trace_pipe reader would get for
 * it, so a plain pipe carries the same lines (the baseline).
 *
 *   trace_pipe_target hit|pipe ID [N [RATE [MS [spin|sleep [PRIME]]]]]
 *     'w'  bench_hit(kWarm, ID): the bench's check that the probe is in place
 *     'g'  PRIME calls bench_hit(i, i & 7) at RATE, unreported (the buffers' pages
 *          written once, before the run: a page's first write costs a fault) and a
 *          10 ms pause for the reader to take them (a fence dropped by a full buffer
 *          would leave the run uncounted), then
 *          bench_hit(kFence, ID), then N calls bench_hit(i, i & 7) at RATE calls per
 *          second (0: as fast as it can), or fewer if MS milliseconds pass first; then
 *          "done <calls> <calls per second>" on stderr. `spin` (the default) keeps the
 *          pace with bursts of 64 calls and a busy wait between them: a program busy on
 *          its CPU. `sleep` makes bursts of 2048 calls and sleeps between them, leaving
 *          its CPU free most of the time.
 *     'e'  bench_hit(kEnd, ID): the end of the records of a 'g'
 *     'r'  a request: takes CLOCK_MONOTONIC, calls bench_hit(<that time in ns>,
 *          ID << 20 | <request number>)
 *     'l'  calls bench_hit(i, 0) in a loop, one call every 10 us, until stdin has more
 *     'q', or the end of stdin: exits
 *
 * ID (at least 0x100) tells one run's marker calls from another's; the N calls' b is a
 * single hex digit, so a reader tells the markers by their b alone.
 *
 * bench_hit starts with a nop so that the kernel's uprobe emulates its first instruction
 * instead of single-stepping it out of line: the kernel's fastest path, for its column.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define kWarm 0x5741524dL  /* "WARM" */
#define kFence 0x46454e4345L /* "FENCE" */
#define kEnd 0x454e44L        /* "END" */

__attribute__((noinline)) long bench_hit(long a, long b) {
  __asm__ volatile("nop" ::: "memory");
  return a * 3 + b;
}

static int g_pipe_mode;
static char g_out[1 << 16];
static size_t g_out_len;
static char g_comm[17];
static int g_pid;

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void flush_out(void) {
  size_t at = 0;
  while (at < g_out_len) {
    ssize_t n = write(1, g_out + at, g_out_len - at);
    if (n <= 0) exit(1);
    at += (size_t)n;
  }
  g_out_len = 0;
}

/* The line the kernel would print for a kprobe event on bench_hit (its size as a kprobe
 * event shows it), stamped `ts_ns`. Written in chunks of about the size one trace_pipe
 * read returns (8 KiB), or at once when `now`. */
static void put_line(long a, long b, long ts_ns, int now) {
  g_out_len += (size_t)snprintf(g_out + g_out_len, sizeof g_out - g_out_len,
                                "%16s-%-7d [%03d] %5s %5lu.%06lu: %s: (%s+0x0/0x%x) a=0x%lx b=0x%lx\n",
                                g_comm, g_pid, 0, ".....", (unsigned long)(ts_ns / 1000000000L),
                                (unsigned long)(ts_ns % 1000000000L / 1000), "hit", "bench_hit", 9,
                                (unsigned long)a, (unsigned long)b);
  if (now || g_out_len > 8192 - 160) flush_out();
}

static void call(long a, long b, long ts_ns, int now) {
  if (g_pipe_mode)
    put_line(a, b, ts_ns, now);
  else
    bench_hit(a, b);
}

/* N calls at `rate` per second, for at most `ms` milliseconds (0: no limit): a burst of
 * calls, then a wait until the schedule allows the next burst. A program that falls more
 * than kCatchUpNs behind (it lost its CPU for a while) starts the schedule over from
 * now: the calls missed are not made up in a run at full speed, which after a stall of
 * milliseconds would be a stretch at twice the rate asked for; the calls per second it
 * reports are what it kept. */
#define kCatchUpNs 100000.0
static void run(long n, long rate, long ms, int sleep, int report) {
  const long burst = sleep ? 2048 : 64;
  const double burst_ns = rate > 0 ? (double)burst * 1e9 / (double)rate : 0;
  const long t0 = now_ns();
  const long stop = ms > 0 ? t0 + ms * 1000000L : 0;
  double next = (double)t0; /* when the next burst is due */
  long ts = t0, i;
  for (i = 0; i < n; i++) {
    if (i % burst == 0) {
      ts = now_ns();
      if (stop && ts >= stop) break;
      if (rate > 0) {
        if ((double)ts > next + kCatchUpNs) next = (double)ts;
        const long due = (long)next;
        next += burst_ns;
        if (sleep && ts < due) {
          struct timespec at = {due / 1000000000L, due % 1000000000L};
          while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) != 0) {
          }
          ts = now_ns();
        }
        while (ts < due) ts = now_ns();
      }
    }
    call(i, i & 7, ts, 0);
  }
  if (g_pipe_mode) flush_out();
  if (!report) return;
  const double s = (double)(now_ns() - t0) / 1e9;
  fprintf(stderr, "done %ld %.0f\n", i, s > 0 ? (double)i / s : 0.0);
}

/* One call every 10 us until stdin has something (a command) or ends. */
static void loop(void) {
  struct pollfd p = {0, POLLIN, 0};
  for (long i = 0;; i++) {
    const long due = now_ns() + 10000;
    call(i, 0, due, 1);
    if ((i & 15) == 0 && poll(&p, 1, 0) > 0) return;
    while (now_ns() < due) {
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: trace_pipe_target hit|pipe ID [N [RATE [MS [spin|sleep [PRIME]]]]]\n");
    return 2;
  }
  g_pipe_mode = strcmp(argv[1], "pipe") == 0;
  const long id = argc > 2 ? strtol(argv[2], NULL, 0) : 0x100;
  const long n = argc > 3 ? atol(argv[3]) : 1000000;
  const long rate = argc > 4 ? atol(argv[4]) : 0;
  const long ms = argc > 5 ? atol(argv[5]) : 0;
  const int sleep = argc > 6 && strcmp(argv[6], "sleep") == 0;
  const long prime = argc > 7 ? atol(argv[7]) : 0;
  g_pid = getpid();
  int fd = open("/proc/self/comm", O_RDONLY);
  if (fd >= 0) {
    ssize_t k = read(fd, g_comm, sizeof g_comm - 1);
    if (k > 0 && g_comm[k - 1] == '\n') g_comm[k - 1] = 0;
    close(fd);
  }
  long seq = 0;
  char c;
  while (read(0, &c, 1) == 1) {
    switch (c) {
      case 'w': call(kWarm, id, now_ns(), 1); break;
      case 'g':
        if (prime > 0) {
          run(prime, rate, 0, sleep, 0);
          const struct timespec pause = {0, 10000000L};
          nanosleep(&pause, NULL);
        }
        call(kFence, id, now_ns(), 1);
        run(n, rate, ms, sleep, 1);
        break;
      case 'e': call(kEnd, id, now_ns(), 1); break;
      case 'r': {
        const long t = now_ns();
        call(t, id << 20 | ++seq, t, 1);
        break;
      }
      case 'l': loop(); break;
      case 'q': return 0;
      default: break;
    }
  }
  return 0;
}
