// The agent's control plane: each request of the daemon applied to the engine, the ring
// area mapped and replaced, LIST and PROFILE, and the teardown that leaves the program
// untraced. Runs on whichever thread holds g_ctl_mu (agent.h); never on the hit path.
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "agent/agent.h"
#include "agent/signal_guard.h"
#include "agent/symbols.h"
#include "arch/branch_targets.h"
#include "arch/self_memory.h"
#include "probecore/rcu.h"

namespace probefs::agent {

std::mutex g_ctl_mu;

namespace {

// A record holds at most this much (the kernel's events are bounded by a page): strings
// are cut to fit what is left after the fixed part. A definition whose fixed part alone is
// larger gets that much.
constexpr uint32_t kMaxRecordBytes = 4096;

struct AgentProbe {
  uint32_t id = 0;
  bool is_return = false;
  std::unique_ptr<HitProbe> hit;
  events::FetchProgram program;                  // hit->view points into it
  std::unique_ptr<events::CompiledFilter> filter;  // what hit->filter points to
  std::unique_ptr<HitHists> hists;                 // what hit->hists points to
  std::unique_ptr<HitTriggers> triggers;           // what hit->triggers points to
  std::unique_ptr<HitInstanceFilters> instance_filters;  // hit->instance_filters
  // Its reference counter (DEFINE's ref_ctr: an SDT semaphore), and whether this probe
  // holds one of its counts now (while it is enabled, as the kernel's uprobes hold it).
  uintptr_t ref_ctr = 0;
  bool ref_held = false;
};

// One count more (hold) or one less of the probe's reference counter. Read and written
// by system call: an address no longer mapped (its object closed) changes nothing and
// never faults. Programs only read their semaphores; the agent's control thread is the
// one writer here.
void hold_ref_ctr(AgentProbe* ap, bool hold) {
  if (ap->ref_ctr == 0 || ap->ref_held == hold) return;
  ap->ref_held = hold;
  uint16_t v = 0;
  if (!arch::read_self_memory_all(ap->ref_ctr, &v, sizeof v)) return;
  if (hold) ++v;
  else if (v != 0) --v;
  (void)arch::write_self_memory_all(ap->ref_ctr, &v, sizeof v);
}

// Never destroyed, like all the agent's state: the control thread (detached) may still
// be tearing down while exit() runs the process's static destructors.
std::map<uint32_t, std::unique_ptr<AgentProbe>>& g_probes =
    *new std::map<uint32_t, std::unique_ptr<AgentProbe>>;  // g_ctl_mu
uint32_t g_area_generation = 0;                             // g_ctl_mu
// Start-up (a launched, exec'd or fork child program, until GO): the program runs none of
// its own code yet, so the probes defined meanwhile are registered disabled and enabled
// together at GO, in one write window for all (each window scans the threads and waits
// for every CPU) rather than one each.
bool g_starting = false;                          // g_ctl_mu
bool g_start_guards_due = false;                  // g_ctl_mu
std::vector<uint32_t>& g_startup_enable = *new std::vector<uint32_t>;  // g_ctl_mu: probe ids
AreaState* g_area_owned = nullptr;                          // g_ctl_mu: what g_area holds
bool g_control_mapped = false;  // g_ctl_mu: g_control is a mapping of ours (CONTROL)

bool program_reads_comm(const events::FetchProgram& p) {
  return std::any_of(p.insns.begin(), p.insns.end(),
                     [](const events::FetchInsn& i) { return i.op == events::FetchOp::kComm; });
}

bool filter_reads_comm(const events::CompiledFilter* f) {
  return f && std::any_of(f->insns.begin(), f->insns.end(), [](const events::FilterInsn& i) {
           return i.kind == events::FilterInsn::kPred && i.source == events::FilterInsn::kComm;
         });
}

void set_error(lk::Reply* r, int err, std::string msg) {
  r->error = err;
  r->message = std::move(msg);
}

std::string errno_text(const char* what, int rc) {
  return std::string(what) + ": " + std::strerror(-rc);
}

probecore::FunctionBounds to_bounds(const lk::Bounds& b) {
  probecore::FunctionBounds f;
  f.start = b.start;
  f.end = b.end;
  f.landing_pads.assign(b.landing_pads.begin(), b.landing_pads.end());
  f.related = b.related;
  return f;
}

void unmap_area(AreaState* as) {
  if (!as) return;
  for (HistSlot& h : as->hist)
    if (uint8_t* base = h.base.load(std::memory_order_relaxed)) ::munmap(base, h.bytes);
  ::munmap(as->area, as->size);
  if (as->producers) ::munmap(as->producers, as->producer_bytes);
  delete as;
}

// Publishes `as` (or nullptr) as the area and waits until no handler uses the old one.
void replace_area(AreaState* as) {
  AreaState* old = g_area_owned;
  g_area_owned = as;
  g_area.store(as, std::memory_order_release);
  if (old) {
    probecore::synchronize_rcu();
    unmap_area(old);
  }
}

// The ring area of a SETUP or SPARE, mapped and checked; nullptr (and the reply says
// why) when it is not one.
AreaState* map_area(const lk::Setup& s, int fd, lk::Reply* reply) {
  if (fd < 0) {
    set_error(reply, -EBADF, "no descriptor came with the ring area");
    return nullptr;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    set_error(reply, -errno, "fstat of the ring area failed");
    return nullptr;
  }
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < s.area_size) {
    set_error(reply, -EINVAL, "the ring area is smaller than the request says");
    return nullptr;
  }
  void* mem = ::mmap(nullptr, s.area_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    set_error(reply, -errno, "mmap of the ring area failed");
    return nullptr;
  }
  auto* header = static_cast<events::RingAreaHeader*>(mem);
  if (!events::ring_area_header_valid(header, s.area_size)) {
    ::munmap(mem, s.area_size);
    set_error(reply, -EINVAL, "the ring area's header is not valid");
    return nullptr;
  }
  auto* as = new AreaState;
  as->area = header;
  as->size = s.area_size;
  // Untouched zero pages until a thread claims its ring (hit.cc): most are never claimed,
  // and a process start would fault in all of them.
  as->producer_bytes = std::max<size_t>(header->ring_count, 1) * sizeof(events::RingProducer);
  void* producers = ::mmap(nullptr, as->producer_bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (producers == MAP_FAILED) {
    const int err = -errno;
    ::munmap(mem, s.area_size);
    delete as;
    set_error(reply, err, "no memory for the ring producers");
    return nullptr;
  }
  as->producers = static_cast<events::RingProducer*>(producers);
  as->generation = ++g_area_generation;
  if (as->generation == 0) as->generation = ++g_area_generation;  // 0 is a thread's "none"
  as->pid = static_cast<int32_t>(::getpid());
  as->syscall_reads = (s.options & lk::kSetupSyscallReads) != 0;
  as->rseq_cpu = events::ring_rseq_cpu_offset();
  as->fault_tolerant = !as->syscall_reads && fault_fixup_installed();
  // Lets the reader sleep without a fence in every commit (events/ring.h).
  (void)events::ring_register_producer_process();
  return as;
}

// Spare areas (SPARE), held for the next fork children, oldest first; nobody records into
// them here. Two, so that a process forking back to back finds one while the daemon is
// still making the next.
//
// Fork handlers make no system call for areas: a view that is no one's here any more (a
// spare a fork child took, in the parent; its parent's area and spares, in the child)
// goes on the leftover list, unmapped at the next SETUP or SPARE, or with the process.
// No handler can be in one: the parent never used its spare, and the child switched
// areas while it was its only thread.
constexpr size_t kMaxSpares = lk::kMaxHeldSpares;
struct HeldSpare {
  AreaState* as = nullptr;
  uint32_t id = 0;
};
HeldSpare g_spares[kMaxSpares];
size_t g_spare_count = 0;
constexpr size_t kMaxLeftovers = 8;
AreaState* g_leftovers[kMaxLeftovers];
size_t g_leftover_count = 0;

void leave(AreaState* as) {
  if (!as) return;
  if (g_leftover_count == kMaxLeftovers) {
    unmap_area(as);  // never in practice: each SETUP or SPARE empties the list
    return;
  }
  g_leftovers[g_leftover_count++] = as;
}

void release_leftovers() {
  for (size_t i = 0; i < g_leftover_count; ++i) unmap_area(g_leftovers[i]);
  g_leftover_count = 0;
}

HeldSpare pop_spare() {
  HeldSpare first = g_spares[0];
  for (size_t i = 1; i < g_spare_count; ++i) g_spares[i - 1] = g_spares[i];
  g_spares[--g_spare_count] = {};
  return first;
}

void drop_spare() {
  while (g_spare_count > 0) unmap_area(pop_spare().as);
  release_leftovers();
}

void do_setup(const lk::Setup& s, int fd, lk::Reply* reply) {
  if (AreaState* as = map_area(s, fd, reply)) {
    replace_area(as);
    drop_spare();  // of the old size: the daemon hands new ones
  }
}

// The agent's read-only mappings (its code, its constant data), each given a page of its
// own (arch::own_a_page_of) so that fork children get their page table entries: a fork
// child runs the agent's fork path without a fault per 64 KB of code. Once, when the
// process first forks (its first SPARE): a process that never forks pays nothing.
bool g_agent_pages_owned = false;

int own_agent_segment(dl_phdr_info* info, size_t, void* self) {
  const auto here = reinterpret_cast<uintptr_t>(self);
  bool ours = false;
  for (int i = 0; i < info->dlpi_phnum && !ours; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    ours = ph.p_type == PT_LOAD && lo <= here && here < lo + ph.p_memsz;
  }
  if (!ours) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_W) || ph.p_memsz == 0) continue;
    (void)arch::own_a_page_of(info->dlpi_addr + ph.p_vaddr + ph.p_memsz - 1);
  }
  return 1;
}

