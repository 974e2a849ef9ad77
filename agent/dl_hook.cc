// Libraries loaded later: the dynamic linker calls the function at r_debug.r_brk
// (_dl_debug_state, an empty function that debuggers break on) with r_state RT_ADD before
// it maps new objects, and again with RT_CONSISTENT once they are mapped and in the link
// map, before it relocates them and runs their constructors. That second call is where the
// daemon must place the probes that now resolve, so that none of the new code runs
// unprobed (kernel uprobes: the moment of mmap).
//
// Handlers run inside the engine's RCU read-side section, and registering a probe waits
// for a grace period, so the hook cannot ask the daemon from its handler. Instead:
//
//   dlopen thread                    hook probe (int3)            control thread
//   call _dl_debug_state  -------->  pre_handler: ip = stub,
//                                    return 1 (skip the function)
//   probefs_agent_dl_stub():
//     send MAPPED(seq S) ---------------------------------------> daemon
//     wait (bounded) for the mailbox  <------------------------- DEFINE(kFlagAnswer)...,
//                                                                REPLY(S): put in mailbox
//     apply each DEFINE under g_ctl_mu, REPLY to each
//     return to _dl_debug_state's caller
//
// The stub runs in the thread that called dlopen, which holds the dynamic linker's
// recursive lock: it does the registrations itself instead of handing them to a thread
// that might need that lock (dlopen, dlsym, dladdr, a new thread's TLS). The engine
// itself only calls dl_iterate_phdr, whose lock the linker does not hold here.
//
// dlclose: RT_DELETE, then RT_CONSISTENT once the objects are gone: MAPPED kUnmapped (the
// engine marks their probes [GONE] on its next operation).
#include <dlfcn.h>
#include <link.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <vector>

#include "agent/agent.h"
#include "agent/symbols.h"

