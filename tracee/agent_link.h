// The daemon's end of the agent links (events/link.h's messages over link/socket.h's
// sockets): one listener per daemon, one AgentLink per connected agent.
//
// Endpoints. An abstract socket name is listed in /proc/net/unix and any local user may
// connect to it, so the listener binds socket files instead, one per uid it serves, each
// in a directory only that uid (and root) can enter:
//
//   RUNDIR/probefs.<daemon pid>.XXXXXX/      0711, the daemon's: entered, never listed
//     <uid>/                                 0700, owned by <uid>
//       probefs.<daemon pid>.<32 hex>        the socket (0666: the directory guards it)
//
// RUNDIR is /run for root (else /tmp), $XDG_RUNTIME_DIR or /tmp for another user. The
// daemon's own uid has an endpoint from the start (launch: name()); another uid gets one
// when a process of it is announced (attach, `probefs exec`: endpoint()). A process of
// another uid cannot reach the socket at all (connect fails with EACCES): it can neither
// talk to the daemon nor keep it busy. The tree goes with the listener; one that a killed
// daemon left behind is removed by the next listener that finds its daemon gone (no such
// pid, and no socket of the tree that accepts). A process in another mount namespace
// (a container with its own /run or /tmp) cannot reach the endpoint: attach to it fails.
// Exec, fork and launch children reach it as their parent did (the name is in their
// environment), with no round trip added to their start.
//
// Admission. A connection is checked the moment it is accepted, with SO_PEERCRED (which
// the kernel fills in at connect): its uid must be the endpoint's, and its pid
//   - announced with expect() (launch, attach; the uid is the process's at that time),
//   - or announced with expect_exec() for that uid, before its deadline (`probefs exec`),
//   - or a process that has or had a link, with the same uid (a new image after exec),
//   - or a child (/proc PPid) of one, with the same uid (fork; posix_spawn or vfork and
//     exec), or of a process whose own connection waits for its HELLO (a fork child that
//     runs on at once may fork before the daemon read its HELLO: that HELLO is read
//     first),
//   - or a process of the endpoint's uid that is gone already (no /proc entry, or one
//     that its parent is reaping, whose parent reads as 0): a fork child that took
//     its parent's spare area (offer_spare) runs on without waiting and may exit before
//     it is accepted; it is let in only by a HELLO that names a spare offered to its
//     parent, a process with a link and that uid (its records are in that area).
// Anything else is closed at once, before a byte is read. An admitted connection then
// becomes an AgentLink only when its first packet, within kHelloTimeout, is a HELLO whose
// pid is the SO_PEERCRED pid and whose reason fits the rule that admitted it (a fork
// child's HELLO names its parent as /proc does; a pid announced with expect_exec() says
// kLaunch or kExec).
//
// Bounds. At most kMaxPendingPerUid admitted connections per uid wait for their HELLO;
// beyond that the endpoint is not accepted from until one leaves (the kernel's backlog
// holds the rest). accept() failing for want of descriptors or memory (EMFILE, ENFILE,
// ENOBUFS, ENOMEM) pauses every endpoint for kAcceptPause instead of firing again at once
// (epoll is level-triggered), with one warning. A link may have kMaxMappedInFlight MAPPED
// requests unanswered, kMaxProtocolErrors packets the daemon cannot use (malformed, too
// long, not a request it serves), one reply of at most lk::kMaxReplySize in assembly;
// and a send to it that finds its socket full for a whole request timeout means it does
// not read (unless its process is stopped: it is served when it runs again). A peer that
// goes past any of these is disconnected (its link ends, as at EOF) with one line on
// stderr. So the event queue holds at most kMaxMappedInFlight + 2 events
// per link.
//
// Delivery: a connection of a pid announced with expect() goes to wait_for(pid); every
// other accepted connection, each MAPPED request and each link's end go to the event queue
// (next_event, event_fd). The I/O thread itself never waits for anything but the sockets, so a caller
// may send requests and wait for their replies from any thread, including the one that
// handles events.
//
// Requests (AgentLink) are synchronous: they send, then wait for the REPLY at most the
// link's timeout. A request that times out returns -ETIMEDOUT (a late reply is dropped);
// one on a closed link returns -ENOTCONN (or -EPIPE while sending). Errors are the agent's
// kernel-style negative errno with its message (events/link.h, REPLY). A request may also
// be started (start) and its reply collected later (collect): the daemon asks every
// target first and then collects every reply under one deadline, so that targets are
// asked in parallel and a slow one costs the others nothing (DESIGN.md §9).
//
// kprobes/list. Most of what changes an agent's list is a request of the daemon's; the
// rest are its optimizer thread's retries and objects unloaded. The link counts these
// (list_generation): each request that can change the list, each MAPPED, and each
// LIST_CHANGED notice, which the agent sends when its optimizer changed a probe on its
// own. A reader that keeps the text of a LIST with the generation it read before asking
// knows when that text is still what the agent would say.
//
// Threads: every method of both classes may be called from any thread at any time;
// requests on one link may overlap (each waits for its own reply). Destroying the listener
// stops its I/O thread and closes every link (agents see EOF and remove their probes).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "events/link.h"