void own_agent_pages() {
  if (g_agent_pages_owned) return;
  g_agent_pages_owned = true;
  dl_iterate_phdr(own_agent_segment, reinterpret_cast<void*>(&own_agent_pages));
}

// The histogram tables of spares to come: the daemon sends a spare's tables ahead of its
// SPARE, so that no fork child can take the spare before they are in it.
struct PendingTable {
  uint32_t spare_id = 0;
  uint32_t slot = 0;
  uint8_t* base = nullptr;
  uint64_t signature = 0;
  uint32_t rings = 0;
  uint64_t bytes = 0;
};
constexpr size_t kMaxPendingTables = 2 * events::kHistMaxSlots;
PendingTable g_pending_tables[kMaxPendingTables];
size_t g_pending_count = 0;

void drop_pending_tables(uint32_t below_id) {
  size_t kept = 0;
  for (size_t i = 0; i < g_pending_count; ++i) {
    if (g_pending_tables[i].spare_id < below_id) ::munmap(g_pending_tables[i].base, g_pending_tables[i].bytes);
    else g_pending_tables[kept++] = g_pending_tables[i];
  }
  g_pending_count = kept;
}

void do_spare(const lk::Spare& sp, int fd, lk::Reply* reply) {
  AreaState* as = map_area(sp.setup, fd, reply);
  if (!as) return;
  size_t kept = 0;
  for (size_t i = 0; i < g_pending_count; ++i) {
    const PendingTable& t = g_pending_tables[i];
    if (t.spare_id != sp.id) {
      g_pending_tables[kept++] = t;
      continue;
    }
    HistSlot& slot = as->hist[t.slot];
    if (uint8_t* old = slot.base.load(std::memory_order_relaxed)) ::munmap(old, slot.bytes);
    slot.signature = t.signature;
    slot.rings = t.rings;
    slot.bytes = t.bytes;
    slot.base.store(t.base, std::memory_order_relaxed);  // nobody records here yet
  }
  g_pending_count = kept;
  drop_pending_tables(sp.id);  // of spares that never came
  own_agent_pages();
  release_leftovers();
  if (g_spare_count == kMaxSpares) unmap_area(pop_spare().as);  // let go by the daemon
  g_spares[g_spare_count++] = {as, sp.id};
}

