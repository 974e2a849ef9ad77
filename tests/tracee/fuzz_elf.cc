// libFuzzer target for the ELF readers: arbitrary bytes as an object file, through symbol
// loading (.symtab/.dynsym, versioned names, SHN_XINDEX), name lookup and the .eh_frame
// FDE reader (ProcessSymbols::load_image, then resolve and describe), the unwind table
// builder (build_unwind_table: every table it makes passes the agent's checks and
// answers lookups) and the code-section reader of uprobe offsets (section_instruction:
// an instruction it finds lies inside the file) and the judge of programs probefs cannot
// enter (untraceable_program, as the daemon judges a target's new image: its state is one
// of the known words, with its line); any other bytes as /proc/PID/maps text through its
// parser (parse_maps_line).
//
// Broken invariants trap (__builtin_trap), so libFuzzer reports them like crashes:
//   - bytes that load describe one object;
//   - a function bound that is known contains the address it was asked about (describe)
//     or the symbol's own address (resolve);
//   - every name describe reports (a well-formed one) resolves, to a function that has
//     that name.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <libelf.h>

#include "arch/unwind_table.h"
#include "tracee/code_sections.h"
#include "tracee/elf_symbols.h"
#include "tracee/proc_maps.h"
#include "tracee/untraceable.h"
#include "tracee/unwind_tables.h"

using namespace probefs::tracee;

namespace {

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

bool well_formed(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == ':') return false;
  }
  return true;
}

void check_resolved(const ResolvedSymbol& r, uintptr_t asked) {
  if (r.function.known()) CHECK(r.function.contains(asked));
}

void describe_and_resolve(const ProcessSymbols& syms, uintptr_t addr) {
  ResolvedSymbol r;
  if (syms.describe(addr, &r) != 0) return;
  check_resolved(r, addr);
  if (!well_formed(r.name)) return;
  ResolvedSymbol again;
  CHECK(syms.resolve(r.name, &again) == 0);
  check_resolved(again, again.addr);
}

// An input that is no ELF object is read as /proc/PID/maps text: each line through the
// hand-written parser, whose every accepted line must name a file.
void maps_lines(std::string_view text) {
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    Mapping m;
    if (parse_maps_line(text.substr(0, nl), &m)) {
      CHECK(!m.path.empty() && m.path.front() == '/');
      CHECK(m.inode != 0);
    }
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

// The unwind table of the input's bytes mapped whole: well formed whenever it is built.
void unwind_table(const uint8_t* data, size_t size) {
  static const bool init = elf_version(EV_CURRENT) != EV_NONE;
  if (!init) return;
  Elf* elf = elf_memory(reinterpret_cast<char*>(const_cast<uint8_t*>(data)), size);
  if (elf == nullptr) return;
  const uint64_t length = (uint64_t{size} + 4095) & ~uint64_t{4095};
  std::vector<uint8_t> table;
  if (build_unwind_table(elf, 0, length, &table) == 0) {
    constexpr uint64_t kStart = 0x10000;
    probefs::arch::UnwindTableView v;
    CHECK(probefs::arch::unwind_table_view(table.data(), table.size(), kStart, kStart + length, &v));
    for (uint64_t off = 0; off < length; off += 61) (void)probefs::arch::unwind_row(v, kStart + off);
  }
  elf_end(elf);
}

// The instruction at a few file offsets (the start, the middle, one the input names in
// its last bytes), read through section_instruction: one it finds lies in the file.
void section_instructions(const uint8_t* data, size_t size) {
  const FileBytes file = [&](uint64_t at, void* out, size_t n) {
    if (at > size || size - at < n) return false;
    memcpy(out, data + at, n);
    return true;
  };
  uint64_t named = 0;
  if (size >= 8) memcpy(&named, data + size - 8, 4);
  for (uint64_t off : {uint64_t{0}, uint64_t{size / 2}, named}) {
    size_t len = 0;
    if (section_instruction(file, off, &len) == 0) CHECK(len >= 1 && len <= 15 && off + len <= size);
  }
}

// The bytes as a program file: judged static, foreign, secure-exec or enterable, never
// anything else, and said in one line when not enterable.
void judged_as_program(const uint8_t* data, size_t size) {
  const int fd = memfd_create("fuzz-program", MFD_CLOEXEC);
  if (fd < 0) return;
  if (write(fd, data, size) == static_cast<ssize_t>(size)) {
    const Untraceable u =
        untraceable_program("/proc/self/fd/" + std::to_string(fd), getuid(), getgid());
    CHECK(u.state.empty() || u.state == "static" || u.state == "foreign" ||
          u.state == "secure-exec");
    CHECK(u.state.empty() == u.why.empty());
  }
  close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || data[0] != 0x7f) {
    maps_lines(std::string_view(reinterpret_cast<const char*>(data), size));
    return 0;
  }
  unwind_table(data, size);
  section_instructions(data, size);
  judged_as_program(data, size);
  int err = 0;
  auto syms = ProcessSymbols::load_image(
      std::string_view(reinterpret_cast<const char*>(data), size), "/fuzz/libfuzz.so.1", &err);
  if (!syms) {
    CHECK(err < 0);
    return 0;
  }
  const std::vector<MappedObject> objects = syms->objects();
  CHECK(objects.size() == 1);

  // Names every object may have, with and without the module.
  for (const char* name : {"main", "_start", "_init", "foo", "libfuzz:foo", "libfuzz.so:bar"}) {
    ResolvedSymbol r;
    if (syms->resolve(name, &r) == 0) check_resolved(r, r.addr);
  }
  // USDT points (SDT notes), whatever the notes say: found ones are there, and their
  // argument specs are whole strings.
  for (const char* provider : {"python", "sdtprog", "p"}) {
    std::vector<SdtPoint> points;
    if (syms->sdt_points("", provider, "line", &points) != 0) continue;
    CHECK(!points.empty());
    for (const SdtPoint& pt : points) CHECK(pt.args.find('\0') == std::string::npos);
  }
  // Addresses across the object's span, and a few the input names in its last bytes.
  const MappedObject& o = objects[0];
  if (o.start < o.end) {
    const uintptr_t span = o.end - o.start;
    for (uintptr_t a : {o.start, o.start + 1, o.start + span / 3, o.start + span / 2,
                        o.end - 1}) {
      describe_and_resolve(*syms, a);
    }
  }
  for (size_t i = 0; i + 4 <= size && i < 16; i += 4) {
    const uint8_t* p = data + size - 4 - i;
    const uintptr_t a = uintptr_t{p[0]} | uintptr_t{p[1]} << 8 | uintptr_t{p[2]} << 16 |
                        uintptr_t{p[3]} << 24;
    describe_and_resolve(*syms, a);
  }
  return 0;
}