namespace probefs::tracee {

namespace lk = events::link;

// What a request got back.
struct LinkResult {
  int error = 0;        // 0 or a negative errno (the agent's, or -ETIMEDOUT, -ENOTCONN ...)
  std::string message;  // the agent's text: a failure's reason, or the LIST text
  std::vector<lk::ProfileEntry> profile;  // PROFILE
  // The process is stopped (SIGSTOP, a debugger): the request waits in its link, in order,
  // and takes effect when the process runs again; nobody waits for its reply. error is 0,
  // and a query's answer is empty.
  bool deferred = false;

  bool ok() const { return error == 0; }
};

class AgentListener;

class AgentLink {
 public:
  ~AgentLink();
  AgentLink(const AgentLink&) = delete;
  AgentLink& operator=(const AgentLink&) = delete;

  pid_t pid() const;
  uid_t uid() const;
  const lk::Hello& hello() const;  // as the agent sent it
  // The link ended: EOF (the process exited or exec'd, or the agent detached), an error,
  // or close(). A closed link stays closed; requests on it fail with -ENOTCONN.
  bool closed() const;
  // Requests deferred because the process was stopped, that it has not done yet.
  size_t deferred_requests() const;

  // How long each request waits for its reply (default kDefaultTimeout).
  void set_timeout(std::chrono::milliseconds t);

  // SETUP: hands the ring area (a memfd, duplicated into the agent by SCM_RIGHTS; the
  // caller keeps its own fd) and the trace options.
  LinkResult setup(int memfd, uint64_t area_size, uint32_t trace_clock, uint32_t options = 0);
  LinkResult define(const lk::Define& d);
  LinkResult remove(uint32_t probe_id);
  LinkResult enable(uint32_t probe_id);
  LinkResult disable(uint32_t probe_id);
  // nullptr clears the filter.
  LinkResult set_filter(uint32_t probe_id, const events::CompiledFilter* filter);
  LinkResult arm_all();
  LinkResult disarm_all();
  LinkResult set_optimization(bool on);
  // Requests started without waiting for their replies. A ticket is collected exactly
  // once; with seq 0 the request was not sent, and collect() returns why (`failed`).
  struct Ticket {
    uint32_t seq = 0;
    std::chrono::steady_clock::time_point deadline;  // the link's timeout, from the send
    LinkResult failed;
  };
  // Sends one request of `type` (DEFINE, REMOVE, ENABLE, DISABLE, SET_FILTER, ARM_ALL,
  // DISARM_ALL, OPTIMIZATION, LIST, PROFILE or BLACKLIST, with the body events/link.h
  // gives it) and returns once it left. Requests on one link take effect in the order
  // they were started.
  Ticket start(lk::MsgType type, lk::Body body);
  // SETUP, and BRANCHES or UNWIND (`type`), started like the others: the memfd goes with
  // the packet (the caller keeps its own fd).
  Ticket start_setup(int memfd, uint64_t area_size, uint32_t trace_clock, uint32_t options = 0);
  Ticket start_table(lk::MsgType type, lk::Body body, int table_fd);
  // HIST_TABLE with the tables' memfd (none for a release).
  Ticket start_hist_table(const lk::HistTable& h, int memfd);
  // SPARE (events/link.h), sent without anybody waiting for its reply: the daemon learns
  // whether the agent took it from a fork child that names it. 0 once it left, or why not.
  int post_spare(const lk::Spare& s, int memfd);
  // The reply to `t`, waiting at most until `deadline` or the ticket's own deadline,
  // whichever comes first: what the synchronous call would have returned (deferred when
  // the process is stopped, -ETIMEDOUT when no reply came in time).
  LinkResult collect(const Ticket& t, std::chrono::steady_clock::time_point deadline);

  // Grows whenever the agent's kprobes/list may have changed (see the top of this file):
  // before a request that can change it leaves, when a MAPPED arrives, and at each
  // LIST_CHANGED notice of the agent's.
  uint64_t list_generation() const;

  LinkResult list();     // message: the agent's `kprobes/list` text
  LinkResult profile();  // profile: nmissed per probe id
  LinkResult blacklist();  // message: the engine's blacklist ranges (link.h, BLACKLIST)
  LinkResult go();       // a launched, exec'd or fork child program runs on
  // Removes every probe in the target and ends the link (the agent stays loaded, idle,
  // and can be attached again). The link is closed when this returns.
  LinkResult detach();

  // Answers the MAPPED request `mapped_seq` (an event of kind kMapped): sends `defines`
  // as part of the answer, then the REPLY that lets the target's dynamic linker go on,
  // and waits for the agent's result of each DEFINE (same order). With no defines, only
  // the REPLY is sent. Must be called once for every kMapped event, promptly: the thread
  // in the target that loads the library waits for it (bounded by the agent).
  std::vector<LinkResult> answer_mapped(uint32_t mapped_seq,
                                        const std::vector<lk::Define>& defines);

