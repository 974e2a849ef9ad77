// A tracefs client as programs using libtracefs are written, for probefs run's tests:
// prints the tracing directory libtracefs chose ("dir PATH"), then each event it finds
// there as SYSTEM:EVENT.
#include <stdio.h>
#include <tracefs.h>

int main(void) {
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
