/* The program scripts/demo traces and README's walkthrough probes: a loop of orders,
 * each priced by price_order() at a pace a person can watch.
 *
 *   probefs_demo_prog [COUNT [INTERVAL_MS [hold]]]   (default: 40 orders, 100 ms apart)
 *
 * With `hold`, it waits for a line (or end of file) on stdin before it exits.
 * It prints the total at the end, so a probe that changed a result would show.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const kItems[] = {"apple", "bread", "cheese", "dates", "eggs"};

__attribute__((noinline)) long price_order(int id, const char *item, int quantity) {
  __asm__ volatile("" ::: "memory");
  return (long)quantity * (long)(strlen(item) * 10 + (unsigned)id % 7);
}

int main(int argc, char **argv) {
  int count = argc > 1 ? atoi(argv[1]) : 40;
  int interval_ms = argc > 2 ? atoi(argv[2]) : 100;
  long total = 0;
  for (int i = 0; i < count; ++i) {
    total += price_order(i, kItems[i % 5], 1 + i % 3);
    struct timespec ts = {interval_ms / 1000, (long)(interval_ms % 1000) * 1000000L};
    if (interval_ms > 0) nanosleep(&ts, NULL);
  }
  printf("%d orders, total %ld\n", count, total);
  fflush(stdout);
  if (argc > 3 && strcmp(argv[3], "hold") == 0) (void)getchar();
  return 0;
}
