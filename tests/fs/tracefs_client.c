// A tracefs client as programs using libtracefs are written, for probefs run's tests.
//
//   tracefs_client            prints the tracing directory libtracefs chose ("dir PATH"),
//                             then each event it finds there as SYSTEM:EVENT
//   tracefs_client raw FIELD  reads every CPU's per_cpu/cpuN/trace_pipe_raw with
//                             tracefs_iterate_raw_events() (oldest first, consuming) and
//                             prints each record as "SYSTEM:EVENT CPU FIELD=VALUE"
//                             (VALUE in decimal, "-" when the event has no such field)
#include <stdio.h>
#include <string.h>
#include <tracefs.h>

static int list_events(void) {
  const char* dir = tracefs_tracing_dir();
  if (!dir) {
    fputs("tracefs_client: libtracefs found no tracing directory\n", stderr);
    return 1;
  }
  printf("dir %s\n", dir);
  char** systems = tracefs_event_systems(NULL);
  for (int i = 0; systems && systems[i]; ++i) {
    char** events = tracefs_system_events(NULL, systems[i]);
    for (int j = 0; events && events[j]; ++j) printf("%s:%s\n", systems[i], events[j]);
    tracefs_list_free(events);
  }
  tracefs_list_free(systems);
  return 0;
}

static int print_record(struct tep_event* event, struct tep_record* record, int cpu,
                        void* context) {
  const char* name = context;
  struct tep_format_field* field = tep_find_field(event, name);
  unsigned long long value = 0;
  if (field && tep_read_number_field(field, record->data, &value) == 0)
    printf("%s:%s %d %s=%llu\n", event->system, event->name, cpu, name, value);
  else
    printf("%s:%s %d %s=-\n", event->system, event->name, cpu, name);
  return 0;
}

static int raw_events(const char* field) {
  // The formats of every event of the directory, as trace-cmd reads them.
  struct tep_handle* tep = tracefs_local_events(NULL);
  if (!tep) {
    fputs("tracefs_client: tracefs_local_events failed\n", stderr);
    return 1;
  }
  int rc = tracefs_iterate_raw_events(tep, NULL, NULL, 0, print_record, (void*)field);
  tep_free(tep);
  if (rc != 0) {
    fputs("tracefs_client: tracefs_iterate_raw_events failed\n", stderr);
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 1) return list_events();
  if (argc == 3 && strcmp(argv[1], "raw") == 0) return raw_events(argv[2]);
  fputs("usage: tracefs_client [raw FIELD]\n", stderr);
  return 2;
}
