// libFuzzer target for the ISA toolkit: arbitrary bytes as a function, decoded at every
// offset, relocated, and checked for jump optimization at every instruction boundary.
//
// Input:
//   byte 0   where relocated copies go: 0 near (rel32 reach), 1 far (beyond it), 2 right
//            after the code, 3 below it
//   byte 1   the function's length (0: all the rest, up to 255); what follows it is memory
//            (jump tables) and, with byte 2's top bit set, related code (`foo.cold`)
//   byte 2   low 7 bits: a landing pad's offset into the function (0x7f: none)
//   rest     the image, "mapped" at kBase; ReadMemory serves exactly its bytes
//
// Broken invariants trap (__builtin_trap), so libFuzzer reports them like crashes:
//   - decode reports a length within 1..15 and within the bytes, and copies them;
//   - at every offset, decode and shape_of agree with the Capstone oracle, or differ in a
//     way x86_64/isa/decoder_diff.cc documents;
//   - a relocated instruction decodes back to the same kind of instruction, reaching the
//     same absolute target; a single-step copy has the instruction's own length;
//   - check_boundary agrees with a linear sweep;
//   - a refusal from kCallInRegion on shows the region, an earlier one none;
//   - an optimizable region is whole, relocatable instructions from the probe address,
//     at least a jmp long, inside the function, with no direct branch, landing pad or
//     related-code branch arriving strictly inside it.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "arch/x86_64/isa/insn.h"
#include "arch/x86_64/isa/optimize_check.h"
#include "arch/x86_64/isa/relocate.h"
#include "tests/arch/x86_64/isa/decoder_diff.h"

using namespace probefs::arch::x86_64;