// BRANCHES: the daemon's branch table of one mapping (arch/branch_targets.h), mapped for
// the life of the process and handed to the engine. Only a memfd that nobody can change
// any more (sealed against writing, growing, shrinking), of a size the mapping's table can
// have; the engine checks the count inside against that size, and bounds how many it
// keeps.
void do_branches(const lk::Branches& b, int fd, lk::Reply* reply) {
  if (fd < 0) return set_error(reply, -EBADF, "BRANCHES without the table's descriptor");
  constexpr int kSeals = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals)
    return set_error(reply, -EINVAL, "the branch table is not sealed");
  // Its bits, a count and at most one candidate per byte of the mapping.
  const uint64_t max_bytes = (arch::branch_table_words(b.length) + 1 + b.length) * 8;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || st.st_size % 8 != 0 ||
      static_cast<uint64_t>(st.st_size) > max_bytes)
    return set_error(reply, -EINVAL, "the branch table's size does not fit the mapping");
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* mem = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return set_error(reply, -errno, "mmap of the branch table failed");
  const arch::MappingKey key{b.dev_major, b.dev_minor, b.inode, b.offset, b.length};
  if (!arch::provide_branch_table(key, static_cast<const uint64_t*>(mem), bytes / 8)) {
    ::munmap(mem, bytes);
    return set_error(reply, -EINVAL, "the branch table does not fit the mapping, or is one too many");
  }
}

// UNWIND: the daemon's unwind table of one mapping (arch/unwind_table.h), mapped for the
// life of the process once it is sealed and checked row by row.
void do_unwind(const lk::Unwind& u, int fd, lk::Reply* reply) {
  if (fd < 0) return set_error(reply, -EBADF, "UNWIND without the table's descriptor");
  constexpr int kSeals = F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals)
    return set_error(reply, -EINVAL, "the unwind table is not sealed");
  struct stat st;
  const uint64_t most = arch::unwind_table_bytes(u.end - u.start, arch::unwind_buckets(u.end - u.start));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      static_cast<uint64_t>(st.st_size) > most)
    return set_error(reply, -EINVAL, "the unwind table's size does not fit the mapping");
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* mem = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return set_error(reply, -errno, "mmap of the unwind table failed");
  arch::UnwindTableView view;
  if (!arch::unwind_table_view(mem, bytes, u.start, u.end, &view)) {
    ::munmap(mem, bytes);
    return set_error(reply, -EINVAL, "the unwind table is malformed");
  }
  if (!add_unwind_table(view)) {
    ::munmap(mem, bytes);
    return set_error(reply, -ENOSPC, "the agent keeps no more unwind tables");
  }
}

// Whether every argument is a register (or $retval) stored as it is, and if so the
// stores the handler does for it (HitProbe::fast_args). Decided once here, so that the
// handler of the most common definitions runs no interpreter.
void set_fast_path(const events::FetchProgram& p, HitProbe* h) {
  using events::FetchOp;
  h->fast = false;
  if (p.nargs > HitProbe::kMaxFastArgs || p.insns.size() != size_t{p.nargs} * 3) return;
  for (uint32_t a = 0; a < p.nargs; ++a) {
    const events::FetchInsn* in = &p.insns[size_t{a} * 3];
    uint32_t reg;
    if (in[0].op == FetchOp::kReg) reg = in[0].param;
    else if (in[0].op == FetchOp::kRetval) reg = offsetof(PtRegs, ax);
    else return;
    if (in[1].op != FetchOp::kStRaw || in[2].op != FetchOp::kEnd) return;
    const uint32_t size = in[1].size, at = in[1].param;
    if (reg > sizeof(PtRegs) - 8 || (size != 1 && size != 2 && size != 4 && size != 8) ||
        at + size > p.fixed_size || at > 0xffff)
      return;
    h->fast_args[a] = reg | size << 8 | at << 16;
  }
  h->fast_nargs = static_cast<uint8_t>(p.nargs);
  h->fast = p.fixed_size >= p.header_size && p.fixed_size <= h->record_cap;
}

// LIST_CHANGED (events/link.h). The daemon keeps the text of each agent's LIST and asks
// again only when something may have changed it: its own requests it knows of; what the
// engine's optimizer thread changes on its own (a jmp written on a retry) the agent tells
// it with this notice. Sent from the optimizer thread without waiting for room in the
// socket (it must never stall the optimizer, nor a fork that waits for the send lock); a
// notice that found no room is sent before the reply to the daemon's next request, so
// the daemon hears of it before it could take an old text for current. Only while an
// area is in place, that is once SETUP came on the current link: a fork child's first
// packet must be its HELLO, and a link that ended has no one to tell.
std::atomic<bool> g_list_notice_due{false};  // a change not told yet

void send_list_notice() {
  if (g_area.load(std::memory_order_acquire) == nullptr) return;
  if (!g_list_notice_due.exchange(false)) return;
  lk::Message m;
  m.type = lk::MsgType::kListChanged;
  m.seq = next_agent_seq();
  if (send_on_link_now(m) != 0) g_list_notice_due.store(true);
}

