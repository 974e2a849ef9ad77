#include "tracee/probe_places.h"

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "events/parse.h"
#include "tracee/code_sections.h"
#include "tracee/unique_fd.h"

namespace probefs::tracee {

int identify_file(const std::string& path, FileIdentity* out) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return -errno;
  out->dev = st.st_dev;
  out->inode = st.st_ino;
  return 0;
}

int symbol_file_offset(const std::string& path, std::string_view symbol, uint64_t* offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return -ENOENT;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int err = 0;
  auto syms = ProcessSymbols::load_image(bytes, path, &err);
  if (!syms) return err;
  ResolvedSymbol rs;
  if (int e = syms->resolve(symbol, &rs); e != 0) return e;
  // load_image maps the object at its own virtual addresses: rs.addr is the symbol's.
  if (bytes.size() < sizeof(Elf64_Ehdr)) return -ENOEXEC;
  Elf64_Ehdr eh;
  memcpy(&eh, bytes.data(), sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return -ENOEXEC;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    const uint64_t at = eh.e_phoff + uint64_t{i} * sizeof ph;
    if (at > bytes.size() || bytes.size() - at < sizeof ph) return -ENOEXEC;
    memcpy(&ph, bytes.data() + at, sizeof ph);
    if (ph.p_type == PT_LOAD && ph.p_vaddr <= rs.addr && rs.addr - ph.p_vaddr < ph.p_filesz) {
      *offset = rs.addr - ph.p_vaddr + ph.p_offset;
      return 0;
    }
  }
  return -ENOENT;
}

namespace {

void name_place(const ProcessSymbols& syms, ProbePlace* p) {
  ResolvedSymbol rs;
  if (syms.describe(p->addr, &rs) != 0) return;
  p->bounds = rs.function;
  p->module = rs.module;
  if (!rs.name.empty()) {
    p->symbol = rs.name;
    p->symbol_offset = p->addr - rs.addr;
  }
}

// The length of the instruction at file offset `offset` of the file mapping `m` of
// process `pid` maps (code_sections.h), opened as every mapped file is (open_mapped_file:
// that very file, never whatever is at its path now). 0 and *len, or a negative errno.
int mapped_instruction(pid_t pid, const Mapping& m, uint64_t offset, size_t* len) {
  const UniqueFd file(open_mapped_file(pid, m));
  const int fd = file.get();
  if (fd < 0) return fd;
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  return section_instruction(
      [&](uint64_t at, void* out, size_t n) {
        return at <= size && size - at >= n &&
               pread(fd, out, n, static_cast<off_t>(at)) == static_cast<ssize_t>(n);
      },
      offset, len);
}

// Where the u16 at file offset `offset` of `file` is, for the load whose code is at
// `code`: the writable mapping of the file that holds it, the nearest to the code (a
// file loaded twice has one of each per load); 0 when none does.
uintptr_t ref_ctr_address(const FileIdentity& file, const std::vector<Mapping>& maps,
                          uint64_t offset, uintptr_t code) {
  uintptr_t best = 0;
  uintptr_t best_distance = UINTPTR_MAX;
  for (const Mapping& m : maps) {
    if (m.dev != file.dev || m.inode != file.inode || !m.write || m.exec) continue;
    if (offset < m.offset || offset - m.offset > m.end - m.start - 2) continue;
    const uintptr_t at = m.start + (offset - m.offset);
    const uintptr_t distance = at > code ? at - code : code - at;
    if (distance < best_distance) {
      best = at;
      best_distance = distance;
    }
  }
  return best;
}

PlaceStatus place_uprobe(const events::ProbeDefinition& def, const FileIdentity& file,
                         const std::vector<Mapping>& maps, const ProcessSymbols& syms,
                         std::vector<ProbePlace>* places) {
  bool mapped = false;
  for (const Mapping& m : maps) {
    if (m.dev != file.dev || m.inode != file.inode) continue;
    mapped = true;
    const uint64_t len = m.end - m.start;
    if (!m.exec || def.offset < m.offset || def.offset - m.offset >= len) continue;
    ProbePlace p;
    p.addr = m.start + (def.offset - m.offset);
    if (def.ref_ctr_offset != 0) p.ref_ctr = ref_ctr_address(file, maps, def.ref_ctr_offset, p.addr);
    name_place(syms, &p);
    size_t insn_len = 0;
    if (!p.bounds.known() && mapped_instruction(syms.pid(), m, def.offset, &insn_len) == 0) {
      // Code no function describes, reached from anywhere (a .plt stub is called from
      // all over the object): the probe's bounds are its own instruction, which proves
      // the boundary to the engine and lets a jmp replace nothing but that instruction.
      p.bounds.start = p.addr;
      p.bounds.end = p.addr + insn_len;
    }
    places->push_back(std::move(p));
  }
  // A file mapped without its offset in code never fires there, as with kernel uprobes;
  // it may still be mapped differently later (another dlopen of it).
  (void)mapped;
  return places->empty() ? PlaceStatus::kNotYet : PlaceStatus::kPlaced;
}

// The places of a USDT point, `[MOD:]%PROVIDER:NAME`: each note of that name in the
// object, with its semaphore where a writable mapping of the object holds it, and bounds
// of its own instruction where no function describes it.
PlaceStatus place_sdt(const events::ProbeDefinition& def, const std::vector<Mapping>& maps,
                      const ProcessSymbols& syms, std::vector<ProbePlace>* places,
                      events::Diagnostic* diag) {
  if (!def.module.empty() && !syms.has_module(def.module)) return PlaceStatus::kNotYet;
  const std::string_view point = std::string_view(def.symbol).substr(1);
  const size_t colon = point.find(':');
  std::vector<SdtPoint> points;
  const int err = syms.sdt_points(def.module, point.substr(0, colon), point.substr(colon + 1),
                                  &points);
  if (err == -ENOENT) {
    if (def.module.empty()) return PlaceStatus::kAbsent;
    *diag = events::make_diagnostic(def, events::ErrorCode::kBadProbeAddr, 1, 0, ENOENT);
    return PlaceStatus::kError;
  }
  if (err != 0) {
    *diag = events::make_diagnostic(
        def, err == -ESTALE ? events::ErrorCode::kMappedFileGone : events::ErrorCode::kBadProbeAddr,
        1, 0, -err);
    return PlaceStatus::kError;
  }
  for (const SdtPoint& pt : points) {
    ProbePlace p;
    p.addr = pt.addr;
    p.sdt_args = pt.args;
    const Mapping* code = nullptr;
    for (const Mapping& m : maps)
      if (m.exec && m.start <= pt.addr && pt.addr < m.end) code = &m;
    if (code == nullptr) continue;  // not in code as mapped: it never runs
    if (pt.semaphore != 0) {
      for (const Mapping& m : maps)
        if (m.write && !m.exec && m.dev == code->dev && m.inode == code->inode &&
            m.start <= pt.semaphore && pt.semaphore + 2 <= m.end)
          p.ref_ctr = pt.semaphore;
    }
    name_place(syms, &p);
    size_t insn_len = 0;
    if (!p.bounds.known() &&
        mapped_instruction(syms.pid(), *code, pt.addr - code->start + code->offset, &insn_len) == 0) {
      p.bounds.start = p.addr;
      p.bounds.end = p.addr + insn_len;
    }
    places->push_back(std::move(p));
  }
  return places->empty() ? PlaceStatus::kNotYet : PlaceStatus::kPlaced;
}

}  // namespace

