// Symbols and function bounds of the ELF objects mapped into a process (libelf, libdw).
// Daemon side: reads /proc/PID/maps and the object files; never runs inside a target.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "probecore/symbol_resolver.h"
#include "tracee/proc_maps.h"

namespace probefs::tracee {

// The function around an address, run-time addresses, with its landing pads and split-off
// parts: the same bounds the engine checks a probe against.
using probecore::FunctionBounds;

// How resolve() chose the address of a GNU_IFUNC symbol. The symbol's own address is its
// resolver, which the dynamic linker runs once (at load time, or at the first call through
// a lazy PLT slot) and which the program never calls again; the program calls the
// implementation the resolver returned. Where that implementation was found (tracee/ifunc.h
// finds it):
enum class IfuncChoice : uint8_t {
  kNone,        // not an IFUNC symbol
  kResolver,    // `SYM@resolver`: the resolver itself, as asked
  kRelocation,  // the defining object's R_X86_64_IRELATIVE slot for this resolver
  kBinding,     // a GLOB_DAT, JUMP_SLOT or 64-bit slot of a loaded object bound to SYM
  kCalled,      // nothing bound it yet: the resolver run as ld.so runs it, in this process
                // (the process is ours, or this process maps the same file)
  kUnknown,     // none of those: the resolver's address (see ifunc_note)
};

struct ResolvedSymbol {
  std::string name;        // without module prefix; empty when only an FDE names the code
  std::string module;      // basename of the object ("libc.so.6"); empty for the executable
  std::string path;        // path of the object as mapped
  uintptr_t addr = 0;      // run-time address of the symbol (describe: the function start)
  FunctionBounds function; // enclosing function; end == start when unknown
  // resolve() of a GNU_IFUNC symbol: what the fields above describe (the implementation,
  // named as describe() names it, or the resolver), the resolver's address, and the
  // symbol as it was asked for, without module ("memcpy", "memcpy@resolver").
  IfuncChoice ifunc = IfuncChoice::kNone;
  uintptr_t resolver = 0;
  std::string asked;
};

// What `kprobes/list` and kprobe-style trace lines add, in parentheses, after the text
// the kernel would print for the probe's address, so that a probe that resolve() put
// somewhere its name does not say shows what it was asked for: "memcpy" beside
// __memmove_avx_unaligned_erms, "memcpy@resolver" on the resolver, and
// "memcpy@resolver: implementation unknown" where it fell back to the resolver. Empty for
// every other symbol.
std::string ifunc_note(const ResolvedSymbol& r);

// One ELF object as this resolver sees it, for introspection and tests.
struct MappedObject {
  std::string path;        // as in /proc/PID/maps
  std::string module;      // basename
  bool executable = false; // the process's main program
  // 0, or why the file behind it cannot be read (open_mapped_file: -ESTALE where it was
  // deleted or replaced since it was mapped). Such an object has no symbols; a lookup
  // that would search it (MOD:SYM of it, or SYM where it comes before the object that
  // defines SYM) fails with this error rather than answer from the objects after it.
  int error = 0;
  uintptr_t load_bias = 0; // run-time address minus ELF virtual address (0 for non-PIE)
  uintptr_t start = 0;     // run-time span of the object's mappings, [start, end)
  uintptr_t end = 0;
};

// A USDT point (a SystemTap SDT note) of an object, at its link-time addresses.
struct SdtNote {
  std::string provider;
  std::string name;
  uint64_t pc = 0;         // the point
  uint64_t semaphore = 0;  // its u16 semaphore (in .probes); 0: none
  std::string args;        // the argument spec: "-4@%eax 8@-16(%rbp)"
};

// A USDT point as a process maps it.
struct SdtPoint {
  uintptr_t addr = 0;       // the point's run-time address
  uintptr_t semaphore = 0;  // its semaphore's run-time address; 0: none
  std::string args;         // the note's argument spec
};

// One process's mapped ELF objects, the executable first, then libraries in load order
// (the dynamic linker's link map where it can be read, else the order of the mappings).
//
// The files behind the objects are parsed once in the daemon, not once per traced process:
// every ProcessSymbols that maps a file shares its headers and its lazily loaded tables
// (symbols, .eh_frame, split-off parts) while any of them holds it. A file is known by
// what fstat says of it once opened (device, inode, size, modification time), so a file
// rewritten since is parsed anew, and ProcessSymbols that hold the old parse keep it.
//
// Any thread may call any method, on one ProcessSymbols or on several that share files:
// each ProcessSymbols serialises its calls with its own mutex, and each shared file guards
// its tables with another (libelf reads sections on demand and libdw's CFI readers keep
// caches, neither thread-safe).
class ProcessSymbols {
 public:
  // Loads the objects mapped in `pid` (getpid() for this process). Returns nullptr and
  // sets *err to a negative errno on failure (-ESRCH: no such process). With `maps`, the
  // process's mappings as the caller just read them (read_maps), not read again.
  static std::unique_ptr<ProcessSymbols> load(pid_t pid, int* err,
                                              const std::vector<Mapping>* maps = nullptr);
  // One ELF object (ET_EXEC or ET_DYN) given as its bytes, as though mapped at its own
  // virtual addresses (load bias 0, the span of its PT_LOAD segments): an object read
  // without a process, and the readers' fuzz target. The bytes are copied and parsed for
  // this ProcessSymbols alone. pid() is 0 and reload() fails with -ESRCH. nullptr and
  // *err = -ENOEXEC when the bytes are not such an object.
  static std::unique_ptr<ProcessSymbols> load_image(std::string_view bytes,
                                                    std::string_view path, int* err);
  // The symbols of `child`, a fork child of the process `parent` describes, that has not
  // run code of its own since: its mappings are its parent's, so the objects are copied
  // (sharing their parsed files) and nothing is read. reload() reads the child's own.
  static std::unique_ptr<ProcessSymbols> fork_of(const ProcessSymbols& parent, pid_t child);
  ~ProcessSymbols();
  ProcessSymbols(const ProcessSymbols&) = delete;
  ProcessSymbols& operator=(const ProcessSymbols&) = delete;