// The engine's notifier (probecore::set_kprobes_list_notifier), set with the first
// probe: its optimizer thread, no lock of the engine's held.
void list_changed() {
  g_list_notice_due.store(true);
  send_list_notice();
}

void do_define(const lk::Message& m, lk::Reply* reply) {
  const auto& d = std::get<lk::Define>(m.body);
  if (g_probes.count(d.probe_id))
    return set_error(reply, -EEXIST, "probe id " + std::to_string(d.probe_id) + " exists");
  auto ap = std::make_unique<AgentProbe>();
  ap->id = d.probe_id;
  ap->is_return = d.kind == lk::ProbeKind::kReturn;
  ap->program = d.program;
  if (d.filter) ap->filter = std::make_unique<events::CompiledFilter>(*d.filter);
  ap->hit = std::make_unique<HitProbe>();
  HitProbe& h = *ap->hit;
  h.view = events::view_of(ap->program);
  h.filter.store(ap->filter.get(), std::memory_order_relaxed);
  h.address = d.address;
  h.counter_slot = d.counter_slot;
  h.event_id = d.event_id;
  const uint32_t most = ap->program.max_record_size();
  h.record_cap = std::max(ap->program.fixed_size, std::min(most, kMaxRecordBytes));
  h.needs_comm = program_reads_comm(ap->program) || filter_reads_comm(ap->filter.get());
  set_fast_path(ap->program, &h);
  probecore::Kprobe& kp = h.rp.kp;
  kp.addr = d.address;
  kp.bounds = to_bounds(d.bounds);
  kp.flags = probecore::KPROBE_FLAG_GPR_ONLY;
  const bool at_go = g_starting && d.enabled;
  if (!d.enabled || at_go) kp.flags |= probecore::KPROBE_FLAG_DISABLED;
  kp.miss_handler = probe_missed;  // the kretprobe's misses too (kp is its entry probe)
  static const bool notifier_set = (probecore::set_kprobes_list_notifier(list_changed), true);
  (void)notifier_set;
  if (!d.symbol.empty())
    defined_symbols().add(d.address, d.symbol, d.module, d.symbol_addr, kp.bounds);
  int rc;
  if (ap->is_return) {
    h.rp.handler = return_handler;
    if (ap->program.entry_args) h.rp.entry_handler = return_entry_handler;
    h.rp.maxactive = static_cast<int>(d.maxactive);
    h.rp.data_size = size_t{ap->program.entry_args} * 8;
    rc = probecore::register_kretprobe(&h.rp);
  } else {
    kp.pre_handler = entry_pre_handler;
    rc = probecore::register_kprobe(&kp);
  }
  if (rc != 0) {
    if (!d.symbol.empty()) defined_symbols().remove(d.address);
    return set_error(reply, rc, errno_text(ap->is_return ? "register_kretprobe" : "register_kprobe", rc));
  }
  ap->ref_ctr = static_cast<uintptr_t>(d.ref_ctr);
  if (d.enabled) hold_ref_ctr(ap.get(), true);  // before GO too: the program runs nothing yet
  g_probes[d.probe_id] = std::move(ap);
  if (at_go) g_startup_enable.push_back(d.probe_id);
}

}  // namespace

void begin_startup() {
  g_starting = true;
  g_start_guards_due = true;
}

namespace {

// The guards came after SETUP: fetch reads go through the fault fixup from now on.
void refresh_fault_tolerance() {
  if (AreaState* as = g_area_owned)
    as->fault_tolerant = !as->syscall_reads && fault_fixup_installed();
}

}  // namespace

// The guards of a process that starts go in at GO, after SETUP and BRANCHES (the guards'
// jmps are the first the optimizer places in libc, and the daemon's table of libc spares
// the process a sweep of it), on the program's own thread (the guards adopt its mask),
// in one write window with the probes defined meanwhile: each window scans the threads
// and waits for every CPU. A fork child has its parent's: that only reconciles.
void end_startup() {
  if (!g_starting) return;
  g_starting = false;
  std::vector<probecore::Kprobe*> kps;
  for (uint32_t id : g_startup_enable)
    if (auto it = g_probes.find(id); it != g_probes.end()) kps.push_back(&it->second->hit->rp.kp);
  g_startup_enable.clear();
  if (g_start_guards_due) {
    g_start_guards_due = false;
    (void)install_guards(kps.data(), static_cast<int>(kps.size()));
    refresh_fault_tolerance();
  } else if (!kps.empty()) {
    (void)probecore::enable_kprobes(kps.data(), static_cast<int>(kps.size()));
  }
}

