// The Tracer as the tracee tests drive it: a tracer with the agent built beside them, and
// events defined from a dynamic-events line.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>
#include <memory>
#include <thread>
#include <string>
#include <string_view>

#include "events/compile.h"
#include "events/parse.h"
#include "tracee/tracer.h"

namespace probefs::tracee::testing {

// Whether `cond` holds within `timeout_ms`, asked again every few milliseconds (the
// tracer's service thread moves on its own: it frees drained areas once a second).
template <typename F>
bool eventually(F cond, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

inline std::unique_ptr<Tracer> make_tracer(uint32_t buffer_kb = 1024) {
  Tracer::Options o;
  o.agent_path = PROBEFS_AGENT_PATH;
  o.buffer_size_kb = buffer_kb;
  std::string err;
  auto t = Tracer::create(o, &err);
  EXPECT_NE(t, nullptr) << err;
  return t;
}

struct Event {
  ProbeSpec spec;
  ProbeId id = 0;
};

// Parses and compiles `line`, defines it (enabled unless said) with event id `eid`. With
// `err_out` a refusal is the caller's to check; `diag_out` gets the tracer's diagnostic.
inline Event define(Tracer& t, const std::string& line, uint16_t eid, bool enabled = true,
                    int* err_out = nullptr, events::Diagnostic* diag_out = nullptr) {
  Event e;
  events::ParseResult r = events::parse_dynamic_command(line);
  EXPECT_EQ(r.status, events::ParseStatus::kDefine) << line;
  e.spec.def = r.def;
  events::Diagnostic d;
  // For the layout only: the tracer compiles again in each target, with its data symbols.
  auto any_address = [](std::string_view, uint64_t* addr) {
    *addr = 0;
    return true;
  };
  EXPECT_TRUE(events::compile(e.spec.def, any_address, &e.spec.compiled, &d)) << line;
  e.spec.event_id = eid;
  e.spec.enabled = enabled;
  int err = t.define_probe(e.spec, &e.id, &d);
  if (err_out) *err_out = err;
  else EXPECT_EQ(err, 0) << line << ": " << d.message();
  if (diag_out) *diag_out = d;
  return e;
}

// A tracer's notices as they come (on_target_notice), for a test to wait on.
struct NoticeLog {
  std::vector<TargetNotice> list;  // under mu
  std::mutex mu;
  std::condition_variable cv;

  void listen(Tracer& t) {
    t.on_target_notice([this](const TargetNotice& n) {
      std::lock_guard l(mu);
      list.push_back(n);
      cv.notify_all();
    });
  }
};

}  // namespace probefs::tracee::testing
