// A small daemon for the agent tests: a listener, targets launched with the agent, ring
// areas, definitions compiled from kprobe_events lines and resolved in the target, and
// the records read back. Every wait is bounded; children are killed and reaped when their
// guard goes.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "events/compile.h"
#include "events/filter.h"
#include "events/link.h"
#include "events/parse.h"
#include "events/ring_consumer.h"
#include "tracee/agent_link.h"
#include "tracee/elf_symbols.h"
#include "tracee/launch.h"

namespace probefs::agent_test {

using namespace std::chrono_literals;
namespace lk = events::link;
using Clock = std::chrono::steady_clock;

// Bounds for waits that only a broken agent would reach.
constexpr auto kWait = 20s;

// A child process: killed and reaped when the guard goes, unless it was reaped already.
struct Child {
  pid_t pid = -1;
  int in = -1;   // its stdin (write end)
  int out = -1;  // its stdout (read end)
  int status = -1;
  std::string buffered;  // stdout read but not yet returned as lines

  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (in >= 0) ::close(in);
    if (out >= 0) ::close(out);
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  void close_stdin() {
    if (in >= 0) ::close(in);
    in = -1;
  }

  bool send_line(const std::string& s) {
    std::string l = s + "\n";
    return in >= 0 && ::write(in, l.data(), l.size()) == static_cast<ssize_t>(l.size());
  }

  // The next line of its stdout, waiting at most `timeout`.
  bool read_line(std::string* line, std::chrono::milliseconds timeout = kWait) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      size_t nl = buffered.find('\n');
      if (nl != std::string::npos) {
        *line = buffered.substr(0, nl);
        buffered.erase(0, nl + 1);
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || out < 0) return false;
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = ::read(out, buf, sizeof buf);
      if (n <= 0) return false;
      buffered.append(buf, static_cast<size_t>(n));
    }
  }

  // Waits for the exit and reaps; false on timeout.
  bool wait_exit(std::chrono::milliseconds timeout = kWait) {
    if (pid <= 0) return true;
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      int r;
      do {
        r = ::poll(&p, 1, static_cast<int>(timeout.count()));
      } while (r < 0 && errno == EINTR);
      ::close(pidfd);
      if (r <= 0) return false;
    }
    if (::waitpid(pid, &status, 0) != pid) return false;
    pid = -1;
    return true;
  }

  bool exited_ok() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// One record as the test reads it.
struct Rec {
  uint16_t event_id = 0;
  int32_t tid = 0;
  std::vector<uint8_t> bytes;

  uint64_t u64_at(uint32_t off, uint32_t size) const {
    uint64_t v = 0;
    if (off + size <= bytes.size()) std::memcpy(&v, bytes.data() + off, size);
    return v;
  }
};

// A target as the test daemon holds it.
struct Target {
  pid_t pid = -1;
  std::shared_ptr<tracee::AgentLink> link;
  events::RingArea area;
  std::unique_ptr<events::RingAreaReader> reader;
  std::unique_ptr<tracee::ProcessSymbols> symbols;
};

struct Event {
  events::CompiledEvent ev;
  uint16_t id = 0;
  uint32_t slot = 0;

  // A field of a record of this event, sign-extended when the type is signed.
  int64_t field(const Rec& r, const std::string& name) const {
    for (const events::FieldLayout& f : ev.fields) {
      if (f.name != name) continue;
      uint64_t v = r.u64_at(f.offset, f.size);
      if (f.type->is_signed && f.size < 8) {
        const unsigned shift = 64 - 8 * f.size;
        return static_cast<int64_t>(v << shift) >> shift;
      }
      return static_cast<int64_t>(v);
    }
    ADD_FAILURE() << "no field " << name;
    return 0;
  }

  // A string field: its bytes without the NUL, or "(fault)" for a zero-length one.
  std::string str(const Rec& r, const std::string& name) const {
    const uint32_t loc = static_cast<uint32_t>(field(r, name));
    const uint32_t len = loc >> 16, off = loc & 0xffff;
    if (len == 0) return "(fault)";
    if (off + len > r.bytes.size()) return "(bad __data_loc)";
    return std::string(reinterpret_cast<const char*>(r.bytes.data()) + off, len - 1);
  }
};

class TestDaemon {
 public:
  TestDaemon() {
    int err = 0;
    listener_ = tracee::AgentListener::create(&err);
    EXPECT_NE(listener_, nullptr) << "listener: " << err;
  }

  tracee::AgentListener& listener() { return *listener_; }