namespace {

AgentProbe* find_probe(uint32_t id, lk::Reply* reply) {
  auto it = g_probes.find(id);
  if (it == g_probes.end()) {
    set_error(reply, -ENOENT, "no probe " + std::to_string(id));
    return nullptr;
  }
  return it->second.get();
}

void unregister_all(std::vector<AgentProbe*> probes) {
  std::vector<probecore::Kprobe*> kps;
  std::vector<probecore::Kretprobe*> rps;
  for (AgentProbe* ap : probes) {
    if (ap->is_return) rps.push_back(&ap->hit->rp);
    else kps.push_back(&ap->hit->rp.kp);
  }
  if (!kps.empty()) probecore::unregister_kprobes(kps.data(), static_cast<int>(kps.size()));
  if (!rps.empty()) probecore::unregister_kretprobes(rps.data(), static_cast<int>(rps.size()));
}

void do_remove(uint32_t id, lk::Reply* reply) {
  AgentProbe* ap = find_probe(id, reply);
  if (!ap) return;
  std::erase(g_startup_enable, id);
  int rc = ap->is_return ? probecore::unregister_kretprobe(&ap->hit->rp)
                         : probecore::unregister_kprobe(&ap->hit->rp.kp);
  if (rc != 0) return set_error(reply, rc, errno_text("unregister", rc));
  // The engine waited for a grace period: no handler of this probe runs any more.
  hold_ref_ctr(ap, false);
  defined_symbols().remove(ap->hit->address);
  g_probes.erase(id);
}

void do_enable(uint32_t id, bool on, lk::Reply* reply) {
  AgentProbe* ap = find_probe(id, reply);
  if (!ap) return;
  if (g_starting) {  // waits for GO, or no longer
    if (!on) std::erase(g_startup_enable, id);
    else if (std::find(g_startup_enable.begin(), g_startup_enable.end(), id) ==
             g_startup_enable.end())
      g_startup_enable.push_back(id);
    hold_ref_ctr(ap, on);
    return;
  }
  int rc;
  if (ap->is_return)
    rc = on ? probecore::enable_kretprobe(&ap->hit->rp) : probecore::disable_kretprobe(&ap->hit->rp);
  else
    rc = on ? probecore::enable_kprobe(&ap->hit->rp.kp) : probecore::disable_kprobe(&ap->hit->rp.kp);
  if (rc != 0) return set_error(reply, rc, errno_text(on ? "enable" : "disable", rc));
  hold_ref_ctr(ap, on);
}

void do_set_filter(const lk::SetFilter& s, lk::Reply* reply) {
  AgentProbe* ap = find_probe(s.probe_id, reply);
  if (!ap) return;
  std::unique_ptr<events::CompiledFilter> next;
  if (s.filter) next = std::make_unique<events::CompiledFilter>(*s.filter);
  // needs_comm only grows while the probe lives: a handler that reads it as set while the
  // old filter is still in place merely reads the name once too often.
  if (filter_reads_comm(next.get()))
    __atomic_store_n(&ap->hit->needs_comm, true, __ATOMIC_RELEASE);
  ap->hit->filter.store(next.get(), std::memory_order_release);
  probecore::synchronize_rcu();  // no handler still evaluates the old one
  ap->filter = std::move(next);
}

// ---- histograms ----

// HIST_TABLE: maps (or lets go) the tables of one histogram slot for the current area or
// a spare one.
void do_hist_table(const lk::HistTable& h, int fd, lk::Reply* reply) {
  AreaState* as = g_area_owned;
  if (h.spare_id != 0) {
    as = nullptr;
    for (size_t i = 0; i < g_spare_count; ++i)
      if (g_spares[i].id == h.spare_id) as = g_spares[i].as;
  }
  if (as == nullptr && h.spare_id == 0) return set_error(reply, -ENOENT, "no ring area");
  if (as == nullptr && h.release) return;  // a spare taken or let go since: nothing held
  if (as == nullptr && g_pending_count == kMaxPendingTables)
    return set_error(reply, -ENOSPC, "too many histogram tables wait for their spare");
  HistSlot pending;
  HistSlot& slot = as ? as->hist[h.slot] : pending;
  if (uint8_t* old = slot.base.load(std::memory_order_relaxed)) {
    slot.base.store(nullptr, std::memory_order_release);
    // No handler counts into the old tables any more (nobody records into a spare).
    if (as == g_area_owned) probecore::synchronize_rcu();
    ::munmap(old, slot.bytes);
  }
  if (h.release) return;
  if (fd < 0) return set_error(reply, -EBADF, "no descriptor came with the histogram's tables");
  const uint64_t bytes = h.geometry.memfd_bytes(h.rings);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < bytes)
    return set_error(reply, -EINVAL, "the histogram's tables are smaller than the request says");
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return set_error(reply, -errno, "mmap of a histogram's tables failed");
  if (as == nullptr) {  // a spare that comes next
    g_pending_tables[g_pending_count++] = {h.spare_id, h.slot, static_cast<uint8_t*>(mem),
                                           h.geometry.signature(), h.rings, bytes};
    return;
  }
  slot.signature = h.geometry.signature();
  slot.rings = h.rings;
  slot.bytes = bytes;
  slot.base.store(static_cast<uint8_t*>(mem), std::memory_order_release);
}

// Whether `o` reads only inside the fixed part of a record of `fixed` bytes.
bool operand_fits(const events::HistOperand& o, uint32_t fixed) {
  if (o.source != events::HistSource::kNumber && o.source != events::HistSource::kString)
    return true;  // the CPU, the time, a variable, a reference, a constant
  const uint32_t size = o.source == events::HistSource::kString ? 4 : o.size;
  return o.offset <= fixed && size <= fixed - o.offset;
}

bool filter_reads_cpu(const std::optional<events::CompiledFilter>& f) {
  return f && std::any_of(f->insns.begin(), f->insns.end(), [](const events::FilterInsn& in) {
           return in.kind == events::FilterInsn::kPred && in.source == events::FilterInsn::kCpu;
         });
}