namespace probefs::agent {

namespace {

// How long a loading thread waits for the daemon's answer.
constexpr auto kAnswerTimeout = std::chrono::seconds(10);

// The agent's state is never destroyed: its threads may run on while exit() runs the
// static destructors (the hook stays registered until teardown, whenever that is).
probecore::Kprobe* g_hook = nullptr;  // g_ctl_mu
bool g_hook_registered = false;  // g_ctl_mu
uintptr_t g_hook_addr = 0;     // g_ctl_mu

// r_state at the previous call, to tell a load from an unload. The dynamic linker calls
// r_brk with its lock held, so one thread at a time.
int g_last_state = r_debug::RT_CONSISTENT;

struct Mailbox {
  bool active = false;   // a MAPPED exchange is in flight
  bool done = false;     // its REPLY came
  bool closed = false;   // the link ended
  uint32_t seq = 0;
  std::vector<lk::Message> answers;  // DEFINEs with kFlagAnswer, in order
};
std::mutex g_mail_mu;
std::condition_variable& g_mail_cv = *new std::condition_variable;
Mailbox& g_mail = *new Mailbox;  // g_mail_mu
// One per link (dl_mailbox_open): an exchange of an earlier link that still waits when the
// next link opens the mailbox again must see its own link's end, not the new link's empty
// mailbox, or it waits kAnswerTimeout with the dynamic linker's lock held, which the new
// link's attach needs.
uint64_t g_mail_link = 0;  // g_mail_mu
bool g_mail_reader = false;  // g_mail_mu: the current link's control thread exists

void exchange(lk::MappedKind kind) {
  const uint32_t seq = next_agent_seq();
  uint64_t link_of_exchange = 0;
  {
    std::lock_guard l(g_mail_mu);
    if (g_mail.active || g_mail.closed || !g_mail_reader) return;
    g_mail = Mailbox{};
    g_mail.active = true;
    g_mail.seq = seq;
    link_of_exchange = g_mail_link;
  }
  lk::Message m;
  m.type = lk::MsgType::kMapped;
  m.seq = seq;
  m.body = lk::Mapped{kind};
  std::vector<lk::Message> answers;
  if (send_on_link(m) == 0) {
    std::unique_lock l(g_mail_mu);
    g_mail_cv.wait_for(l, kAnswerTimeout, [&] {
      return g_mail.done || g_mail.closed || g_mail_link != link_of_exchange;
    });
    // After the link ended the agent has removed every probe: nothing more goes in.
    if (g_mail_link == link_of_exchange) {
      if (!g_mail.closed) answers.swap(g_mail.answers);
      g_mail.active = false;
    }
  } else {
    std::lock_guard l(g_mail_mu);
    if (g_mail_link == link_of_exchange) g_mail.active = false;
  }
  for (const lk::Message& a : answers) {
    lk::Message r;
    r.type = lk::MsgType::kReply;
    r.seq = a.seq;
    lk::Reply reply;
    {
      std::lock_guard l(g_ctl_mu);
      if (!control_thread_running()) return;  // the link ended meanwhile
      handle_request(a, -1, &reply);
    }
    r.body = std::move(reply);
    (void)send_on_link(r);
  }
}

}  // namespace

int install_dl_hook() {
  if (g_hook_registered) return 0;
  const uintptr_t brk = _r_debug.r_brk;
  if (brk == 0) return -ENOENT;
  // The function's extent from the dynamic linker's symbol table: the engine checks the
  // probe's instruction boundary against it.
  Dl_info info{};
  void* symp = nullptr;
  probecore::FunctionBounds bounds;
  bounds.start = brk;
  bounds.end = brk + 1;
  std::string module;
  if (dladdr1(reinterpret_cast<void*>(brk), &info, &symp, RTLD_DL_SYMENT) != 0) {
    const auto* sym = static_cast<const ElfW(Sym)*>(symp);
    if (sym && info.dli_saddr == reinterpret_cast<void*>(brk) && sym->st_size > 0)
      bounds.end = brk + sym->st_size;
    if (info.dli_fname) {
      const char* slash = std::strrchr(info.dli_fname, '/');
      module = slash ? slash + 1 : info.dli_fname;
    }
  }
  defined_symbols().add(brk, "_dl_debug_state", module, brk, bounds);
  auto hook = std::make_unique<probecore::Kprobe>();
  hook->addr = brk;
  hook->bounds = bounds;
  hook->pre_handler = dl_hook_pre_handler;
  hook->post_handler = dl_hook_post_handler;
  hook->flags = probecore::KPROBE_FLAG_GPR_ONLY;
  const int rc = probecore::register_kprobe(hook.get());
  if (rc != 0) {
    defined_symbols().remove(brk);
    return rc;
  }
  g_hook = hook.release();
  g_hook_addr = brk;
  g_hook_registered = true;
  return 0;
}

void remove_dl_hook() {
  if (!g_hook_registered) return;
  (void)probecore::unregister_kprobe(g_hook);
  delete g_hook;  // the engine waited for a grace period: no handler runs it
  g_hook = nullptr;
  defined_symbols().remove(g_hook_addr);
  g_hook_registered = false;
}

uintptr_t dl_hook_address() { return g_hook_registered ? g_hook_addr : 0; }

bool dl_mailbox_offer(const lk::Message& m) {
  std::lock_guard l(g_mail_mu);
  if (!g_mail.active) return false;
  if (m.type == lk::MsgType::kDefine && (m.flags & lk::kFlagAnswer)) {
    g_mail.answers.push_back(m);
    return true;
  }
  if (m.type == lk::MsgType::kReply && m.seq == g_mail.seq) {
    g_mail.done = true;
    g_mail_cv.notify_all();
    return true;
  }
  return false;
}

void dl_mailbox_close() {
  std::lock_guard l(g_mail_mu);
  g_mail.closed = true;
  g_mail_cv.notify_all();
}

void dl_mailbox_open() {
  std::lock_guard l(g_mail_mu);
  g_mail = Mailbox{};
  ++g_mail_link;
  g_mail_reader = false;
  g_mail_cv.notify_all();
}

void dl_mailbox_reader_created() {
  std::lock_guard l(g_mail_mu);
  g_mail_reader = true;
}

void dl_mailbox_lock_for_fork() { g_mail_mu.lock(); }

void dl_mailbox_unlock_after_fork() { g_mail_mu.unlock(); }

extern "C" void probefs_agent_dl_stub() {
  const int saved_errno = errno;
  const int state = static_cast<int>(__atomic_load_n(&_r_debug.r_state, __ATOMIC_ACQUIRE));
  const int last = g_last_state;
  g_last_state = state;
  if (state == r_debug::RT_CONSISTENT && control_thread_running()) {
    const bool was = probecore::set_engine_thread(true);
    exchange(last == r_debug::RT_DELETE ? lk::MappedKind::kUnmapped : lk::MappedKind::kMapped);
    probecore::set_engine_thread(was);
  }
  errno = saved_errno;
}

}  // namespace probefs::agent
