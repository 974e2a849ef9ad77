// The Capstone-based decode() and shape_of() of the ISA toolkit as they were before it got
// its own decoder, kept as the oracle of the differential tests (x86_64/isa/*_diff_test).
#include "tests/arch/x86_64/isa/capstone_oracle.h"

#include "tests/arch/x86_64/isa/capstone_handle.h"

#include <capstone/capstone.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace probefs::arch::x86_64::oracle {
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


// Its own handle, apart from decode()'s: an instruction read here stays valid while
// decode() runs.
Disassembler& operand_reader() {
  thread_local Disassembler d;
  return d;
}

// The general-purpose register family (0 = rax .. 15 = r15) of any of its names, or -1.
int gpr_family(unsigned r) {
  switch (r) {
    case X86_REG_AL: case X86_REG_AH: case X86_REG_AX: case X86_REG_EAX: case X86_REG_RAX:
      return 0;
    case X86_REG_CL: case X86_REG_CH: case X86_REG_CX: case X86_REG_ECX: case X86_REG_RCX:
      return 1;
    case X86_REG_DL: case X86_REG_DH: case X86_REG_DX: case X86_REG_EDX: case X86_REG_RDX:
      return 2;
    case X86_REG_BL: case X86_REG_BH: case X86_REG_BX: case X86_REG_EBX: case X86_REG_RBX:
      return 3;
    case X86_REG_SPL: case X86_REG_SP: case X86_REG_ESP: case X86_REG_RSP:
      return 4;
    case X86_REG_BPL: case X86_REG_BP: case X86_REG_EBP: case X86_REG_RBP:
      return 5;
    case X86_REG_SIL: case X86_REG_SI: case X86_REG_ESI: case X86_REG_RSI:
      return 6;
    case X86_REG_DIL: case X86_REG_DI: case X86_REG_EDI: case X86_REG_RDI:
      return 7;
    default:
      break;
  }
  static constexpr unsigned kByte[] = {X86_REG_R8B,  X86_REG_R9B,  X86_REG_R10B, X86_REG_R11B,
                                       X86_REG_R12B, X86_REG_R13B, X86_REG_R14B, X86_REG_R15B};
  static constexpr unsigned kWord[] = {X86_REG_R8W,  X86_REG_R9W,  X86_REG_R10W, X86_REG_R11W,
                                       X86_REG_R12W, X86_REG_R13W, X86_REG_R14W, X86_REG_R15W};
  static constexpr unsigned kDword[] = {X86_REG_R8D,  X86_REG_R9D,  X86_REG_R10D, X86_REG_R11D,
                                        X86_REG_R12D, X86_REG_R13D, X86_REG_R14D, X86_REG_R15D};
  static constexpr unsigned kQword[] = {X86_REG_R8,  X86_REG_R9,  X86_REG_R10, X86_REG_R11,
                                        X86_REG_R12, X86_REG_R13, X86_REG_R14, X86_REG_R15};
  for (int i = 0; i < 8; ++i) {
    if (r == kByte[i] || r == kWord[i] || r == kDword[i] || r == kQword[i]) return 8 + i;
  }
  return -1;
}

// Instructions whose register writes Capstone reports completely. Capstone 4 leaves out
// some implicit writes (cmpxchg's rax, for one), so anything not listed here is taken to
// write every register, which ends the walk if it crosses a register the walk follows.
bool writes_are_known(unsigned id) {
  switch (id) {
    case X86_INS_MOV: case X86_INS_MOVABS: case X86_INS_MOVZX: case X86_INS_MOVSX:
    case X86_INS_MOVSXD: case X86_INS_LEA: case X86_INS_ADD: case X86_INS_SUB:
    case X86_INS_AND: case X86_INS_OR: case X86_INS_XOR: case X86_INS_CMP: case X86_INS_TEST:
    case X86_INS_SHL: case X86_INS_SHR: case X86_INS_SAR: case X86_INS_INC: case X86_INS_DEC:
    case X86_INS_NEG: case X86_INS_NOT: case X86_INS_NOP: case X86_INS_ENDBR64:
    case X86_INS_PUSH: case X86_INS_POP: case X86_INS_CDQE:
      return true;
    default:
      return false;
  }
}

constexpr uint16_t bit(int family) { return static_cast<uint16_t>(1u << family); }