// The histograms of SET_HIST as the handlers read them, checked against records of
// `fixed` bytes; nullptr (and the reply's error) when an operand lies outside.
std::unique_ptr<HitHists> make_hit_hists(const lk::SetHist& s, uint32_t fixed, lk::Reply* reply) {
  auto next = std::make_unique<HitHists>();
  next->clock = s.clock;
  for (size_t i = 0; i < s.programs.size(); ++i) {
    const events::HistProgram& p = s.programs[i];
    bool fits = true;
    for (uint32_t k = 0; k < p.nkeys; ++k) fits = fits && operand_fits(p.keys[k], fixed);
    for (uint32_t v = 0; v < p.nvals; ++v) fits = fits && operand_fits(p.vals[v], fixed);
    for (uint32_t v = 0; v < p.nvars; ++v)
      fits = fits && operand_fits(p.vars[v].a, fixed) && operand_fits(p.vars[v].b, fixed);
    for (uint32_t a = 0; a < p.action.nparams; ++a) fits = fits && operand_fits(p.action.params[a], fixed);
    for (uint32_t a = 0; a < p.track.nsave; ++a) fits = fits && operand_fits(p.track.save[a], fixed);
    if (!fits) {
      set_error(reply, -EINVAL, "a histogram operand lies outside the record");
      return nullptr;
    }
    next->programs[i] = p;
    next->shapes[i] = events::HistShape(s.geometries[i]);
    next->signatures[i] = s.geometries[i].signature();
    next->inter[i] = p.inter_event();
    next->any_inter = next->any_inter || next->inter[i];
    for (uint32_t r = 0; r < p.nrefs; ++r) {
      next->ref_shapes[i][r] = events::HistShape(p.refs[r].geometry);
      next->ref_signatures[i][r] = p.refs[r].geometry.signature();
    }
    if (filter_reads_comm(p.filter ? &*p.filter : nullptr)) next->needs_comm = true;
    for (uint32_t k = 0; k < p.nkeys; ++k)
      if (p.keys[k].source == events::HistSource::kCpu) next->needs_cpu = true;
    for (uint32_t v = 0; v < p.nvals; ++v)
      if (p.vals[v].source == events::HistSource::kCpu) next->needs_cpu = true;
    if (filter_reads_cpu(p.filter)) next->needs_cpu = true;
    // A program that computes variables or an action may read the CPU anywhere.
    if (next->inter[i]) next->needs_cpu = true;
    if (p.wants_stack()) next->needs_stack = true;
  }
  next->n = static_cast<uint32_t>(s.programs.size());
  next->lean = next->n == 1 && !next->any_inter && !next->needs_cpu && !next->needs_stack &&
               !next->needs_comm && !s.programs[0].filter;
  if (next->lean) next->lean_form = events::hist_numbers_form(next->programs[0], next->shapes[0]);
  return next;
}

// The synthetic events' published configurations and the ones replaced, kept until a
// grace period has passed (they are small; a handler may still read a replaced one).
std::unique_ptr<HitSynth> g_synth_owned[kMaxSynthEvents];  // g_ctl_mu

// SET_HIST of a synthetic event: how hist actions write it. No programs, no record and
// no filter: the synthetic event is let go.
void do_set_synth(const lk::SetHist& s, lk::Reply* reply) {
  std::unique_ptr<HitSynth> next;
  if (!s.programs.empty() || s.record) {
    next = std::make_unique<HitSynth>();
    next->event_id = s.synth_id;
    next->size = s.synth_size;
    next->record = s.record;
    next->filter = s.synth_filter;
    if (!s.programs.empty()) {
      std::unique_ptr<HitHists> hh = make_hit_hists(s, s.synth_size, reply);
      if (!hh) return;
      next->hists = *hh;
    }
  }
  int at = -1, free_at = -1;
  for (int i = 0; i < static_cast<int>(kMaxSynthEvents); ++i) {
    const HitSynth* hs = g_synths[i].load(std::memory_order_relaxed);
    if (hs && hs->event_id == s.synth_id) at = i;
    if (!hs && free_at < 0) free_at = i;
  }
  if (at < 0) {
    if (!next) return;
    if (free_at < 0) return set_error(reply, -ENOSPC, "too many synthetic events");
    at = free_at;
  }
  g_synths[at].store(next.get(), std::memory_order_release);
  probecore::synchronize_rcu();  // no handler still writes with the old one
  g_synth_owned[at] = std::move(next);
}

// The triggers of SET_HIST as the handlers read them.
std::unique_ptr<HitTriggers> make_hit_triggers(const lk::SetHist& s) {
  auto next = std::make_unique<HitTriggers>();
  for (const events::TriggerSpec& spec : s.triggers) {
    if (next->n == events::kMaxHitTriggers) break;  // the decoder allows no more
    HitTriggers::One& t = next->t[next->n];
    t.action = spec.action;
    t.target_event = spec.target_event;
    t.count_slot = spec.count_slot;
    t.buffer = spec.buffer % events::kRingMaxBuffers;
    if (spec.filter) {
      next->filters[next->n] = spec.filter;
      t.filter = &*next->filters[next->n];
      next->cond = true;
      if (filter_reads_comm(t.filter)) next->needs_comm = true;
    }
    if (t.action == events::TriggerAction::kTraceOff ||
        t.action == events::TriggerAction::kStackTrace ||
        t.action == events::TriggerAction::kSnapshot)
      next->cond = true;
    ++next->n;
  }
  return next;
}

// HitHists::lean_regs_program: each operand of the lean program mapped to the register
// its field is stored from, when every one is a whole argument of the straight path.
void lean_from_registers(const HitProbe& h, HitHists* hh) {
  events::HistProgram p = hh->programs[0];
  auto remap = [&h](events::HistOperand& o) {
    for (uint32_t a = 0; a < h.fast_nargs && a < HitProbe::kMaxFastArgs; ++a) {
      const uint32_t f = h.fast_args[a];
      if ((f >> 16) != o.offset || ((f >> 8) & 0xff) != o.size) continue;
      o.offset = f & 0xff;  // the register's byte offset in PtRegs
      return true;
    }
    return false;
  };
  for (uint32_t k = 0; k < p.nkeys; ++k)
    if (!remap(p.keys[k])) return;
  for (uint32_t v = 0; v < p.nvals; ++v)
    if (!remap(p.vals[v])) return;
  hh->lean_regs_program = p;
  hh->lean_from_regs = true;
}

