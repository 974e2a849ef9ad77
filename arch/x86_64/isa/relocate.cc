#include "arch/x86_64/isa/relocate.h"

#include <cerrno>
#include <cstring>

namespace probefs::arch::x86_64 {
namespace {

void put32(uint8_t* p, int32_t v) { std::memcpy(p, &v, 4); }
void put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

int32_t rel32(uintptr_t from_next, uintptr_t to) {
  return static_cast<int32_t>(static_cast<int64_t>(to - from_next));
}

// Re-aims the rip-relative disp32 of a copy that will sit at new_pc and be `len` long.
int reaim_rip_disp(const Insn& insn, uint8_t* copy, uintptr_t new_pc, size_t len) {
  int32_t disp;
  std::memcpy(&disp, insn.bytes + insn.disp_offset, 4);
  const uintptr_t abs = insn.next() + static_cast<int64_t>(disp);
  if (!fits_rel32(new_pc + len, abs)) return -ERANGE;
  put32(copy + insn.disp_offset, rel32(new_pc + len, abs));
  return 0;
}

// push qword [rip+k] ; <transfer> ; k: .quad ret — a call whose pushed return address is
// the original one, so the callee returns to the probed code, not to the copy.
int emit_call_like(const Insn& insn, uintptr_t new_pc, uint8_t* out, size_t cap) {
  uint8_t transfer[kMaxInsnLen + kJmpAbsLen];
  size_t tlen;
  const uintptr_t transfer_pc = new_pc + 6;
  if (insn.kind == InsnKind::kCallRel) {
    tlen = emit_jmp(transfer, transfer_pc, insn.target);
  } else {  // call r/m -> jmp r/m: same encoding with ModRM.reg 2 -> 4
    if (insn.uses_rsp) return -EINVAL;  // the push would move what the operand reads
    tlen = insn.len;
    std::memcpy(transfer, insn.bytes, tlen);
    const unsigned modrm = insn.opcode_offset + 1u;
    transfer[modrm] = static_cast<uint8_t>((transfer[modrm] & ~0x38) | (4 << 3));
    if (insn.uses_rip) {
      if (int rc = reaim_rip_disp(insn, transfer, transfer_pc, tlen); rc) return rc;
    }
  }
  const size_t total = 6 + tlen + 8;
  if (total > cap) return -EINVAL;
  out[0] = 0xff;  // push qword [rip+disp32]
  out[1] = 0x35;
  put32(out + 2, static_cast<int32_t>(tlen));  // the constant follows the transfer
  std::memcpy(out + 6, transfer, tlen);
  put64(out + 6 + tlen, insn.next());
  return static_cast<int>(total);
}

}  // namespace

bool fits_rel32(uintptr_t from_next, uintptr_t to) {
  const int64_t d = static_cast<int64_t>(to - from_next);
  return d >= INT32_MIN && d <= INT32_MAX;
}

size_t emit_jmp(uint8_t* out, uintptr_t at, uintptr_t to) {
  if (fits_rel32(at + kJmpRel32Len, to)) {
    out[0] = 0xe9;
    put32(out + 1, rel32(at + kJmpRel32Len, to));
    return kJmpRel32Len;
  }
  out[0] = 0xff;  // jmp qword [rip+0]
  out[1] = 0x25;
  put32(out + 2, 0);
  put64(out + 6, to);
  return kJmpAbsLen;
}

int relocate(const Insn& insn, uintptr_t new_pc, uint8_t* out, size_t cap) {
  if (cap < kMaxRelocatedLen) return -EINVAL;
  switch (insn.kind) {
    case InsnKind::kPlain:
    case InsnKind::kSyscall:
    case InsnKind::kRet:
      std::memcpy(out, insn.bytes, insn.len);
      return insn.len;
    case InsnKind::kRipRelative:
    case InsnKind::kJmpIndirect:
      std::memcpy(out, insn.bytes, insn.len);
      if (insn.disp_offset) {
        if (int rc = reaim_rip_disp(insn, out, new_pc, insn.len); rc) return rc;
      }
      return insn.len;
    case InsnKind::kJmpRel:
      return static_cast<int>(emit_jmp(out, new_pc, insn.target));
    case InsnKind::kJccRel:
      if (fits_rel32(new_pc + 6, insn.target)) {
        out[0] = 0x0f;
        out[1] = static_cast<uint8_t>(0x80 | insn.cond);
        put32(out + 2, rel32(new_pc + 6, insn.target));
        return 6;
      } else {
        out[0] = static_cast<uint8_t>(0x70 | (insn.cond ^ 1));  // skip the jump if !cond
        const size_t jmp_len = emit_jmp(out + 2, new_pc + 2, insn.target);
        out[1] = static_cast<uint8_t>(jmp_len);
        return 2 + static_cast<int>(jmp_len);
      }
    case InsnKind::kLoopRel: {
      // Keep the prefixes (0x67 selects jecxz) and the opcode; aim rel8 past a short jmp.
      const size_t head = insn.opcode_offset + 2u;
      std::memcpy(out, insn.bytes, head);
      out[head - 1] = 2;
      const size_t jmp_len = emit_jmp(out + head + 2, new_pc + head + 2, insn.target);
      out[head] = 0xeb;  // not taken: jump over the far jmp
      out[head + 1] = static_cast<uint8_t>(jmp_len);
      return static_cast<int>(head + 2 + jmp_len);
    }
    case InsnKind::kCallRel:
    case InsnKind::kCallIndirect:
      return emit_call_like(insn, new_pc, out, cap);
    case InsnKind::kTrap:
    case InsnKind::kPrivileged:
    case InsnKind::kUnsupported:
      break;
  }
  return -EINVAL;
}

int copy_for_singlestep(const Insn& insn, uintptr_t new_pc, uint8_t* out) {
  switch (insn.kind) {
    case InsnKind::kPlain:
    case InsnKind::kSyscall:
    case InsnKind::kRipRelative:
    case InsnKind::kJmpIndirect:
    case InsnKind::kCallIndirect:
      std::memcpy(out, insn.bytes, insn.len);
      if (insn.disp_offset) {
        if (int rc = reaim_rip_disp(insn, out, new_pc, insn.len); rc) return rc;
      }
      return insn.len;
    default:
      return -EINVAL;  // relative branches and ret are emulated, never stepped
  }
}

bool condition_holds(uint8_t cond, uint64_t f) {
  const bool cf = f & (1u << 0), pf = f & (1u << 2), zf = f & (1u << 6), sf = f & (1u << 7),
             of = f & (1u << 11);
  bool r;
  switch (cond >> 1) {
    case 0: r = of; break;
    case 1: r = cf; break;
    case 2: r = zf; break;
    case 3: r = cf || zf; break;
    case 4: r = sf; break;
    case 5: r = pf; break;
    case 6: r = sf != of; break;
    default: r = zf || (sf != of); break;
  }
  return (cond & 1) ? !r : r;
}

}  // namespace probefs::arch::x86_64