PlaceStatus place_probe(const events::ProbeDefinition& def, const FileIdentity& file,
                        const std::vector<Mapping>& maps, const ProcessSymbols& syms,
                        std::vector<ProbePlace>* places, events::Diagnostic* diag) {
  places->clear();
  if (def.syntax == events::ProbeSyntax::kUprobe)
    return place_uprobe(def, file, maps, syms, places);

  ProbePlace p;
  if (!def.on_symbol()) {
    p.addr = def.address;
    name_place(syms, &p);
    places->push_back(std::move(p));
    return PlaceStatus::kPlaced;
  }
  if (def.on_sdt()) return place_sdt(def, maps, syms, places, diag);
  if (!def.module.empty() && !syms.has_module(def.module)) return PlaceStatus::kNotYet;
  const std::string name = def.module.empty() ? def.symbol : def.module + ":" + def.symbol;
  ResolvedSymbol rs;
  int err = syms.resolve(name, &rs);
  if (err == -ENOENT) {
    if (!def.module.empty()) {
      // The module is there but not the symbol: the kernel's failed registration.
      *diag = events::make_diagnostic(def, events::ErrorCode::kBadProbeAddr, 1, 0, ENOENT);
      return PlaceStatus::kError;
    }
    return PlaceStatus::kAbsent;
  }
  if (err == -EADDRNOTAVAIL) {
    // Static functions of several sources share the name: which one is meant?
    *diag = events::make_diagnostic(def, events::ErrorCode::kNonUniqSymbol, 1, 0, EADDRNOTAVAIL);
    return PlaceStatus::kError;
  }
  if (err == -ESTALE) {
    // The target runs a file the daemon can no longer read as it was mapped (rebuilt,
    // upgraded, deleted): refused, not looked up in whatever is at its path now.
    *diag = events::make_diagnostic(def, events::ErrorCode::kMappedFileGone, 1, 0);
    return PlaceStatus::kError;
  }
  if (err != 0) {
    *diag = events::make_diagnostic(def, events::ErrorCode::kBadProbeAddr, 1, 0, -err);
    return PlaceStatus::kError;
  }
  p.addr = rs.addr + def.offset;
  p.bounds = rs.function;
  p.module = rs.module;
  p.symbol = rs.name;
  p.symbol_offset = def.offset;
  p.note = ifunc_note(rs);
  if (def.offset != 0 && rs.function.known() && !rs.function.contains(p.addr)) {
    // SYM+OFFS past the end of SYM: name what is there instead, as kprobes/list would.
    name_place(syms, &p);
  }
  places->push_back(std::move(p));
  return PlaceStatus::kPlaced;
}

}  // namespace probefs::tracee