// SET_HIST: the histograms a probe's hits count into, its event's triggers, whether it
// records (into the top level's buffer, and into which instances' buffers) and whether it
// is in soft mode.
void do_set_hist(const lk::SetHist& s, lk::Reply* reply) {
  if (s.synth_id != 0) return do_set_synth(s, reply);
  AgentProbe* ap = find_probe(s.probe_id, reply);
  if (!ap) return;
  std::unique_ptr<HitHists> next;
  if (!s.programs.empty()) {
    next = make_hit_hists(s, ap->hit->view.fixed_size, reply);
    if (!next) return;
  }
  std::unique_ptr<HitTriggers> triggers;
  if (!s.triggers.empty()) triggers = make_hit_triggers(s);
  std::unique_ptr<HitInstanceFilters> filters;
  for (uint32_t b = 1; b < s.instance_filters.size() && b < events::kRingMaxBuffers; ++b) {
    if (!s.instance_filters[b]) continue;
    if (!filters) filters = std::make_unique<HitInstanceFilters>();
    filters->storage[b] = s.instance_filters[b];
    filters->filter[b] = &*filters->storage[b];
    if (filter_reads_comm(filters->filter[b])) filters->needs_comm = true;
  }
  HitProbe* h = ap->hit.get();
  // The general path first, then what it reads; back to the straight path only once
  // nothing is left for the general one.
  const bool slow = next || triggers || s.soft != 0 || !s.record || s.instances != 0;
  const bool lean = next && next->lean && !triggers && s.instances == 0 && h->fast &&
                    h->view.fixed_size <= kLeanRecordBytes;
  if (lean && next->lean_form != 0) lean_from_registers(*h, next.get());
  h->lean_hists.store(nullptr, std::memory_order_release);
  if (slow) h->slow.store(true, std::memory_order_release);
  h->record.store(s.record, std::memory_order_relaxed);
  h->instances.store(s.instances, std::memory_order_relaxed);
  h->soft.store(s.soft, std::memory_order_relaxed);
  h->hists.store(next.get(), std::memory_order_release);
  h->triggers.store(triggers.get(), std::memory_order_release);
  h->instance_filters.store(filters.get(), std::memory_order_release);
  if (!slow) h->slow.store(false, std::memory_order_release);
  if (lean) h->lean_hists.store(next.get(), std::memory_order_release);
  probecore::synchronize_rcu();  // no handler still counts or fires with the old sets
  ap->hists = std::move(next);
  ap->triggers = std::move(triggers);
  ap->instance_filters = std::move(filters);
}

// CONTROL: the mount's control page, mapped shared for the life of the process (or until
// another one replaces it: a process handed from one mount to another). It must be a
// memfd of the page's size that cannot shrink: the daemon reads it too.
void do_control(int fd, lk::Reply* reply) {
  if (fd < 0) return set_error(reply, -EBADF, "CONTROL without the page's descriptor");
  const int seals = ::fcntl(fd, F_GET_SEALS);
  struct stat st;
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW) ||
      ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != events::kControlPageBytes)
    return set_error(reply, -EINVAL, "the control page is not one");
  void* mem = ::mmap(nullptr, events::kControlPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return set_error(reply, -errno, "mmap of the control page failed");
  auto* page = static_cast<events::ControlPage*>(mem);
  if (__atomic_load_n(&page->magic, __ATOMIC_RELAXED) != events::kControlMagic) {
    ::munmap(mem, events::kControlPageBytes);
    return set_error(reply, -EINVAL, "the control page's magic is wrong");
  }
  events::ControlPage* old = g_control.exchange(page, std::memory_order_acq_rel);
  if (g_control_mapped) {
    probecore::synchronize_rcu();  // no handler still reads the old page
    ::munmap(old, events::kControlPageBytes);
  }
  g_control_mapped = true;
}

void do_profile(lk::Reply* reply) {
  for (const auto& [id, ap] : g_probes) {
    uint64_t missed = ap->hit->rp.kp.nmissed.load(std::memory_order_relaxed);
    if (ap->is_return) missed += ap->hit->rp.nmissed.load(std::memory_order_relaxed);
    reply->profile.push_back({id, missed});
  }
}

// `kprobes/list` without the agent's own probes (the r_brk hook, the signal and spawn guards),
// unless a probe of the daemon's shares the address.
std::string daemon_probes_list() {
  const std::string all = probecore::kprobes_list();
  std::vector<uintptr_t> own(64);
  own.resize(signal_guard_addresses(own.data(), own.size()));
  own.resize(own.size() + 8);
  own.resize(own.size() - 8 + spawn_guard_addresses(own.data() + own.size() - 8, 8));
  if (uintptr_t hook = dl_hook_address()) own.push_back(hook);
  std::erase_if(own, [](uintptr_t a) {
    return std::any_of(g_probes.begin(), g_probes.end(),
                       [&](const auto& p) { return p.second->hit->address == a; });
  });
  if (own.empty()) return all;
  std::string out;
  size_t at = 0;
  while (at < all.size()) {
    size_t nl = all.find('\n', at);
    if (nl == std::string::npos) nl = all.size() - 1;
    const std::string_view line(all.data() + at, nl + 1 - at);
    const uintptr_t addr = std::strtoull(std::string(line.substr(0, 16)).c_str(), nullptr, 16);
    if (std::find(own.begin(), own.end(), addr) == own.end()) out.append(line);
    at = nl + 1;
  }
  return out;
}

// kprobes/blacklist as the engine has it: the daemon names the ranges (it reads the
// objects' symbols, the agent does not).
std::string blacklist_text() {
  std::string out;
  for (const arch::TextRange& r : probecore::kprobe_blacklist()) {
    char line[64];
    std::snprintf(line, sizeof line, "0x%016lx-0x%016lx\n", static_cast<unsigned long>(r.start),
                  static_cast<unsigned long>(r.end));
    out += line;
  }
  return out;
}

}  // namespace