  // Launches `argv` with the agent, stdin and stdout piped to the test.
  bool launch(const std::vector<std::string>& argv, Child* child, Target* t) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return false;
    tracee::LaunchOptions o;
    o.argv = argv;
    o.agent_path = PROBEFS_AGENT_LIB;
    o.stdin_fd = in[0];
    o.stdout_fd = out[1];
    tracee::Launched l;
    std::string why;
    const int rc = tracee::launch(*listener_, o, &l, &why);
    ::close(in[0]);
    ::close(out[1]);
    child->in = in[1];
    child->out = out[0];
    EXPECT_EQ(rc, 0) << why;
    if (rc != 0) return false;
    child->pid = l.pid;
    t->pid = l.pid;
    t->link = l.link;
    return true;
  }

  // A ring area for the target, handed over with SETUP.
  bool setup(Target* t, uint32_t ring_bytes = 256 * 1024,
             uint32_t options = 0) {
    events::RingGeometry g;
    g.ring_count = 16;
    g.ring_bytes = ring_bytes;
    g.probe_slots = 64;
    const uint32_t mode = events::ring_detect_stamp_mode(events::kRingStampTsc);
    EXPECT_EQ(events::RingArea::create(g, mode, &t->area), 0);
    t->reader = std::make_unique<events::RingAreaReader>();
    EXPECT_EQ(t->reader->attach(t->area.mem(), t->area.size(), t->pid), 0);
    const tracee::LinkResult r = t->link->setup(t->area.fd(), t->area.size(), 0, options);
    EXPECT_EQ(r.error, 0) << r.message;
    return r.error == 0;
  }

  // Parses and compiles a kprobe_events line, resolves its place in the target.
  bool prepare(Target* t, const std::string& line, uint16_t id, uint32_t slot, Event* ev,
               lk::Define* d, bool enabled = true) {
    events::ParseResult pr = events::parse_kprobe_command(line);
    EXPECT_EQ(pr.status, events::ParseStatus::kDefine) << line << ": " << pr.error.message();
    if (pr.status != events::ParseStatus::kDefine) return false;
    events::Diagnostic diag;
    if (!events::compile(pr.def, {}, &ev->ev, &diag)) {
      ADD_FAILURE() << "compile: " << diag.message();
      return false;
    }
    ev->id = id;
    ev->slot = slot;
    if (!t->symbols) {
      int err = 0;
      t->symbols = tracee::ProcessSymbols::load(t->pid, &err);
      EXPECT_NE(t->symbols, nullptr) << err;
      if (!t->symbols) return false;
    }
    std::string name = pr.def.module.empty() ? pr.def.symbol : pr.def.module + ":" + pr.def.symbol;
    tracee::ResolvedSymbol rs;
    const int rc = t->symbols->resolve(name, &rs);
    EXPECT_EQ(rc, 0) << name;
    if (rc != 0) return false;
    d->probe_id = slot + 1;
    d->counter_slot = slot;
    d->event_id = id;
    d->kind = pr.def.is_return ? lk::ProbeKind::kReturn : lk::ProbeKind::kEntry;
    d->enabled = enabled;
    d->maxactive = static_cast<uint32_t>(pr.def.maxactive);
    d->address = rs.addr + pr.def.offset;
    d->bounds.start = rs.function.start;
    d->bounds.end = rs.function.end;
    d->bounds.landing_pads.assign(rs.function.landing_pads.begin(), rs.function.landing_pads.end());
    d->bounds.related = rs.function.related;
    d->symbol = rs.name;
    d->symbol_addr = rs.addr;
    d->module = rs.module;
    d->program = ev->ev.program;
    return true;
  }

  bool define(Target* t, const std::string& line, uint16_t id, uint32_t slot, Event* ev,
              bool enabled = true) {
    lk::Define d;
    if (!prepare(t, line, id, slot, ev, &d, enabled)) return false;
    const tracee::LinkResult r = t->link->define(d);
    EXPECT_EQ(r.error, 0) << line << ": " << r.message;
    return r.error == 0;
  }

  // Every record in the target's rings, consumed, in timestamp order.
  static std::vector<Rec> drain(Target* t) {
    std::vector<Rec> out;
    events::RingMerger m(true);
    m.add(t->reader.get(), 0);
    events::RingRecord r;
    while (m.next(&r)) {
      Rec rec;
      rec.bytes.assign(r.payload.begin(), r.payload.end());
      rec.event_id = static_cast<uint16_t>(rec.u64_at(0, 2));
      rec.tid = static_cast<int32_t>(rec.u64_at(4, 4));
      out.push_back(std::move(rec));
    }
    return out;
  }

  // The next event of the listener, waiting at most `timeout`.
  bool next_event(tracee::LinkEvent* ev, std::chrono::milliseconds timeout = kWait) {
    return listener_->next_event(ev, timeout);
  }

 private:
  std::unique_ptr<tracee::AgentListener> listener_;
};

inline std::vector<Rec> of_event(const std::vector<Rec>& all, uint16_t id) {
  std::vector<Rec> out;
  for (const Rec& r : all)
    if (r.event_id == id) out.push_back(r);
  return out;
}

}  // namespace probefs::agent_test
