#include "tracee/inject.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <string>

namespace probefs::tracee {
namespace {

using Clock = std::chrono::steady_clock;

// glibc's flag that makes __libc_dlopen_mode count the object as dlopen'ed (<dlfcn.h>
// keeps it to glibc itself).
constexpr uint64_t kRtldDlopen = 0x80000000;
// dlerror()'s text is short; this bounds what we read of a hostile one.
constexpr size_t kMaxDlerror = 4096;

int fail(PtraceError* error, int err, std::string message) {
  error->err = err;
  error->message = std::move(message);
  return err;
}

std::string basename_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
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

}  // namespace

int inject_library(PtraceSession& session, std::string_view path, InjectedLibrary* out,
                   PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  const int pid = static_cast<int>(session.pid());
  Loader loader;
  if (!find_loader(session.symbols(), &loader)) {
    return fail(error, -ENOENT,
                "process " + std::to_string(pid) +
                    " has no dlopen: neither libc.so.6's (glibc >= 2.34), libdl's nor glibc's "
                    "__libc_dlopen_mode is mapped; a statically linked program cannot load a "
                    "library");
  }
  uintptr_t path_addr = 0;
  if (int rc = session.push_string(path, &path_addr, error); rc != 0) return rc;
  uint64_t handle = 0;
  const std::array<uint64_t, 2> args = {path_addr, loader.mode};
  if (int rc = session.call(loader.dlopen, args, &handle, error); rc != 0) return rc;
  const std::string quoted = "\"" + std::string(path) + "\"";
  if (handle == 0) {
    std::string message;
    uint64_t text = 0;
    if (loader.dlerror != 0 && session.call(loader.dlerror, {}, &text, error) == 0 && text != 0) {
      (void)session.read_string(text, kMaxDlerror, &message);
    }
    if (message.empty()) message = "no message (" + std::string(loader.name) + " gives none)";
    return fail(error, dlopen_errno(message),
                "dlopen(" + quoted + ") in process " + std::to_string(pid) + " failed: " + message);
  }
  out->handle = handle;
  if (int rc = session.symbols().reload(); rc != 0) {
    return fail(error, rc,
                "process " + std::to_string(pid) + " loaded " + quoted +
                    ", but its objects could not be read again");
  }
  if (!find_object(session, handle, path, &out->object)) {
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