void handle_request(const lk::Message& m, int received_fd, lk::Reply* reply) {
  *reply = lk::Reply{};
  switch (m.type) {
    case lk::MsgType::kSetup:
      do_setup(std::get<lk::Setup>(m.body), received_fd, reply);
      break;
    case lk::MsgType::kBranches:
      do_branches(std::get<lk::Branches>(m.body), received_fd, reply);
      break;
    case lk::MsgType::kUnwind:
      do_unwind(std::get<lk::Unwind>(m.body), received_fd, reply);
      break;
    case lk::MsgType::kSpare:
      do_spare(std::get<lk::Spare>(m.body), received_fd, reply);
      break;
    case lk::MsgType::kDefine:
      do_define(m, reply);
      break;
    case lk::MsgType::kRemove:
      do_remove(std::get<lk::ProbeRef>(m.body).probe_id, reply);
      break;
    case lk::MsgType::kEnable:
      do_enable(std::get<lk::ProbeRef>(m.body).probe_id, true, reply);
      break;
    case lk::MsgType::kDisable:
      do_enable(std::get<lk::ProbeRef>(m.body).probe_id, false, reply);
      break;
    case lk::MsgType::kSetFilter:
      do_set_filter(std::get<lk::SetFilter>(m.body), reply);
      break;
    case lk::MsgType::kHistTable:
      do_hist_table(std::get<lk::HistTable>(m.body), received_fd, reply);
      break;
    case lk::MsgType::kSetHist:
      do_set_hist(std::get<lk::SetHist>(m.body), reply);
      break;
    case lk::MsgType::kControl:
      do_control(received_fd, reply);
      break;
    case lk::MsgType::kArmAll:
      if (int rc = probecore::arm_all_kprobes(); rc) set_error(reply, rc, errno_text("arm", rc));
      // The guards were disarmed too: take back what the program changed meanwhile.
      if (signal_guards_installed()) (void)reconcile_signal_guards();
      break;
    case lk::MsgType::kDisarmAll:
      if (int rc = probecore::disarm_all_kprobes(); rc)
        set_error(reply, rc, errno_text("disarm", rc));
      break;
    case lk::MsgType::kOptimization:
      probecore::set_kprobes_optimization(std::get<lk::Optimization>(m.body).on);
      break;
    case lk::MsgType::kList:
      reply->message = daemon_probes_list();
      break;
    case lk::MsgType::kProfile:
      do_profile(reply);
      break;
    case lk::MsgType::kBlacklist:
      reply->message = blacklist_text();
      break;
    case lk::MsgType::kGo:
      break;  // the serving loop acts on it; a running program has nothing to wait for
    default:
      set_error(reply, -EOPNOTSUPP, std::string(lk::type_name(m.type)) + " is not a request");
      break;
  }
  if (received_fd >= 0) ::close(received_fd);
  send_list_notice();  // one that found no room before: ahead of this reply
}

void teardown() {
  // A start that ends here (no daemon after all) puts nothing in at its end.
  g_start_guards_due = false;
  g_startup_enable.clear();
  std::vector<AgentProbe*> all;
  for (auto& [id, ap] : g_probes) all.push_back(ap.get());
  unregister_all(std::move(all));  // one grace period for all of them
  for (auto& [id, ap] : g_probes) hold_ref_ctr(ap.get(), false);
  g_probes.clear();
  // No probe is left to fire an action: the synthetic events go without a grace period.
  for (uint32_t i = 0; i < kMaxSynthEvents; ++i) {
    g_synths[i].store(nullptr, std::memory_order_release);
    g_synth_owned[i].reset();
  }
  drop_pending_tables(~0u);
  remove_dl_hook();
  defined_symbols().clear();
  replace_area(nullptr);
  drop_spare();
  // The next daemon starts from the defaults.
  (void)probecore::arm_all_kprobes();
  probecore::set_kprobes_optimization(true);
  // Last: until no handler can read a bad pointer, the fault fixup must stay.
  uninstall_guards();
}

void drop_area_in_child() {
  AreaState* old = g_area_owned;
  g_area_owned = nullptr;
  g_area.store(nullptr, std::memory_order_release);
  unmap_area(old);  // the caller is the child's only thread: no handler is inside it
  drop_spare();
}

void take_spare_in_parent() {
  if (g_spare_count > 0) leave(pop_spare().as);  // the child's now; never used here
}

uint32_t adopt_spare_in_child() {
  drop_pending_tables(~0u);  // the parent's spares to come
  if (g_spare_count == 0) {
    drop_area_in_child();
    return 0;
  }
  const HeldSpare taken = pop_spare();
  while (g_spare_count > 0) leave(pop_spare().as);  // the parent's
  taken.as->pid = static_cast<int32_t>(::getpid());
  AreaState* old = g_area_owned;
  g_area_owned = taken.as;
  g_area.store(taken.as, std::memory_order_release);
  leave(old);  // the parent's; the caller is the child's only thread
  return taken.id;
}

size_t probe_count() { return g_probes.size(); }

bool probe_ids_into(uint32_t* out, size_t cap, size_t* n) {
  if (g_probes.size() > cap) return false;
  size_t i = 0;
  for (const auto& [id, ap] : g_probes) out[i++] = id;
  *n = i;
  return true;
}

std::vector<uint32_t> probe_ids(size_t max) {
  std::vector<uint32_t> ids;
  if (g_probes.size() > max) return ids;
  ids.reserve(g_probes.size());
  for (const auto& [id, ap] : g_probes) ids.push_back(id);
  return ids;
}

}  // namespace probefs::agent
