#include "tracee/inject.h"

#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tracee/proc_maps.h"

// ---------------------------------------------------------------------------------------
// The routine our thread runs in the target (attach in two steps, see inject.h). It is
// assembled into the daemon as bytes, never run here, and copied to the first of two pages
// the held thread maps in the target; the second page holds its block:
//
//   pages + 0     code (this routine)                   mapped r-x
//   pages + 4096  block: what it calls, what it reports  mapped r-x, made rw- by the routine
//
//   block +  0  dlopen            +48  handle     (out)     +80  futex timeout (timespec)
//         +  8  dlerror (0: none) +56  dlerror()  (out)     +96  its stack pointer (out)
//         + 16  pthread_self      +64  reported   (out, 1)  +104 the path, NUL-terminated
//         + 24  pthread_detach    +72  finish     (in, 32-bit: 1 ends the thread)
//         + 32  munmap
//         + 40  dlopen's mode
//
// The thread comes in from pthread_create (start_thread) with the block in rdi and leaves
// by a tail call to munmap of both pages, which returns to start_thread: no instruction of
// the pages runs once they are gone. It waits for `finish` at most a minute at a time and
// gives up when a wait times out: the daemon that started it is gone. The session holds it
// in that wait for the daemon's calls; a call the session stops waiting for returns to
// probefs_inject_thread_return, which takes the routine's stack pointer back from the
// block (rbx, which every callee keeps, still points there) and ends the thread as above:
//
//   our thread's stack, held in the wait
//   | start_thread's frame                   |
//   | return address into start_thread       |
//   | start_thread's rbx (pushed)            |  <- rsp at the wait, kept at block + 96
//   | red zone, the session's strings        |
//   | a call's return address: 0, or         |  <- rsp at a call's entry
//   |   probefs_inject_thread_return once    |
//   |   the session let the call go on       |
#include "tracee/inject_thread.h"


extern "C" const unsigned char probefs_inject_thread_code[];
extern "C" const unsigned char probefs_inject_thread_code_end[];
extern "C" const unsigned char probefs_inject_thread_return[];

