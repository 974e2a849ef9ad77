/* A program probefs cannot enter: linked statically (no dynamic loader, so no
 * LD_PRELOAD), for the tests that it is said to be untraceable. Prints "ready", then
 * answers one line per command on stdin:
 *
 *   ping         "pong"
 *   exec PATH    execs PATH (no arguments): what it prints follows
 *   quit         exits 0
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  puts("ready");
  char line[512];
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\n")] = '\0';
    if (strcmp(line, "ping") == 0) {
      puts("pong");
    } else if (strncmp(line, "exec ", 5) == 0) {
      char* args[] = {line + 5, NULL};
      execv(line + 5, args);
      puts("?");
    } else if (strcmp(line, "quit") == 0) {
      return 0;
    } else {
      puts("?");
    }
  }
  return 0;
}
