// See probe_prog.h. Usage: probe_prog [ROUNDS]. Each round prices a few orders and prints
//   price id=ID discount=D qty2=Q priority=P rush=R weight=W zone=Z postcode=C item=ITEM
//         note=NOTE -> TOTAL
//   scale v=V by=B -> R
//   clamp v=V -> R
//   checksum n=N -> C
//   seen orders_seen=N
// and waits for a line on stdin before it starts, when PROBE_PROG_WAIT is set, so a test can
// define probes first.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_prog.h"

long orders_seen = 0;
static int static_total = 0;
const char *greeting = "probe me";

// Always inlined, at -O0 too: two call sites, two inlined instances.
static inline __attribute__((always_inline)) int clamp(int v, int lo, int hi) {
  int r = v < lo ? lo : v;
  if (r > hi) r = hi;
  return r;
}

static __attribute__((noinline)) int scale(int v, int by) {
  int scaled = v * by;
  static_total += scaled;
  return scaled;
}

__attribute__((noinline)) long price_order(struct order *o, int discount, const char *coupon) {
  long subtotal = 0;
  for (int i = 0; i < 4; i++) subtotal += o->qty[i] * (o->id + 1);
  int capped = clamp(discount, 0, 50);
  subtotal -= capped;
  if (coupon && coupon[0] == 'X') subtotal = scale((int)subtotal, 2);
  orders_seen++;
  printf("price id=%d discount=%d qty2=%d priority=%u rush=%u weight=%u zone=%d postcode=%ld "
         "item=%s note=%s -> %ld\n",
         o->id, discount, o->qty[2], o->priority, o->rush, o->weight, o->ship.zone,
         o->bill->postcode, o->item, o->note, subtotal);
  return subtotal;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 3;
  if (getenv("PROBE_PROG_WAIT")) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
  }
  static const char *items[] = {"apple", "bread", "cheese"};
  struct address bill = {7, 10115};
  for (int round = 0; round < rounds; round++) {
    for (int k = 0; k < 3; k++) {
      struct order o;
      memset(&o, 0, sizeof o);
      o.id = round * 3 + k;
      snprintf(o.item, sizeof o.item, "%s", items[k]);
      o.priority = (unsigned)(k + 1) & 7;
      o.rush = k == 2;
      o.weight = (unsigned)(100 + o.id * 7) & 0x1ff;
      for (int i = 0; i < 4; i++) o.qty[i] = i + k;
      o.ship.zone = (short)(k - 1);
      o.ship.postcode = 20000 + k;
      bill.postcode = 10115 + o.id;
      o.bill = &bill;
      o.note = k == 1 ? "gift" : "none";
      long total = price_order(&o, o.id * 20, k == 2 ? "XMAS" : "");
      int c = clamp((int)total, -5, 100);
      printf("clamp v=%ld -> %d\n", total, c);
      int sum = lib_checksum(o.item, (int)strlen(o.item));
      printf("checksum n=%d -> %d\n", (int)strlen(o.item), sum);
    }
  }
  printf("seen orders_seen=%ld static_total=%d %s\n", orders_seen, static_total, greeting);
  return 0;
}