namespace probefs::tracee {
namespace {

using Clock = std::chrono::steady_clock;

// glibc's flag that makes __libc_dlopen_mode count the object as dlopen'ed (<dlfcn.h>
// keeps it to glibc itself).
constexpr uint64_t kRtldDlopen = 0x80000000;
// dlerror()'s text is short; this bounds what we read of a hostile one.
constexpr size_t kMaxDlerror = 4096;
constexpr uint64_t kPage = 4096;
// How long the routine waits for `finish` in one futex wait.
constexpr int64_t kRoutineWaitSeconds = 60;
// Frames looked at in a held thread's stack.
constexpr size_t kMaxFrames = 128;

struct ThreadBlock {
  uint64_t dlopen;
  uint64_t dlerror;
  uint64_t pthread_self;
  uint64_t pthread_detach;
  uint64_t munmap;
  uint64_t mode;
  uint64_t handle;
  uint64_t error_text;
  uint64_t reported;
  uint32_t finish;
  uint32_t pad;
  int64_t timeout_sec;
  int64_t timeout_nsec;
  uint64_t rsp;
  char path[kPage - PROBEFS_BLOCK_PATH];
};
static_assert(offsetof(ThreadBlock, dlopen) == PROBEFS_BLOCK_DLOPEN);
static_assert(offsetof(ThreadBlock, dlerror) == PROBEFS_BLOCK_DLERROR);
static_assert(offsetof(ThreadBlock, pthread_self) == PROBEFS_BLOCK_SELF);
static_assert(offsetof(ThreadBlock, pthread_detach) == PROBEFS_BLOCK_DETACH);
static_assert(offsetof(ThreadBlock, munmap) == PROBEFS_BLOCK_MUNMAP);
static_assert(offsetof(ThreadBlock, mode) == PROBEFS_BLOCK_MODE);
static_assert(offsetof(ThreadBlock, handle) == PROBEFS_BLOCK_HANDLE);
static_assert(offsetof(ThreadBlock, error_text) == PROBEFS_BLOCK_ERROR);
static_assert(offsetof(ThreadBlock, reported) == PROBEFS_BLOCK_REPORTED);
static_assert(offsetof(ThreadBlock, finish) == PROBEFS_BLOCK_FINISH);
static_assert(offsetof(ThreadBlock, timeout_sec) == PROBEFS_BLOCK_TIMEOUT);
static_assert(offsetof(ThreadBlock, rsp) == PROBEFS_BLOCK_RSP);
static_assert(offsetof(ThreadBlock, path) == PROBEFS_BLOCK_PATH);
static_assert(sizeof(ThreadBlock) == kPage);

int fail(PtraceError* error, int err, std::string message) {
  error->err = err;
  error->message = std::move(message);
  return err;
}

std::string basename_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%#llx", static_cast<unsigned long long>(v));
  return buf;
}

struct Loader {
  uintptr_t dlopen = 0;
  uint64_t mode = 0;
  uintptr_t dlerror = 0;  // 0 when there is none to ask
  const char* name = "";
};

// The loader entry of the process, most specific first. "libc:" matches libc.so.6.
bool find_loader(const ProcessSymbols& symbols, Loader* out) {
  struct Candidate {
    const char* open;
    const char* error;
    uint64_t mode;
  };
  static constexpr Candidate kCandidates[] = {
      {"libc:dlopen", "libc:dlerror", RTLD_NOW},                     // glibc >= 2.34, musl
      {"libdl:dlopen", "libdl:dlerror", RTLD_NOW},                   // older glibc
      {"libc:__libc_dlopen_mode", nullptr, RTLD_NOW | kRtldDlopen},  // older glibc
  };
  for (const Candidate& c : kCandidates) {
    ResolvedSymbol sym;
    if (symbols.resolve(c.open, &sym) != 0) continue;
    out->dlopen = sym.addr;
    out->mode = c.mode;
    out->name = c.open;
    out->dlerror = 0;
    if (c.error != nullptr && symbols.resolve(c.error, &sym) == 0) out->dlerror = sym.addr;
    return true;
  }
  return false;
}

// What the held thread and ours call besides the loader: libc's (glibc >= 2.34, musl),
// else libpthread's (older glibc, where the program linked it).
struct ThreadFunctions {
  uintptr_t create = 0;
  uintptr_t self = 0;
  uintptr_t detach = 0;
  uintptr_t mmap = 0;
  uintptr_t munmap = 0;
  uintptr_t errno_location = 0;  // for mmap's reason; 0 when unknown
};

bool resolve_first(const ProcessSymbols& symbols, std::initializer_list<const char*> names,
                   uintptr_t* addr) {
  for (const char* n : names) {
    ResolvedSymbol sym;
    if (symbols.resolve(n, &sym) == 0) {
      *addr = sym.addr;
      return true;
    }
  }
  return false;
}

bool find_thread_functions(const ProcessSymbols& symbols, ThreadFunctions* out) {
  (void)resolve_first(symbols, {"libc:__errno_location"}, &out->errno_location);
  return resolve_first(symbols, {"libc:pthread_create", "libpthread:pthread_create"},
                       &out->create) &&
         resolve_first(symbols, {"libc:pthread_self", "libpthread:pthread_self"}, &out->self) &&
         resolve_first(symbols, {"libc:pthread_detach", "libpthread:pthread_detach"},
                       &out->detach) &&
         resolve_first(symbols, {"libc:mmap", "libc:mmap64"}, &out->mmap) &&
         resolve_first(symbols, {"libc:munmap"}, &out->munmap);
}

int dlopen_errno(const std::string& message) {
  if (message.find("No such file or directory") != std::string::npos) return -ENOENT;
  if (message.find("Permission denied") != std::string::npos) return -EACCES;
  if (message.find("invalid ELF header") != std::string::npos ||
      message.find("wrong ELF class") != std::string::npos ||
      message.find("file too short") != std::string::npos) {
    return -ENOEXEC;
  }
  return -ELIBBAD;
}

// The mapped object behind a handle: glibc's handle is the object's struct link_map,
// which starts with l_addr (the load bias) and l_name. Else by the path's real name.
bool find_object(PtraceSession& session, uintptr_t handle, std::string_view path,
                 MappedObject* out) {
  const std::vector<MappedObject> objects = session.symbols().objects();
  uint64_t head[2] = {0, 0};
  std::string l_name;
  if (session.read_memory(handle, head, sizeof head) == 0 &&
      session.read_string(head[1], PATH_MAX, &l_name) == 0 && !l_name.empty()) {
    const std::string base = basename_of(l_name);
    for (const MappedObject& o : objects) {
      if (o.load_bias == head[0] && (o.path == l_name || o.module == base)) {
        *out = o;
        return true;
      }
    }
  }
  char real[PATH_MAX];
  const std::string p(path);
  if (realpath(p.c_str(), real) != nullptr) {
    for (const MappedObject& o : objects) {
      if (o.path == real) {
        *out = o;
        return true;
      }
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------
// Whether a held thread may start a thread.
//
// pthread_create allocates (the new thread's DTV with calloc, its stack from a cache
// under a lock), takes the dynamic loader's TLS lock (recursive: its owner would get it
// again, in whatever state it left the TLS tables) and the lock of the default thread
// attributes. A thread stopped inside any of those, or inside the loader, must not be made
// to call it: it would wait for a lock it holds itself, or change data it is in the middle
// of changing. So the held thread's stack is unwound (libdwfl, with the .eh_frame of the
// objects it runs in, through signal frames) and the thread is not used when
//   - a frame is in the dynamic loader (ld.so), or it owns one of the loader's recursive
//     locks (a library's constructor runs under dlopen's), or
//   - a frame is in a C library function that holds such a lock or allocator state: the
//     allocator's entry points, pthread_create, join, detach and exit, fork, the set*id
//     calls (they hold the stack cache's lock while they signal every thread), the
//     loader's entry points in libc (dlopen, dl_iterate_phdr, ...), exit and abort, or
//   - no frame is in code outside the C library: a thread that starts or ends (its stack
//     freed under the stack cache's lock), or a thread the library runs for itself, or
//   - the unwinding stops inside the C library, so that its callers are unknown.
// The allocator's internal functions are reached only from its entry points, whose
// frames are then above them. Another thread holding such a lock only delays the call:
// it runs on and lets go.

// The C library's entry points a thread must not be in (any that exist).
constexpr const char* kUnsafeFunctions[] = {
    // the allocator
    "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "aligned_alloc",
    "posix_memalign", "valloc", "pvalloc", "malloc_usable_size", "malloc_trim", "malloc_stats",
    "malloc_info", "mallinfo", "mallinfo2", "mallopt", "__libc_malloc", "__libc_free",
    "__libc_calloc", "__libc_realloc", "__libc_memalign", "__libc_valloc", "__libc_pvalloc",
    "__libc_freeres",
    // threads: stacks, the TLS lock, the default attributes
    "pthread_create", "pthread_join", "pthread_tryjoin_np", "pthread_timedjoin_np",
    "pthread_clockjoin_np", "pthread_detach", "pthread_exit", "pthread_getattr_default_np",
    "pthread_setattr_default_np",
    // processes: fork holds every allocator lock; exit and abort end the process
    "fork", "_Fork", "__libc_fork", "exit", "quick_exit", "abort",
    // the set*id calls signal every thread with the stack cache's lock held
    "setuid", "setgid", "seteuid", "setegid", "setreuid", "setregid", "setresuid", "setresgid",
    "setgroups",
    // the loader's entry points in the C library
    "dlopen", "dlmopen", "dlclose", "dlsym", "dlvsym", "dladdr", "dladdr1", "dlinfo", "dlerror",
    "dl_iterate_phdr", "_dl_find_object", "__libc_dlopen_mode", "__libc_dlsym", "__libc_dlvsym",
    "__libc_dlclose"};

struct CodeRange {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string name;
};

// What the judgement needs of the process, read once per injection.
struct ThreadFacts {
  std::vector<CodeRange> unsafe;  // the functions above, with their split-off parts
  std::string loader_path;        // ld.so as mapped; empty when unknown (static, musl)
  uintptr_t rtld_global = 0;      // glibc's loader state, where its recursive locks live
};

bool is_c_library(std::string_view path) {
  const std::string base = basename_of(path);
  for (const char* prefix : {"libc.so", "libc-", "libpthread", "libdl.so", "libdl-"}) {
    if (base.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

ThreadFacts gather_facts(const ProcessSymbols& symbols) {
  ThreadFacts f;
  for (const char* name : kUnsafeFunctions) {
    for (const char* mod : {"libc", "libpthread", "libdl"}) {
      ResolvedSymbol sym;
      if (symbols.resolve(std::string(mod) + ":" + name, &sym) != 0 || !sym.function.known()) {
        continue;
      }
      f.unsafe.push_back({sym.function.start, sym.function.end, sym.name + " (" + sym.module + ")"});
      for (const arch::TextRange& part : sym.function.related) {
        f.unsafe.push_back({part.start, part.end, sym.name + " (" + sym.module + ")"});
      }
    }
  }
  uint64_t rtld = 0;
  if (symbols.resolve_data("_rtld_global", &rtld) == 0) {
    for (const MappedObject& o : symbols.objects()) {
      if (rtld >= o.start && rtld < o.end) {
        f.loader_path = o.path;
        f.rtld_global = rtld;
      }
    }
  }
  if (f.loader_path.empty()) {
    for (const MappedObject& o : symbols.objects()) {
      if (o.module.rfind("ld-linux", 0) == 0) f.loader_path = o.path;
    }
  }
  return f;
}

// Whether thread `tid` owns one of the recursive mutexes in glibc's _rtld_global
// (dl_load_lock, dl_load_write_lock, dl_load_tls_lock, ...). The structure's layout
// changes between versions, the mutex's does not (x86-64 pthread_mutex_t: int __lock,
// unsigned __count, int __owner, unsigned __nusers, int __kind, ...), and a held
// recursive mutex names its owner's thread id.
bool owns_loader_lock(const PtraceSession& session, const ThreadFacts& facts,
                      const std::vector<MappingGroup>& groups, pid_t tid) {
  if (facts.rtld_global == 0) return false;
  uintptr_t limit = facts.rtld_global;
  for (const MappingGroup& g : groups) {
    for (const Mapping& m : g.maps) {
      if (facts.rtld_global >= m.start && facts.rtld_global < m.end) limit = m.end;
    }
  }
  // The structure is a few KiB; its writable mapping bounds the read.
  limit = std::min<uintptr_t>(limit, facts.rtld_global + 3 * kPage);
  std::vector<uint8_t> bytes;
  for (uintptr_t at = facts.rtld_global; at < limit;) {
    const size_t len = std::min<uintptr_t>(kPage - at % kPage, limit - at);
    const size_t old = bytes.size();
    bytes.resize(old + len);
    if (session.read_memory(at, bytes.data() + old, len) != 0) {
      bytes.resize(old);
      break;
    }
    at += len;
  }
  constexpr int kRecursive = 1;  // PTHREAD_MUTEX_RECURSIVE_NP
  for (size_t i = 0; i + 20 <= bytes.size(); i += 4) {
    int32_t word[5];
    std::memcpy(word, bytes.data() + i, sizeof word);
    const int32_t lock = word[0], count = word[1], owner = word[2], kind = word[4];
    if (owner == tid && lock != 0 && count >= 1 && (kind & 0x7f) == kRecursive) return true;
  }
  return false;
}

// ---- unwinding the held thread with libdwfl --------------------------------------------

struct Unwind {
  const PtraceSession* session = nullptr;
  pid_t pid = 0;
  pid_t tid = 0;
  const user_regs_struct* regs = nullptr;
  std::vector<uintptr_t> pcs;  // each frame's pc, minus 1 for a return address
};

// Opens the object behind a module as open_mapped_file() does: the very inode the
// process mapped, never a file a name now leads to.
int find_elf(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, char**, Elf** elfp) {
  *elfp = nullptr;
  auto* where = static_cast<std::pair<pid_t, const Mapping*>*>(*userdata);
  if (where == nullptr) return -1;
  const int fd = open_mapped_file(where->first, *where->second);
  return fd >= 0 ? fd : -1;
}

int no_debuginfo(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*,
                 GElf_Word, char**) {
  return -1;  // .eh_frame, in the object itself, is what unwinding needs
}

pid_t next_thread(Dwfl*, void* arg, void** thread_arg) {
  if (*thread_arg != nullptr) return 0;
  *thread_arg = arg;
  return static_cast<Unwind*>(arg)->tid;
}

bool read_word(Dwfl*, Dwarf_Addr addr, Dwarf_Word* result, void* arg) {
  return static_cast<Unwind*>(arg)->session->read_memory(addr, result, sizeof *result) == 0;
}

// The x86-64 psABI's DWARF register numbers: rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp,
// r8-r15, then the return address column (rip).
bool initial_registers(Dwfl_Thread* thread, void* arg) {
  const user_regs_struct& r = *static_cast<Unwind*>(arg)->regs;
  const Dwarf_Word regs[17] = {r.rax, r.rdx, r.rcx, r.rbx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8,
                               r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rip};
  return dwfl_thread_state_registers(thread, 0, 17, regs);
}

int on_frame(Dwfl_Frame* frame, void* arg) {
  auto* u = static_cast<Unwind*>(arg);
  Dwarf_Addr pc = 0;
  bool activation = false;
  if (!dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
  u->pcs.push_back(static_cast<uintptr_t>(activation ? pc : pc - 1));
  return u->pcs.size() < kMaxFrames ? DWARF_CB_OK : DWARF_CB_ABORT;
}

// The pcs of the held thread's frames, innermost first. *complete: the unwinding reached
// the outermost frame (one whose return address the CFI leaves undefined).
std::vector<uintptr_t> unwind(const PtraceSession& session,
                              const std::vector<MappingGroup>& groups, bool* complete) {
  Unwind u;
  u.session = &session;
  u.pid = session.pid();
  u.tid = session.tid();
  u.regs = &session.registers();
  *complete = false;
  static const Dwfl_Callbacks kCallbacks = {find_elf, no_debuginfo, nullptr, nullptr};
  static const Dwfl_Thread_Callbacks kThreadCallbacks = {next_thread, nullptr, read_word,
                                                         initial_registers, nullptr, nullptr};
  Dwfl* dwfl = dwfl_begin(&kCallbacks);
  if (dwfl == nullptr) return {};
  std::vector<std::pair<pid_t, const Mapping*>> where;
  where.reserve(groups.size());
  dwfl_report_begin(dwfl);
  for (const MappingGroup& g : groups) {
    if (!g.has_exec || g.maps.empty()) continue;
    Dwfl_Module* mod = dwfl_report_module(dwfl, g.maps.front().path.c_str(),
                                          g.maps.front().start, g.maps.back().end);
    if (mod == nullptr) continue;  // overlaps another: its frames stay unknown
    void** userdata = nullptr;
    dwfl_module_info(mod, &userdata, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    where.emplace_back(u.pid, &g.maps.front());
    if (userdata != nullptr) *userdata = &where.back();
  }
  dwfl_report_end(dwfl, nullptr, nullptr);
  if (dwfl_attach_state(dwfl, nullptr, u.pid, &kThreadCallbacks, &u)) {
    *complete = dwfl_getthread_frames(dwfl, u.tid, on_frame, &u) == 0 && !u.pcs.empty();
  }
  dwfl_end(dwfl);
  if (u.pcs.empty()) u.pcs.push_back(static_cast<uintptr_t>(session.registers().rip));
  return u.pcs;
}

const Mapping* mapping_at(const std::vector<MappingGroup>& groups, uintptr_t pc) {
  for (const MappingGroup& g : groups) {
    for (const Mapping& m : g.maps) {
      if (pc >= m.start && pc < m.end) return &m;
    }
  }
  return nullptr;
}

std::string function_at(const ProcessSymbols& symbols, uintptr_t pc) {
  ResolvedSymbol sym;
  if (symbols.describe(pc, &sym) == 0 && !sym.name.empty()) return sym.name;
  return hex(pc);
}

// Why the held thread must not start a thread, or "" when it may.
std::string why_not_usable(PtraceSession& session, const ThreadFacts& facts) {
  std::vector<Mapping> maps;
  if (int rc = read_maps(session.pid(), &maps); rc != 0) {
    return "the process's mappings could not be read (" + std::string(strerror(-rc)) + ")";
  }
  const std::vector<MappingGroup> groups = group_mappings(std::move(maps));
  if (owns_loader_lock(session, facts, groups, session.tid())) {
    return "it holds a lock of the dynamic loader (a dlopen, dlclose or library constructor "
           "is under way in it)";
  }
  bool complete = false;
  const std::vector<uintptr_t> pcs = unwind(session, groups, &complete);
  bool beyond_c_library = false;
  bool last_in_c_library = false;
  for (uintptr_t pc : pcs) {
    const Mapping* m = mapping_at(groups, pc);
    if (m != nullptr && !facts.loader_path.empty() && m->path == facts.loader_path) {
      return "it is in the dynamic loader (" + function_at(session.symbols(), pc) + " in " +
             basename_of(m->path) + ")";
    }
    for (const CodeRange& r : facts.unsafe) {
      if (pc >= r.start && pc < r.end) return "it is in " + r.name;
    }
    last_in_c_library = m != nullptr && is_c_library(m->path);
    beyond_c_library |= !last_in_c_library;
  }
  if (!complete && last_in_c_library) {
    return "its stack could not be followed past " + function_at(session.symbols(), pcs.back()) +
           " in the C library";
  }
  if (!beyond_c_library) {
    return "it runs only the C library's own code (a thread that starts or ends, or one "
           "the library runs for itself)";
  }
  return "";
}

// Holds a thread that may start a thread: the one held, or, while the one held may not, the
// others in turn, each given back as it was, and the process let run between rounds. At
// most the session's timeout; -EAGAIN with every reason when no thread was ready in time.
int hold_usable_thread(PtraceSession& session, const ThreadFacts& facts, PtraceError* error) {
  const Clock::time_point deadline = Clock::now() + session.timeout();
  std::vector<pid_t> tried;
  std::vector<std::pair<pid_t, std::string>> reasons;  // the latest per thread, a few threads
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    std::string why = why_not_usable(session, facts);
    if (why.empty()) return 0;
    const pid_t tid = session.tid();
    auto it = std::find_if(reasons.begin(), reasons.end(),
                           [&](const auto& r) { return r.first == tid; });
    if (it != reasons.end()) it->second = std::move(why);
    else if (reasons.size() < 8) reasons.emplace_back(tid, std::move(why));
    if (Clock::now() >= deadline) break;
    tried.push_back(tid);
    int rc = session.hold_another(tried, error);
    if (rc == -ENOENT) {
      // Every thread was in such a place: let the process run a little, then look again.
      tried.clear();
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
      pause = std::min(pause * 2, std::chrono::milliseconds(32));
      rc = session.hold_another(tried, error);
    }
    if (rc != 0) return rc;
  }
  std::string message = "no thread of process " + std::to_string(session.pid()) +
                        " was at a point where it may start a thread within " +
                        std::to_string(session.timeout().count()) + " ms";
  for (const auto& [tid, why] : reasons) message += "; thread " + std::to_string(tid) + ": " + why;
  return fail(error, -EAGAIN, message);
}

// ---- namespaces ------------------------------------------------------------------------

// "mnt:[4026531841]", the namespace of `kind` of process `pid` (0: this one); "" when it
// cannot be read.
std::string namespace_of(pid_t pid, const char* kind) {
  const std::string link = (pid == 0 ? std::string("/proc/self") : "/proc/" + std::to_string(pid)) +
                           "/ns/" + kind;
  char buf[64];
  const ssize_t n = readlink(link.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Whether `path` leads, in the root and mount namespace of process `pid`, to the file it
// leads to here. "" when it does (or when it cannot be told: our own file is missing, or
// the process's root is closed to us), else what it leads to there.
std::string elsewhere_in_root(pid_t pid, const std::string& path) {
  struct stat ours;
  if (path.empty() || path[0] != '/' || stat(path.c_str(), &ours) != 0) return "";
  const std::string root_path = "/proc/" + std::to_string(pid) + "/root";
  const int root = open(root_path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return "";
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  long fd = syscall(SYS_openat2, root, path.c_str(), &how, sizeof how);
  if (fd < 0 && errno == ENOSYS) {
    // Before Linux 5.6: relative to the root, an absolute symlink resolved in ours.
    fd = openat(root, path.c_str() + 1, O_PATH | O_CLOEXEC);
  }
  const int err = errno;
  close(root);
  if (fd < 0) {
    return err == ENOENT || err == ENOTDIR ? "does not exist" : "cannot be looked up (" +
                                                                    std::string(strerror(err)) +
                                                                    ")";
  }
  struct stat theirs;
  const bool same = fstat(static_cast<int>(fd), &theirs) == 0 && theirs.st_dev == ours.st_dev &&
                    theirs.st_ino == ours.st_ino;
  close(static_cast<int>(fd));
  return same ? "" : "is another file";
}

}  // namespace

int check_namespaces(pid_t pid, std::string_view agent_path, std::string_view link_name,
                     PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  const std::string who = "process " + std::to_string(pid);
  if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) {
    return fail(error, -ESRCH, "no " + who);
  }
  auto differs = [&](const char* kind, std::string* theirs, std::string* ours) {
    *theirs = namespace_of(pid, kind);
    *ours = namespace_of(0, kind);
    return !theirs->empty() && !ours->empty() && *theirs != *ours;
  };
  std::string theirs, ours;
  if (differs("pid", &theirs, &ours)) {
    return fail(error, -EOPNOTSUPP,
                who + " is in another PID namespace (" + theirs + "; the daemon's is " + ours +
                    "): its agent could not tell that its link leads to this daemon, since the "
                    "process ids it checks (the link's SO_PEERCRED, the TracerPid of its "
                    "thread) name other processes there; run probefs in that namespace");
  }
  const std::string link(link_name);
  const bool link_is_file = !link.empty() && link[0] == '/';
  if (!link_is_file && differs("net", &theirs, &ours)) {
    return fail(error, -EOPNOTSUPP,
                who + " is in another network namespace (" + theirs + "; the daemon's is " +
                    ours + "), where the abstract socket name " + link + " does not exist");
  }
  const bool other_mounts = differs("mnt", &theirs, &ours);
  const std::string where =
      other_mounts ? who + " is in another mount namespace (" + theirs + "; the daemon's is " +
                         ours + ")"
                   : who + " has another root directory";
  const std::string agent(agent_path);
  if (std::string why = elsewhere_in_root(pid, agent); !why.empty()) {
    return fail(error, -EOPNOTSUPP,
                where + ", where " + agent + " " + why +
                    ": it cannot load this daemon's agent (a container with its own files)");
  }
  if (!link_is_file) return 0;
  if (std::string why = elsewhere_in_root(pid, link); !why.empty()) {
    return fail(error, -EOPNOTSUPP,
                where + ", where the daemon's link endpoint " + link + " " + why +
                    ": its agent could not reach the daemon (a container with its own /run "
                    "or /tmp)");
  }
  return 0;
}

int inject_library(PtraceSession& session, std::string_view path, InjectedLibrary* out,
                   PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  const int pid = static_cast<int>(session.pid());
  const std::string quoted = "\"" + std::string(path) + "\"";
  if (session.holds_own_thread()) {
    return fail(error, -EINVAL, "the session holds a thread of its own, not one of the program");
  }
  Loader loader;
  if (!find_loader(session.symbols(), &loader)) {
    return fail(error, -ENOENT,
                "process " + std::to_string(pid) +
                    " has no dlopen: neither libc.so.6's (glibc >= 2.34), libdl's nor glibc's "
                    "__libc_dlopen_mode is mapped; a statically linked program cannot load a "
                    "library");
  }
  ThreadFunctions fns;
  if (!find_thread_functions(session.symbols(), &fns)) {
    return fail(error, -ENOSYS,
                "process " + std::to_string(pid) +
                    " cannot start a thread: pthread_create, pthread_self, pthread_detach, "
                    "mmap and munmap are not all in its C library (glibc older than 2.34 "
                    "has them in libpthread, which this program did not load)");
  }
  ThreadBlock block{};
  if (path.size() >= sizeof block.path) {
    return fail(error, -ENAMETOOLONG,
                "the path " + quoted + " is longer than " +
                    std::to_string(sizeof block.path - 1) + " bytes");
  }

  // 1. A thread of the program that may start one.
  if (int rc = hold_usable_thread(session, gather_facts(session.symbols()), error); rc != 0) {
    return rc;
  }

  // 2. Two pages for our routine and its block, mapped by that thread.
  const size_t code_size = static_cast<size_t>(probefs_inject_thread_code_end -
                                               probefs_inject_thread_code);
  uint64_t pages = 0;
  const std::array<uint64_t, 6> mmap_args = {
      0, 2 * kPage, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, ~uint64_t{0}, 0};
  if (int rc = session.call(fns.mmap, mmap_args, &pages, error); rc != 0) return rc;
  if (pages == ~uint64_t{0}) {  // MAP_FAILED; the reason is in the thread's errno
    int err = ENOMEM;
    uint64_t errno_addr = 0;
    PtraceError ignored;
    if (fns.errno_location != 0 &&
        session.call(fns.errno_location, {}, &errno_addr, &ignored) == 0) {
      (void)session.read_memory(errno_addr, &err, sizeof err);
    }
    return fail(error, -std::abs(err),
                "process " + std::to_string(pid) +
                    " could not map two pages for the thread that loads the library: mmap: " +
                    strerror(std::abs(err)) + " (a policy against executable memory?)");
  }
  block.dlopen = loader.dlopen;
  block.dlerror = loader.dlerror;
  block.pthread_self = fns.self;
  block.pthread_detach = fns.detach;
  block.munmap = fns.munmap;
  block.mode = loader.mode;
  block.timeout_sec = kRoutineWaitSeconds;
  std::memcpy(block.path, path.data(), path.size());
  const uintptr_t block_addr = pages + kPage;
  if (session.write_memory(pages, probefs_inject_thread_code, code_size) != 0 ||
      session.write_memory(block_addr, &block, sizeof block) != 0) {
    uint64_t ignored = 0;
    PtraceError unmapped;
    (void)session.call(fns.munmap, std::array<uint64_t, 2>{pages, 2 * kPage}, &ignored,
                       &unmapped);
    return fail(error, -EIO,
                "cannot write the loading thread's code into process " + std::to_string(pid));
  }

  // 3. The held thread starts ours and is given back; ours loads the library.
  PtraceSession::ThreadStart start;
  start.create = fns.create;
  start.routine = pages;
  start.arg = block_addr;
  start.report_word = block_addr + offsetof(ThreadBlock, reported);
  start.finish_word = block_addr + offsetof(ThreadBlock, finish);
  start.call_return = pages + static_cast<uintptr_t>(probefs_inject_thread_return -
                                                     probefs_inject_thread_code);
  if (int rc = session.start_thread(start, error); rc != 0) {
    const pid_t ours = session.started_thread();
    if (rc == -ETIMEDOUT && ours != 0 && !session.holds_own_thread()) {
      return fail(error, rc,
                  "dlopen(" + quoted + ") in process " + std::to_string(pid) +
                      " did not return within " + std::to_string(session.timeout().count()) +
                      " ms; thread " + std::to_string(ours) +
                      ", which we started to call it, was let go and ends when dlopen "
                      "returns (no thread of the program was held meanwhile)");
    }
    if (ours == 0) {
      // Nothing runs on the pages: the thread still held (if any) unmaps them.
      uint64_t ignored = 0;
      PtraceError unmapped;
      (void)session.call(fns.munmap, std::array<uint64_t, 2>{pages, 2 * kPage}, &ignored,
                         &unmapped);
    }
    return rc;
  }
  ThreadBlock report{};
  if (session.read_memory(block_addr, &report, offsetof(ThreadBlock, finish)) != 0) {
    return fail(error, -EIO, "cannot read what the loading thread reported");
  }
  if (report.handle == 0) {
    std::string message;
    if (report.error_text != 0) (void)session.read_string(report.error_text, kMaxDlerror, &message);
    if (message.empty()) message = "no message (" + std::string(loader.name) + " gives none)";
    return fail(error, dlopen_errno(message),
                "dlopen(" + quoted + ") in process " + std::to_string(pid) + " failed: " + message);
  }
  out->handle = report.handle;
  if (int rc = session.symbols().reload(); rc != 0) {
    return fail(error, rc,
                "process " + std::to_string(pid) + " loaded " + quoted +
                    ", but its objects could not be read again");
  }
  if (!find_object(session, report.handle, path, &out->object)) {
    return fail(error, -ENOENT,
                "process " + std::to_string(pid) + " loaded " + quoted +
                    ", but the object is not in its mappings");
  }
  return 0;
}

int inject_library(pid_t pid, std::string_view path, const PtraceOptions& options,
                   InjectedLibrary* out, PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  const Clock::time_point start = Clock::now();
  auto session = PtraceSession::attach(pid, options, error);
  if (session == nullptr) return error->err;
  int rc = inject_library(*session, path, out, error);
  PtraceError detach_error;
  int detached = session->detach(&detach_error);
  if (rc == 0 && detached != 0) {
    *error = detach_error;
    rc = detached;
  }
  out->timings = session->timings();
  out->total = Clock::now() - start;
  return rc;
}

int resolve_injected_symbol(const ProcessSymbols& symbols, const InjectedLibrary& library,
                            std::string_view name, uintptr_t* addr) {
  ResolvedSymbol sym;
  const std::string qualified = library.object.module + ":" + std::string(name);
  if (symbols.resolve(qualified, &sym) != 0) return -ENOENT;
  // Another object of the same basename, earlier in load order, does not count.
  if (sym.path != library.object.path) return -ENOENT;
  *addr = sym.addr;
  return 0;
}

}  // namespace probefs::tracee