  // Ends the link abruptly, as the daemon's death would (tests, and a target that
  // misbehaves). Waiting requests return -ENOTCONN.
  void close();

  static constexpr std::chrono::milliseconds kDefaultTimeout{10000};

 private:
  friend class AgentListener;
  struct Impl;
  explicit AgentLink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct LinkEvent {
  enum Kind {
    kConnected,  // a fork child or an exec'd image connected: link is new (hello().reason)
    kMapped,     // link's process loaded or unloaded objects: answer with answer_mapped()
    kClosed,     // link ended (see AgentLink::closed)
  };
  Kind kind = kClosed;
  std::shared_ptr<AgentLink> link;
  bool prepared = false;  // kConnected: the pid was announced with expect_exec()
  uint32_t seq = 0;       // kMapped: the request's seq, for answer_mapped()
  lk::Mapped mapped;      // kMapped
};

// What the listener holds and what it turned away (tests, diagnostics).
struct ListenerStats {
  size_t pending = 0;          // admitted connections waiting for their HELLO
  size_t queued_events = 0;    // the event queue's length
  size_t links = 0;            // open links
  size_t endpoints = 0;        // uids with a socket
  uint64_t refused = 0;        // connections closed at accept, or at their HELLO
  uint64_t disconnected = 0;   // links ended for going past a bound
  uint64_t accept_failures = 0;  // accept() calls that failed for want of fds or memory
  uint64_t accept_pauses = 0;    // pauses of accepting that followed them
};

class AgentListener {
 public:
  // Makes the endpoint tree and the daemon's own endpoint, and starts the I/O thread.
  // nullptr and *err (negative errno) on failure.
  static std::unique_ptr<AgentListener> create(int* err);
  ~AgentListener();
  AgentListener(const AgentListener&) = delete;
  AgentListener& operator=(const AgentListener&) = delete;

  // The name processes of the daemon's own uid connect to (launch: PROBEFS_AGENT_LINK).
  const std::string& name() const;
  // The name processes of `uid` connect to (PROBEFS_AGENT_LINK, probefs_agent_attach's
  // argument), its endpoint made on first use. 0, or a negative errno (-EPERM: a daemon
  // that is not root serves no other uid).
  [[nodiscard]] int endpoint(uid_t uid, std::string* name);

  // Announces that process `pid` will connect (a launched child before it execs, an
  // attached process before the agent's attach call), with the effective uid it has now:
  // its connection goes to wait_for(). 0, or -ESRCH when the process is gone. With
  // `name`, also the endpoint for that uid (endpoint()).
  int expect(pid_t pid, std::string* name = nullptr);
  // Withdraws an expectation (the launch or attach failed); a connection that arrives
  // later is refused.
  void unexpect(pid_t pid);
  // Process `pid` was detached: it is no process with a link any more, so neither its
  // later images nor its children (fork, or spawned and exec'd) are let in again, unless
  // it is attached again (expect()).
  void forget(pid_t pid);
  // Announces that process `pid`, of user `uid`, will exec a program with the agent
  // preloaded itself (`probefs exec`): its HELLO kLaunch (or kExec) becomes a kConnected
  // event with `prepared` set, if it comes before `deadline` from a process of that uid.
  // One connection per announcement; after the deadline the pid is judged by the other
  // rules again (a new pid is refused). A second announcement replaces the first.
  void expect_exec(pid_t pid, uid_t uid, std::chrono::steady_clock::time_point deadline);
  // The announced processes whose deadline passed with no connection since the last call
  // (each once; at most a thousand kept between calls).
  std::vector<pid_t> lapsed_execs();
  // Spare area `id` (SPARE) was handed to process `owner`: a fork child of it that names
  // the id in its HELLO is let in even when it is gone by then (see Admission). Withdrawn
  // when taken or dropped.
  void offer_spare(uint32_t id, pid_t owner);
  void withdraw_spare(uint32_t id);
  // Waits for the link of an expected pid. nullptr and *err = -ETIMEDOUT when none came in
  // time; the expectation stays until unexpect() or a connection.
  std::shared_ptr<AgentLink> wait_for(pid_t pid, std::chrono::milliseconds timeout, int* err);

  // The next event, waiting at most `timeout` (zero: do not wait). False when none.
  bool next_event(LinkEvent* out, std::chrono::milliseconds timeout);
  // Readable (poll/epoll) while events are queued.
  int event_fd() const;

  // The links that are open now.
  std::vector<std::shared_ptr<AgentLink>> links() const;

  ListenerStats stats() const;

  static constexpr std::chrono::milliseconds kHelloTimeout{5000};
  static constexpr size_t kMaxPendingPerUid = 32;
  static constexpr std::chrono::milliseconds kAcceptPause{100};
  // Connections one endpoint may hand over per wake-up before the others are served.
  static constexpr int kAcceptBatch = 16;
  static constexpr int kMaxMappedInFlight = 8;
  static constexpr int kMaxProtocolErrors = 64;

 private:
  struct Impl;
  explicit AgentListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace probefs::tracee
