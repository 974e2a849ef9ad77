// A daemon in a process of its own, for the tests that kill one: attaches to PID, defines
// and enables the definitions given, says "ready", and keeps tracing (draining the rings)
// until its stdin ends or it is killed.
//
//   tracer_stub AGENT PID DEFINITION...
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "events/compile.h"
#include "events/parse.h"
#include "tracee/tracer.h"

using namespace probefs;

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  tracee::Tracer::Options o;
  o.agent_path = argv[1];
  std::string err;
  auto t = tracee::Tracer::create(o, &err);
  if (!t) {
    std::printf("error %s\n", err.c_str());
    return 1;
  }
  const pid_t pid = std::atoi(argv[2]);
  uint16_t id = 1;
  for (int i = 3; i < argc; ++i) {
    events::ParseResult r = events::parse_dynamic_command(argv[i]);
    tracee::ProbeSpec spec;
    spec.def = r.def;
    events::Diagnostic d;
    if (r.status != events::ParseStatus::kDefine ||
        !events::compile(spec.def, {}, &spec.compiled, &d)) {
      std::printf("error bad definition %s\n", argv[i]);
      return 1;
    }
    spec.event_id = id++;
    spec.enabled = true;
    tracee::ProbeId pid_;
    if (int e = t->define_probe(spec, &pid_, &d); e != 0) {
      std::printf("error define %d\n", e);
      return 1;
    }
  }
  if (int e = t->attach(pid, &err); e != 0) {
    std::printf("error attach %d %s\n", e, err.c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) {
    tracee::TraceRecord r;
    while (t->next_record(&r)) {
    }
    pollfd p{0, POLLIN, 0};
    if (poll(&p, 1, 0) == 1) {
      char c;
      if (read(0, &c, 1) <= 0) break;
    }
    t->wait_for_records(20);
  }
  return 0;
}