namespace {

constexpr uintptr_t kBase = 0x7f1200400000;
constexpr size_t kEveryOffsetBytes = 32;

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct Image {
  const uint8_t* bytes;
  size_t size;
};

bool read_image(void* ctx, uintptr_t addr, void* buf, size_t n) {
  const auto* img = static_cast<const Image*>(ctx);
  if (addr < kBase || addr - kBase > img->size || n > img->size - (addr - kBase)) return false;
  std::memcpy(buf, img->bytes + (addr - kBase), n);
  return true;
}

int64_t rip_disp(const Insn& i) {
  int32_t d;
  std::memcpy(&d, i.bytes + i.disp_offset, 4);
  return d;
}

uintptr_t rip_target(const Insn& i) { return i.next() + static_cast<uintptr_t>(rip_disp(i)); }

bool has_direct_target(const Insn& i) {
  return i.kind == InsnKind::kJmpRel || i.kind == InsnKind::kJccRel ||
         i.kind == InsnKind::kCallRel || i.kind == InsnKind::kLoopRel;
}

// out[0..n) at pc is a jmp to `to`: rel32, or jmp *0(%rip) followed by the address.
void check_jmp_to(const uint8_t* out, int n, uintptr_t pc, uintptr_t to) {
  Insn jmp;
  CHECK(n > 0 && decode(out, static_cast<size_t>(n), pc, &jmp) == 0);
  if (jmp.kind == InsnKind::kJmpRel) {
    CHECK(jmp.len == n && jmp.target == to);
    return;
  }
  CHECK(jmp.kind == InsnKind::kJmpIndirect && n == static_cast<int>(kJmpAbsLen) &&
        jmp.uses_rip && rip_target(jmp) == pc + 6);
  uint64_t abs;
  std::memcpy(&abs, out + 6, 8);
  CHECK(abs == to);
}

// What relocate() wrote at `pc` must do what `insn` does (relocate.h's table of forms).
void check_relocated(const Insn& insn, const uint8_t* out, int n, uintptr_t pc) {
  CHECK(n > 0 && static_cast<size_t>(n) <= kMaxRelocatedLen);
  Insn first;
  CHECK(decode(out, static_cast<size_t>(n), pc, &first) == 0);
  switch (insn.kind) {
    case InsnKind::kPlain:
    case InsnKind::kSyscall:
    case InsnKind::kRet:
      CHECK(n == insn.len && std::memcmp(out, insn.bytes, insn.len) == 0);
      break;
    case InsnKind::kRipRelative:
    case InsnKind::kJmpIndirect:
      CHECK(n == insn.len && first.len == insn.len && first.kind == insn.kind);
      if (insn.disp_offset != 0) {
        CHECK(first.disp_offset == insn.disp_offset);
        CHECK(rip_target(first) == rip_target(insn));
      }
      break;
    case InsnKind::kJmpRel:
      check_jmp_to(out, n, pc, insn.target);
      break;
    case InsnKind::kJccRel:
      CHECK(first.kind == InsnKind::kJccRel);
      if (first.len == n) {  // jcc rel32 straight to the target
        CHECK(first.cond == insn.cond && first.target == insn.target);
      } else {  // j!cc over a jmp to the target
        CHECK(first.cond == (insn.cond ^ 1) && first.target == pc + static_cast<uintptr_t>(n));
        check_jmp_to(out + first.len, n - first.len, pc + first.len, insn.target);
      }
      break;
    case InsnKind::kLoopRel: {
      // loop +2 ; jmp short past ; jmp target
      CHECK(first.kind == InsnKind::kLoopRel && first.loop == insn.loop);
      CHECK(first.target == first.next() + 2);
      Insn over;
      CHECK(decode(out + first.len, static_cast<size_t>(n) - first.len, first.next(), &over) == 0);
      CHECK(over.kind == InsnKind::kJmpRel && over.len == 2);
      CHECK(over.target == pc + static_cast<uintptr_t>(n));
      check_jmp_to(out + first.len + 2, n - first.len - 2, over.next(), insn.target);
      break;
    }
    case InsnKind::kCallRel:
    case InsnKind::kCallIndirect: {
      // push [rip+k] with k holding the original return address, then the transfer.
      CHECK(first.kind == InsnKind::kRipRelative && first.len == 6);
      const uintptr_t k = rip_target(first);
      CHECK(k >= pc + 6 && k + 8 == pc + static_cast<uintptr_t>(n));
      uint64_t ret;
      std::memcpy(&ret, out + (k - pc), 8);
      CHECK(ret == insn.next());
      Insn transfer;
      CHECK(decode(out + 6, static_cast<size_t>(n) - 6 - 8, pc + 6, &transfer) == 0);
      if (insn.kind == InsnKind::kCallRel) {
        check_jmp_to(out + 6, n - 6 - 8, pc + 6, insn.target);
      } else {  // the same operand, jumped through: call r/m -> jmp r/m
        CHECK(transfer.kind == InsnKind::kJmpIndirect && transfer.len == insn.len);
        if (insn.uses_rip) CHECK(rip_target(transfer) == rip_target(insn));
      }
      break;
    }
    default:
      CHECK(false);  // traps, privileged and unsupported instructions never relocate
  }
}

void check_insn(const uint8_t* code, size_t avail, uintptr_t pc, const Insn& insn,
                uintptr_t new_pc) {
  CHECK(insn.len >= 1 && insn.len <= kMaxInsnLen && insn.len <= avail);
  CHECK(insn.addr == pc && std::memcmp(insn.bytes, code, insn.len) == 0);
  CHECK(insn.opcode_offset < insn.len);
  if (insn.kind == InsnKind::kRipRelative) {
    CHECK(insn.disp_offset != 0 && insn.disp_offset + 4u <= insn.len);
  }
  if (insn.ends_flow()) CHECK(insn.is_branch());

  uint8_t out[kMaxRelocatedLen];
  const int n = relocate(insn, new_pc, out, sizeof out);
  if (n > 0) {
    check_relocated(insn, out, n, new_pc);
  } else {
    CHECK(n == -EINVAL || n == -ERANGE);
  }
  uint8_t step[kMaxInsnLen];
  const int s = copy_for_singlestep(insn, new_pc, step);
  if (s > 0) {
    CHECK(s == insn.len);
    Insn copy;
    CHECK(decode(step, static_cast<size_t>(s), new_pc, &copy) == 0 && copy.len == insn.len);
  } else {
    CHECK(s == -EINVAL || s == -ERANGE);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t where = data[0] % 4;
  const size_t image_size = size - 3;
  // At most 255 bytes: long enough for a switch with its table setup, short enough that
  // the checks at each boundary (each a sweep of the whole function) stay quick.
  const size_t func_len = data[1] == 0 || data[1] > image_size ? std::min<size_t>(image_size, 255)
                                                               : data[1];
  const bool related_code = (data[2] & 0x80) != 0 && func_len < image_size;
  const uint8_t pad_byte = data[2] & 0x7f;
  const Image img{data + 3, image_size};
  const uint8_t* code = img.bytes;
  const uintptr_t start = kBase;
  const uintptr_t end = kBase + func_len;
  const uintptr_t new_pc = where == 0   ? start + (uintptr_t{1} << 30)
                           : where == 1 ? start + (uintptr_t{5} << 32)
                           : where == 2 ? kBase + image_size
                                        : start - 0x1000;

  // Every offset decodes to something or fails cleanly; the linear sweep's boundaries.
  std::vector<bool> boundary(func_len, false);
  std::vector<Insn> sweep;
  bool sweep_complete = true;
  for (size_t off = 0; off < func_len; ++off) {
    Insn insn;
    CHECK(probefs::arch::x86_64::difftest::compare(code + off, func_len - off, start + off)
              .category != probefs::arch::x86_64::difftest::Category::kUnexplained);
    const int rc = decode(code + off, func_len - off, start + off, &insn);
    if (rc != 0) {
      CHECK(rc == -EILSEQ);
      continue;
    }
    check_insn(code + off, func_len - off, start + off, insn, new_pc);
  }
  for (size_t off = 0; off < func_len;) {
    boundary[off] = true;
    Insn insn;
    if (decode(code + off, func_len - off, start + off, &insn) != 0) {
      sweep_complete = false;
      break;
    }
    sweep.push_back(insn);
    off += insn.len;
  }
  // check_boundary proves a boundary by decoding up to it: it agrees with the sweep, on
  // each boundary and on the byte after it (each call decodes from the start, so not at
  // every offset: a run stays fast enough to explore).
  for (size_t off = 0; off < func_len; ++off) {
    if (boundary[off] || (off > 0 && boundary[off - 1])) {
      CHECK((check_boundary(code, start, end, start + off) == 0) == boundary[off]);
    }
  }

  // The related code: the image after the function, decoded as its own piece.
  RelatedCode related;
  std::vector<Insn> related_sweep;
  if (related_code) {
    related = {code + func_len, end, kBase + image_size};
    for (uintptr_t pc = related.start; pc < related.end;) {
      Insn insn;
      if (decode(code + (pc - start), related.end - pc, pc, &insn) != 0) break;
      related_sweep.push_back(insn);
      pc += insn.len;
    }
  }
  const uintptr_t pad = start + pad_byte;
  OutsideEntries outside;
  if (related_code) {
    outside.related = &related;
    outside.n_related = 1;
  }
  if (pad_byte != 0x7f) {
    outside.addrs = &pad;
    outside.n_addrs = 1;
  }

  // The checks at every boundary, and at every offset of the first bytes (elsewhere an
  // offset inside an instruction takes the same path: each call decodes the whole
  // function, so every offset of a long one would slow the search down for nothing new).
  for (size_t off = 0; off < func_len; ++off) {
    if (!boundary[off] && off >= kEveryOffsetBytes) continue;
    const uintptr_t addr = start + off;
    OptimizeRegion region;
    const OptimizeRefusal r =
        check_optimizable(code, start, end, addr, &read_image, const_cast<Image*>(&img),
                          outside, &region);
    CHECK(refusal_text(r) != nullptr);
    if (r >= OptimizeRefusal::kCallInRegion) {
      CHECK(region.addr == addr && region.len >= kJmpRel32Len && region.end() <= end);
    } else if (r != OptimizeRefusal::kNone) {
      CHECK(region.len == 0);
    }
    if (r != OptimizeRefusal::kNone) continue;

    // Optimizable: the function decoded whole and addr is one of its boundaries.
    CHECK(sweep_complete && boundary[off]);
    CHECK(region.addr == addr && region.len >= kJmpRel32Len && region.end() <= end);
    CHECK(region.count >= 1 && region.count <= kJmpRel32Len);
    uintptr_t pc = addr;
    for (uint8_t i = 0; i < region.count; ++i) {
      const Insn& in = region.insns[i];
      CHECK(in.addr == pc && boundary[pc - start]);
      Insn again;
      CHECK(decode(code + (pc - start), end - pc, pc, &again) == 0 && again.len == in.len);
      CHECK(in.kind != InsnKind::kCallRel && in.kind != InsnKind::kCallIndirect &&
            in.kind != InsnKind::kSyscall && in.kind != InsnKind::kTrap &&
            in.kind != InsnKind::kPrivileged && in.kind != InsnKind::kUnsupported);
      // It relocates to a detour placed near the code (the checks leave the exact place
      // to the detour builder, which may still refuse with -ERANGE).
      uint8_t copy[kMaxRelocatedLen];
      const uintptr_t near = uintptr_t{64} << 20;
      CHECK(relocate(in, in.addr + near, copy, sizeof copy) > 0 ||
            relocate(in, in.addr - near, copy, sizeof copy) > 0);
      pc += in.len;
    }
    CHECK(pc == region.end());
    // Nothing the checks were shown arrives strictly inside the region.
    auto strictly_inside = [&](uintptr_t a) { return a > region.addr && a < region.end(); };
    for (const Insn& in : sweep) {
      if (has_direct_target(in)) CHECK(!strictly_inside(in.target));
    }
    for (const Insn& in : related_sweep) {
      if (has_direct_target(in)) CHECK(!strictly_inside(in.target));
    }
    if (outside.n_addrs != 0) CHECK(!strictly_inside(pad));
  }
  return 0;
}