  pid_t pid() const;

  // Re-reads the process's mappings (libraries loaded or unloaded since). Objects still
  // mapped at the same place keep their parsed tables; new ones share those of a file
  // already parsed for any ProcessSymbols. 0 or a negative errno.
  [[nodiscard]] int reload(const std::vector<Mapping>* maps = nullptr);

  // `SYM` or `MOD:SYM`; MOD is an object basename with or without its version suffix
  // ("libc:malloc", "libc.so.6:malloc"). .symtab where present, else .dynsym; the
  // executable is searched first, then libraries in load order. Functions only (FUNC and
  // GNU_IFUNC symbols). A name no object's own tables have is looked for, in the same
  // order, among the local functions of their separate debug files (a stripped library's
  // static functions, as the kernel probes any function kallsyms names). A name that
  // several local functions of the object that has it share, and no global one, names no
  // one function: -EADDRNOTAVAIL (the kernel's "not unique"). Otherwise 0, -ENOENT (no
  // such symbol or module) or -EINVAL (malformed name:
  // "", ":", "libc:", ":sym", a name with blanks), or the error of an object the search
  // reached whose file cannot be read (MappedObject::error; -ESTALE: the file was deleted
  // or replaced since it was mapped and nothing the daemon can reach is that file still).
  //
  // A GNU_IFUNC symbol (libc's memcpy, strlen, ...) names the implementation the process
  // calls, not its resolver (see IfuncChoice): the value the dynamic linker stored for it
  // (the defining object's IRELATIVE slot for that resolver, or any loaded object's
  // GLOB_DAT/JUMP_SLOT slot bound to the symbol, read from the process's memory); where
  // nothing holds it yet, the resolver's answer, run in this process when the process is
  // this one or maps the same file (and the same GLIBC_TUNABLES); else the resolver, which
  // out->ifunc says. `SYM@resolver` (`MOD:SYM@resolver`, `SYM@VERSION@resolver`) is the
  // resolver itself; -ENOENT when SYM is no IFUNC. Objects given as bytes (load_image)
  // have no process: their IFUNC symbols keep their own address (kUnknown).
  [[nodiscard]] int resolve(std::string_view name, ResolvedSymbol* out) const;

  // The run-time address of `SYM` or `MOD:SYM` as a data symbol, for the kprobe syntax's
  // `@SYM` fetch argument (the kernel looks it up in kallsyms): a variable (OBJECT or COMMON
  // symbol), or a function as resolve() finds it. Objects, tables, versions and errors as
  // for resolve(). A thread-local variable (TLS symbol) has an address only per thread
  // and is not found (-ENOENT), nor is a symbol without a type (NOTYPE: assembly labels,
  // the linker's _end). A variable the executable copied from a library (copy relocation)
  // is found in the executable first: that copy is the one the process uses. The table of
  // variables is read on first use and kept apart: resolve() and describe() stay as fast
  // and still name functions only. A GNU_IFUNC function is where resolve() puts it (its
  // implementation: the address the program sees as &SYM). *addr is written only on
  // success.
  [[nodiscard]] int resolve_data(std::string_view name, uint64_t* addr) const;

  // The function containing `addr`: from the symbol table (symbol size), or, where the code
  // has no symbol (stripped objects), from the .eh_frame FDE that covers it. 0 or -ENOENT.
  // A stripped object's local functions (libc's __memmove_avx_unaligned_erms) are named
  // from its separate debug file where one is installed (/usr/lib/debug/.build-id/, as
  // Debian's -dbg and -dbgsym packages install them); resolve() does not look there.
  // resolve() and describe() fill in the function's landing pads (.eh_frame LSDAs) and the
  // parts GCC split off it (`foo.cold`) with its bounds.
  [[nodiscard]] int describe(uintptr_t addr, ResolvedSymbol* out) const;

  // The USDT points PROVIDER:NAME (SDT notes) of MOD, or of the first object in search
  // order that has any; a point may be at several places. 0, -ENOENT, or the error of an
  // object the search reached whose file cannot be read.
  [[nodiscard]] int sdt_points(std::string_view mod, std::string_view provider,
                               std::string_view name, std::vector<SdtPoint>* out) const;

  // The objects in search order.
  std::vector<MappedObject> objects() const;

  // Whether an object answering to MOD (as in `MOD:SYM`) is mapped.
  bool has_module(std::string_view mod) const;

 private:
  // resolve() of SYM in MOD with impl_->mu held; ASKED is the name as given (with its
  // "@resolver" when WANT_RESOLVER).
  int resolve_locked(std::string_view mod, std::string_view sym, std::string_view asked,
                     bool want_resolver, ResolvedSymbol* out) const;
  struct Impl;
  explicit ProcessSymbols(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// For tests and diagnostics: the object files that ProcessSymbols share in this process.
// Objects given as bytes (load_image) do not count.
struct ElfFileCacheStats {
  size_t files = 0;                 // files some ProcessSymbols holds now
  uint64_t files_parsed = 0;        // files opened and parsed so far (each a cache miss)
  uint64_t symbol_tables_read = 0;  // function tables read so far (at most one per parse)
  uint64_t data_tables_read = 0;    // variable tables read so far (at most one per parse)
};
ElfFileCacheStats elf_file_cache_stats();

}  // namespace probefs::tracee
