// Decoding and classification with Capstone. Capstone supplies lengths and operand
// details; the control-flow opcodes that matter for probing are recognised from the bytes
// themselves, so the classification does not hinge on a disassembler's naming.
#include "arch/x86_64/isa/insn.h"

#include "arch/x86_64/isa/capstone_handle.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace probefs::arch::x86_64 {
namespace {

bool is_legacy_prefix(uint8_t b) {
  switch (b) {
    case 0xf0: case 0xf2: case 0xf3: case 0x2e: case 0x36: case 0x3e:
    case 0x26: case 0x64: case 0x65: case 0x66: case 0x67:
      return true;
    default:
      return false;
  }
}

bool is_rsp(x86_reg r) { return r == X86_REG_RSP || r == X86_REG_ESP || r == X86_REG_SP; }

int64_t read_rel(const uint8_t* p, unsigned size) {
  if (size == 1) return static_cast<int8_t>(p[0]);
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Looks at the operands of an indirect branch: does it read rsp or rip?
void note_indirect_operands(const cs_x86& x, Insn* out) {
  for (uint8_t i = 0; i < x.op_count; ++i) {
    const cs_x86_op& op = x.operands[i];
    if (op.type == X86_OP_REG && is_rsp(op.reg)) out->uses_rsp = true;
    if (op.type == X86_OP_MEM) {
      if (is_rsp(op.mem.base) || is_rsp(op.mem.index)) out->uses_rsp = true;
      if (op.mem.base == X86_REG_RIP) out->uses_rip = true;
    }
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
  const cs_insn* ci = disassembler().one(code, avail < kMaxInsnLen ? avail : kMaxInsnLen, pc);
  if (!ci || ci->size == 0 || ci->size > kMaxInsnLen) return -EILSEQ;

  out->addr = pc;
  out->len = static_cast<uint8_t>(ci->size);
  std::memcpy(out->bytes, code, out->len);

  unsigned o = 0;
  bool opsize16 = false, addr32 = false;
  while (o < out->len && is_legacy_prefix(code[o])) {
    opsize16 |= code[o] == 0x66;
    addr32 |= code[o] == 0x67;
    ++o;
  }
  if (o < out->len && (code[o] & 0xf0) == 0x40) ++o;  // REX
  if (o >= out->len) return -EILSEQ;
  out->opcode_offset = static_cast<uint8_t>(o);

  const cs_x86& x = ci->detail->x86;
  const uint8_t op = code[o];
  const uint8_t op2 = o + 1 < out->len ? code[o + 1] : 0;
  const uint8_t modrm_reg = (op2 >> 3) & 7;
  const unsigned imm_at = o + (op == 0x0f ? 2 : 1);
  auto rel_target = [&](unsigned size) -> uintptr_t {
    // Under 0x66 the field is a rel16 (such forms are kUnsupported): never read past the
    // instruction's own bytes.
    if (imm_at + size != out->len) return 0;
    return static_cast<uintptr_t>(static_cast<int64_t>(out->next()) +
                                  read_rel(code + imm_at, size));
  };

  switch (op) {
    case 0xcc: case 0xcd: case 0xce: case 0xf1:
      out->kind = InsnKind::kTrap;
      return 0;
    case 0xeb: case 0xe9:
      out->kind = opsize16 ? InsnKind::kUnsupported : InsnKind::kJmpRel;
      out->target = rel_target(op == 0xeb ? 1 : 4);
      return 0;
    case 0xe8:
      out->kind = opsize16 ? InsnKind::kUnsupported : InsnKind::kCallRel;
      out->target = rel_target(4);
      return 0;
    case 0xe0: case 0xe1: case 0xe2: case 0xe3:
      out->kind = InsnKind::kLoopRel;
      out->loop = op == 0xe3 ? (addr32 ? LoopOp::kJecxz : LoopOp::kJrcxz)
                             : static_cast<LoopOp>(op - 0xe0);
      // With 0x67 the loop forms count in ecx; we emulate only the 64-bit forms.
      if (addr32 && op != 0xe3) out->kind = InsnKind::kUnsupported;
      out->target = rel_target(1);
      return 0;
    case 0xc3: case 0xc2:
      out->kind = InsnKind::kRet;
      if (op == 0xc2) out->ret_imm = static_cast<uint16_t>(code[o + 1] | code[o + 2] << 8);
      return 0;
    case 0xca: case 0xcb: case 0xcf:  // far return, iret
      out->kind = InsnKind::kUnsupported;
      return 0;
    case 0xff:
      if (modrm_reg == 2 || modrm_reg == 4) {
        out->kind = modrm_reg == 2 ? InsnKind::kCallIndirect : InsnKind::kJmpIndirect;
        note_indirect_operands(x, out);
        if (out->uses_rip) out->disp_offset = x.encoding.disp_offset;
        return 0;
      }
      if (modrm_reg == 3 || modrm_reg == 5) {  // far call / far jmp
        out->kind = InsnKind::kUnsupported;
        return 0;
      }
      break;
    case 0x0f:
      if (op2 >= 0x80 && op2 <= 0x8f) {
        out->kind = opsize16 ? InsnKind::kUnsupported : InsnKind::kJccRel;
        out->cond = op2 & 0x0f;
        out->target = rel_target(4);
        return 0;
      }
      if (op2 == 0x0b || op2 == 0xb9 || op2 == 0xff) {  // ud2, ud1, ud0
        out->kind = InsnKind::kTrap;
        return 0;
      }
      if (op2 == 0x05) {
        out->kind = InsnKind::kSyscall;
        return 0;
      }
      if (op2 == 0x34 || op2 == 0x35 || op2 == 0x07) {  // sysenter, sysexit, sysret
        out->kind = InsnKind::kUnsupported;
        return 0;
      }
      break;
    default:
      if (op >= 0x70 && op <= 0x7f) {
        out->kind = InsnKind::kJccRel;
        out->cond = op & 0x0f;
        out->target = rel_target(1);
        return 0;
      }
      break;
  }

  csh h = disassembler().handle();
  if (cs_insn_group(h, ci, X86_GRP_INT)) {
    out->kind = InsnKind::kTrap;
    return 0;
  }
  if (cs_insn_group(h, ci, X86_GRP_PRIVILEGE) || cs_insn_group(h, ci, X86_GRP_IRET)) {
    out->kind = InsnKind::kPrivileged;
    return 0;
  }
  if (cs_insn_group(h, ci, X86_GRP_BRANCH_RELATIVE) || cs_insn_group(h, ci, X86_GRP_JUMP) ||
      cs_insn_group(h, ci, X86_GRP_CALL) || cs_insn_group(h, ci, X86_GRP_RET)) {
    out->kind = InsnKind::kUnsupported;  // a transfer not recognised above (xbegin, ...)
    return 0;
  }
  if (ci->id == X86_INS_UD0 || ci->id == X86_INS_UD2 || ci->id == X86_INS_UD2B) {
    out->kind = InsnKind::kTrap;
    return 0;
  }
  out->is_nop = ci->id == X86_INS_NOP || ci->id == X86_INS_ENDBR64;

  for (uint8_t i = 0; i < x.op_count; ++i) {
    if (x.operands[i].type == X86_OP_MEM && x.operands[i].mem.base == X86_REG_RIP) {
      if (x.encoding.disp_offset == 0) {
        out->kind = InsnKind::kUnsupported;
        return 0;
      }
      out->kind = InsnKind::kRipRelative;
      out->disp_offset = x.encoding.disp_offset;
      return 0;
    }
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

int disassemble(const uint8_t* code, size_t avail, uintptr_t pc, char* buf, size_t bufsize) {
  const cs_insn* ci = disassembler().one(code, avail, pc);
  if (!ci) return -EILSEQ;
  std::snprintf(buf, bufsize, "%s %s", ci->mnemonic, ci->op_str);
  return ci->size;
}

}  // namespace probefs::arch::x86_64