InsnId id_of(unsigned id) {
  switch (id) {
    case X86_INS_MOV: return InsnId::kMov;
    case X86_INS_MOVABS: return InsnId::kMovabs;
    case X86_INS_MOVZX: return InsnId::kMovzx;
    case X86_INS_MOVSX: return InsnId::kMovsx;
    case X86_INS_MOVSXD: return InsnId::kMovsxd;
    case X86_INS_LEA: return InsnId::kLea;
    case X86_INS_ADD: return InsnId::kAdd;
    case X86_INS_SUB: return InsnId::kSub;
    case X86_INS_AND: return InsnId::kAnd;
    case X86_INS_OR: return InsnId::kOr;
    case X86_INS_XOR: return InsnId::kXor;
    case X86_INS_CMP: return InsnId::kCmp;
    case X86_INS_TEST: return InsnId::kTest;
    case X86_INS_SHL: return InsnId::kShl;
    case X86_INS_SHR: return InsnId::kShr;
    case X86_INS_SAR: return InsnId::kSar;
    case X86_INS_INC: return InsnId::kInc;
    case X86_INS_DEC: return InsnId::kDec;
    case X86_INS_NEG: return InsnId::kNeg;
    case X86_INS_NOT: return InsnId::kNot;
    case X86_INS_NOP: return InsnId::kNop;
    case X86_INS_ENDBR64: return InsnId::kEndbr64;
    case X86_INS_PUSH: return InsnId::kPush;
    case X86_INS_POP: return InsnId::kPop;
    case X86_INS_CDQE: return InsnId::kCdqe;
    case X86_INS_JMP: return InsnId::kJmp;
    default: return InsnId::kUnknown;
  }
}

}  // namespace

bool shape_of(const Insn& insn, Shape* out, unsigned* capstone_id) {
  *out = Shape{};
  const cs_insn* ci = operand_reader().one(insn.bytes, insn.len, insn.addr);
  if (!ci || ci->size != insn.len) return false;
  const cs_x86& x = ci->detail->x86;
  const bool addr32 = x.prefix[3] == X86_PREFIX_ADDRSIZE;
  if (capstone_id) *capstone_id = ci->id;
  out->id = id_of(ci->id);
  out->count = x.op_count;
  for (uint8_t i = 0; i < x.op_count && i < 2; ++i) {
    const cs_x86_op& op = x.operands[i];
    Operand& o = out->ops[i];
    o.size = op.size;
    switch (op.type) {
      case X86_OP_REG:
        o.type = Operand::kReg;
        o.reg = gpr_family(op.reg);
        break;
      case X86_OP_IMM:
        o.type = Operand::kImm;
        o.imm = op.imm;
        break;
      case X86_OP_MEM: {
        o.type = Operand::kMem;
        o.rip = op.mem.base == X86_REG_RIP;
        o.base = gpr_family(op.mem.base);
        o.index = gpr_family(op.mem.index);
        o.scale = op.mem.scale;
        o.disp = op.mem.disp;
        const bool base_ok = op.mem.base == X86_REG_INVALID || o.rip || o.base >= 0;
        const bool index_ok = op.mem.index == X86_REG_INVALID || o.index >= 0;
        o.simple = op.mem.segment == X86_REG_INVALID && !addr32 && base_ok && index_ok;
        break;
      }
      default:
        break;
    }
  }
  // Capstone's jmp also names jmp rel: only jmp r/m is ours.
  if (out->id == InsnId::kJmp && out->ops[0].type == Operand::kImm) out->id = InsnId::kUnknown;
  if (!writes_are_known(ci->id)) {
    out->writes = 0xffff;
    return true;
  }
  cs_regs read, write;
  uint8_t nread = 0, nwrite = 0;
  if (cs_regs_access(operand_reader().handle(), ci, read, &nread, write, &nwrite) != CS_ERR_OK) {
    out->writes = 0xffff;
    return true;
  }
  for (uint8_t i = 0; i < nwrite; ++i) {
    if (int f = gpr_family(write[i]); f >= 0) out->writes |= bit(f);
  }
  return true;
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

int disassemble(const uint8_t* code, size_t avail, uintptr_t pc, char* buf, size_t bufsize) {
  const cs_insn* ci = disassembler().one(code, avail, pc);
  if (!ci) return -EILSEQ;
  std::snprintf(buf, bufsize, "%s %s", ci->mnemonic, ci->op_str);
  return ci->size;
}

int length(const uint8_t* code, size_t avail, uintptr_t pc) {
  const cs_insn* ci = disassembler().one(code, avail < kMaxInsnLen ? avail : kMaxInsnLen, pc);
  return ci ? ci->size : 0;
}

}  // namespace probefs::arch::x86_64::oracle
