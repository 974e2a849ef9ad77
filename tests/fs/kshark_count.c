/* A trace.dat read with KernelShark's own library (libkshark), as the KernelShark GUI
 * loads it, for the KernelShark test:
 *
 *   kshark_count FILE
 *
 * prints one line per entry the library loads, "EVENT PID INFO" (EVENT as SYSTEM/NAME,
 * INFO the entry's text as KernelShark's table shows it; "<id N>" for an entry whose event
 * the library cannot name), then "count N". Exits 1 when the library cannot open or load
 * the file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libkshark.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    fputs("usage: kshark_count FILE\n", stderr);
    return 2;
  }
  struct kshark_context* ctx = NULL;
  if (!kshark_instance(&ctx)) {
    fputs("kshark_count: no KernelShark session\n", stderr);
    return 1;
  }
  int sd = kshark_open(ctx, argv[1]);
  if (sd < 0) {
    fprintf(stderr, "kshark_count: %s: kshark_open failed (%s)\n", argv[1], strerror(-sd));
    kshark_free(ctx);
    return 1;
  }
  struct kshark_entry** entries = NULL;
  ssize_t n = kshark_load_entries(ctx, sd, &entries);
  if (n < 0) {
    fprintf(stderr, "kshark_count: %s: kshark_load_entries failed (%s)\n", argv[1],
            strerror((int)-n));
    kshark_free(ctx);
    return 1;
  }
  for (ssize_t i = 0; i < n; ++i) {
    /* Both strings are the caller's to free. */
    char* event = kshark_get_event_name(entries[i]);
    char* info = kshark_get_info(entries[i]);
    if (event)
      printf("%s", event);
    else
      printf("<id %d>", entries[i]->event_id);
    printf(" %d %s\n", kshark_get_pid(entries[i]), info ? info : "");
    free(event);
    free(info);
    free(entries[i]);
  }
  free(entries);
  printf("count %zd\n", n);
  kshark_free(ctx); /* closes the stream too */
  return 0;
}
