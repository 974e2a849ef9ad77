// Decoding and classification for probing, on the ISA toolkit's own decoder (decoder.h):
// the decoder gives lengths and where each part of an instruction is; the control-flow
// opcodes and the instructions that are never probed are recognised here by opcode. What
// the decoder does not know to exist is never probed either.
#include "arch/x86_64/isa/insn.h"

#include "arch/x86_64/isa/decoder.h"

#include <cerrno>
#include <cstring>

namespace probefs::arch::x86_64 {
namespace {

using decoder::Decoded;

int64_t read_rel(const uint8_t* p, unsigned size) {
  if (size == 1) return static_cast<int8_t>(p[0]);
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The instructions of the legacy maps that are never probed, other than the control
// transfers decode() handles itself: kTrap, kPrivileged, kUnsupported, or kPlain for the
// rest.
InsnKind never_probed(const Decoded& d) {
  const uint8_t op = d.opcode, reg = d.reg(), p = d.mandatory;
  const bool mem = d.memory();
  if (d.map == decoder::kMapOne) {
    switch (op) {
      case 0x6c: case 0x6d: case 0x6e: case 0x6f:  // ins outs
      case 0xe4: case 0xe5: case 0xe6: case 0xe7:  // in out imm8
      case 0xec: case 0xed: case 0xee: case 0xef:  // in out dx
      case 0xf4: case 0xfa: case 0xfb:             // hlt cli sti
      case 0x8e:                                   // mov Sreg, r/m
        return InsnKind::kPrivileged;
      case 0xc7:                                   // xbegin: a branch to its fallback
        return reg == 7 ? InsnKind::kUnsupported : InsnKind::kPlain;
      default:
        return InsnKind::kPlain;
    }
  }
  if (d.map == decoder::kMap0F38) {
    switch (op) {
      case 0x80: case 0x81: case 0x82:  // invept invvpid invpcid
        return InsnKind::kPrivileged;
      case 0xf5:                        // wruss
        return InsnKind::kPrivileged;
      case 0xf6:                        // wrss writes the shadow stack
        return p == 0 ? InsnKind::kUnsupported : InsnKind::kPlain;
      case 0xf8:                        // enqcmds
        return p == 0xf3 ? InsnKind::kPrivileged : InsnKind::kPlain;
      default:
        return InsnKind::kPlain;
    }
  }
  if (d.map != decoder::kMap0F) return InsnKind::kPlain;
  switch (op) {
    case 0x00:  // str (under UMIP), lldt ltr
      return reg >= 1 && reg <= 3 ? InsnKind::kPrivileged : InsnKind::kPlain;
    case 0x01:
      if (mem) {
        if (reg == 5) return InsnKind::kUnsupported;  // rstorssp: switches shadow stacks
        // lgdt lidt lmsw invlpg; sgdt sidt smsw read only
        return reg == 2 || reg == 3 || reg >= 6 ? InsnKind::kPrivileged : InsnKind::kPlain;
      }
      switch (d.modrm) {
        case 0xd0:              // xgetbv
        case 0xd5: case 0xd6:   // xend xtest
        case 0xfc: case 0xfd:   // clzero rdpru
        case 0xee: case 0xef:   // rdpkru wrpkru
          return InsnKind::kPlain;
        case 0xe8:              // serialize; setssbsy
          return p == 0 ? InsnKind::kPlain : InsnKind::kPrivileged;
        case 0xd4: case 0xd7:   // vmfunc, enclu: leave for other code
        case 0xea:              // saveprevssp
          return InsnKind::kUnsupported;
        default:                // vmx, monitor/mwait, clac/stac, encls, xsetbv, svm,
                                // swapgs, rdtscp (under CR4.TSD), smsw/lmsw r,
                                // monitorx/mwaitx, pconfig
          return reg == 4 ? InsnKind::kPlain : InsnKind::kPrivileged;
      }
    case 0x05:  // syscall: decode() handles it
      return InsnKind::kPlain;
    case 0x06: case 0x08: case 0x09:  // clts invd wbinvd
    case 0x20: case 0x21: case 0x22: case 0x23:  // mov CRn/DRn
    case 0x30: case 0x32: case 0x33:  // wrmsr rdmsr rdpmc
    case 0x37:                        // getsec
    case 0xa1: case 0xa9:             // pop fs, pop gs
    case 0xaa:                        // rsm
      return InsnKind::kPrivileged;
    case 0x0e:                        // femms (3DNow!)
      return InsnKind::kUnsupported;
    case 0x78: case 0x79:             // vmread vmwrite; extrq insertq (AMD only)
      return p == 0 ? InsnKind::kPrivileged : InsnKind::kUnsupported;
    case 0xae:                        // incssp
      return !mem && p == 0xf3 && reg == 5 ? InsnKind::kUnsupported : InsnKind::kPlain;
    case 0xc7:
      if (mem) {                      // xrstors xsaves, vmptrld vmclear vmxon vmptrst
        return reg == 3 || reg == 5 || reg >= 6 ? InsnKind::kPrivileged : InsnKind::kPlain;
      }
      return reg == 6 && p == 0xf3 ? InsnKind::kUnsupported  // senduipi
                                   : InsnKind::kPlain;       // rdrand rdseed rdpid
    default:
      return InsnKind::kPlain;
  }
}

// Is the instruction a nop: executing it changes nothing but rip? Only the forms the SDM
// documents as NOP (90 without REX.B or F3, 0F 1F) and endbr64. The reserved-nop opcodes
// 0F 18-1E are run, not skipped: newer instructions live there.
bool is_nop(const Decoded& d) {
  if (d.encoding != decoder::Encoding::kLegacy) return false;
  if (d.map == decoder::kMapOne) {
    return d.opcode == 0x90 && !(d.rex & 1) && !(d.prefixes & decoder::kPrefixRep);
  }
  if (d.map != decoder::kMap0F) return false;
  if (d.opcode == 0x1f) return true;
  return d.opcode == 0x1e && d.mandatory == 0xf3 && d.modrm == 0xfa;  // endbr64
}

// jmp/call r/m: does the operand read rsp, or is it rip-relative? (A SIB's index field
// 100 means no index; with REX.X it is r12. Only a base, or the register, can be rsp.)
void note_indirect_operand(const Decoded& d, Insn* out) {
  const bool rex_b = d.rex & 1;
  if (d.mod() == 3) {
    out->uses_rsp = d.rm() == 4 && !rex_b;
  } else if (d.has_sib) {
    const bool has_base = !((d.sib & 7) == 5 && d.mod() == 0);
    out->uses_rsp = has_base && (d.sib & 7) == 4 && !rex_b;
  } else {
    out->uses_rip = d.rip_relative();
  }
}

}  // namespace

bool Insn::is_branch() const {
  switch (kind) {
    case InsnKind::kJmpRel: case InsnKind::kJccRel: case InsnKind::kCallRel:
    case InsnKind::kLoopRel: case InsnKind::kRet: case InsnKind::kJmpIndirect:
    case InsnKind::kCallIndirect:
      return true;
    default:
      return false;
  }
}

bool Insn::ends_flow() const {
  return kind == InsnKind::kJmpRel || kind == InsnKind::kRet || kind == InsnKind::kJmpIndirect;
}

int decode(const uint8_t* code, size_t avail, uintptr_t pc, Insn* out) {
  *out = Insn{};
  if (avail == 0) return -EILSEQ;
  Decoded d;
  if (decoder::decode(code, avail, &d) != 0) return -EILSEQ;

  out->addr = pc;
  out->len = d.len;
  std::memcpy(out->bytes, code, out->len);
  out->opcode_offset = d.prefix_end;

  // A REX the CPU ignores, or an instruction the decoder does not know: its meaning is
  // not ours to vouch for.
  if (d.rex_ignored || !d.known) {
    out->kind = InsnKind::kUnsupported;
    return 0;
  }
  // Under 66 a near transfer's operand size is 16 bits: on some processors rip is
  // truncated, and its offset is a rel16. Under 67 loop counts in ecx.
  const bool opsize16 = d.prefixes & decoder::kPrefixOpSize;
  const bool addr32 = d.prefixes & decoder::kPrefixAddrSize;
  auto rel_target = [&](unsigned size) -> uintptr_t {
    if (d.imm_size != size) return 0;  // a rel16: never read past the instruction's bytes
    return static_cast<uintptr_t>(static_cast<int64_t>(out->next()) +
                                  read_rel(code + d.imm_at, size));
  };
  auto branch = [&](InsnKind kind) { return opsize16 ? InsnKind::kUnsupported : kind; };

  if (d.encoding == decoder::Encoding::kLegacy) {
    const uint8_t op = d.opcode;
    if (d.map == decoder::kMapOne) {
      switch (op) {
        case 0xcc: case 0xcd: case 0xf1:  // int3, int n, int1
          out->kind = InsnKind::kTrap;
          return 0;
        case 0xeb: case 0xe9:
          out->kind = branch(InsnKind::kJmpRel);
          out->target = rel_target(op == 0xeb ? 1 : 4);
          return 0;
        case 0xe8:
          out->kind = branch(InsnKind::kCallRel);
          out->target = rel_target(4);
          return 0;
        case 0xe0: case 0xe1: case 0xe2: case 0xe3:
          out->kind = branch(InsnKind::kLoopRel);
          out->loop = op == 0xe3 ? (addr32 ? LoopOp::kJecxz : LoopOp::kJrcxz)
                                 : static_cast<LoopOp>(op - 0xe0);
          // With 0x67 the loop forms count in ecx; we emulate only the 64-bit forms.
          if (addr32 && op != 0xe3) out->kind = InsnKind::kUnsupported;
          out->target = rel_target(1);
          return 0;
        case 0xc3: case 0xc2:
          out->kind = branch(InsnKind::kRet);
          if (op == 0xc2) out->ret_imm = static_cast<uint16_t>(code[d.imm_at] |
                                                               code[d.imm_at + 1] << 8);
          return 0;
        case 0xca: case 0xcb: case 0xcf:  // far return, iret
          out->kind = InsnKind::kUnsupported;
          return 0;
        case 0xff:
          if (d.reg() == 2 || d.reg() == 4) {
            out->kind = branch(d.reg() == 2 ? InsnKind::kCallIndirect : InsnKind::kJmpIndirect);
            note_indirect_operand(d, out);
            if (out->uses_rip) {
              out->disp_offset = d.disp_at;
              if (addr32) out->kind = InsnKind::kUnsupported;  // eip-relative
            }
            return 0;
          }
          if (d.reg() == 3 || d.reg() == 5) {  // far call / far jmp
            out->kind = InsnKind::kUnsupported;
            return 0;
          }
          break;
        default:
          if (op >= 0x70 && op <= 0x7f) {
            out->kind = branch(InsnKind::kJccRel);
            out->cond = op & 0x0f;
            out->target = rel_target(1);
            return 0;
          }
          break;
      }
    } else if (d.map == decoder::kMap0F) {
      if (op >= 0x80 && op <= 0x8f) {
        out->kind = branch(InsnKind::kJccRel);
        out->cond = op & 0x0f;
        out->target = rel_target(4);
        return 0;
      }
      switch (op) {
        case 0x0b: case 0xb9: case 0xff:  // ud2, ud1, ud0
          out->kind = InsnKind::kTrap;
          return 0;
        case 0x05:
          out->kind = InsnKind::kSyscall;
          return 0;
        case 0x34: case 0x35: case 0x07:  // sysenter, sysexit, sysret
          out->kind = InsnKind::kUnsupported;
          return 0;
        default:
          break;
      }
    }
    const InsnKind k = never_probed(d);
    if (k != InsnKind::kPlain) {
      out->kind = k;
      return 0;
    }
  }
  out->is_nop = is_nop(d);
  if (d.rip_relative()) {
    // [eip + disp32] under 67: the address wraps at 4 GiB, a copy elsewhere cannot
    // reproduce it.
    out->kind = addr32 ? InsnKind::kUnsupported : InsnKind::kRipRelative;
    out->disp_offset = d.disp_at;
    return 0;
  }
  out->kind = InsnKind::kPlain;
  return 0;
}

int check_boundary(const uint8_t* code, uintptr_t start, uintptr_t end, uintptr_t addr) {
  if (addr < start || addr >= end) return -EILSEQ;
  uintptr_t pc = start;
  Insn insn;
  while (pc < addr) {
    if (decode(code + (pc - start), end - pc, pc, &insn) != 0) return -EILSEQ;
    pc += insn.len;
  }
  return pc == addr ? 0 : -EILSEQ;
}

}  // namespace probefs::arch::x86_64
