// disassemble() (insn.h): text for diagnostics from what decode() and shape_of() know. It
// names only what the toolkit understands; the other instructions show their kind and
// bytes. (The tests hold a full disassembler as their oracle, tests/arch/x86_64/isa.)
#include <cerrno>
#include <cstdarg>
#include <cstdio>

#include "arch/x86_64/isa/insn.h"
#include "arch/x86_64/isa/shape.h"

namespace probefs::arch::x86_64 {
namespace {

class Text {
 public:
  Text(char* buf, size_t size) : buf_(buf), size_(size) {
    if (size_) buf_[0] = '\0';
  }
  void add(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (used_ >= size_) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = std::vsnprintf(buf_ + used_, size_ - used_, fmt, ap);
    va_end(ap);
    if (n > 0) used_ += static_cast<size_t>(n);
  }

 private:
  char* buf_;
  size_t size_;
  size_t used_ = 0;
};

const char* register_name(int family, uint8_t size, bool high_byte) {
  static const char* const k64[] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi"};
  static const char* const k32[] = {"eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi"};
  static const char* const k16[] = {"ax", "cx", "dx", "bx", "sp", "bp", "si", "di"};
  static const char* const k8[] = {"al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil"};
  static const char* const kHigh[] = {"ah", "ch", "dh", "bh"};
  static const char* const kR64[] = {"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"};
  static const char* const kR32[] = {"r8d", "r9d", "r10d", "r11d", "r12d", "r13d", "r14d",
                                     "r15d"};
  static const char* const kR16[] = {"r8w", "r9w", "r10w", "r11w", "r12w", "r13w", "r14w",
                                     "r15w"};
  static const char* const kR8[] = {"r8b", "r9b", "r10b", "r11b", "r12b", "r13b", "r14b",
                                    "r15b"};
  if (family < 0 || family > 15) return "sreg";
  if (high_byte && family < 4) return kHigh[family];
  const bool low = family < 8;
  const int i = family & 7;
  switch (size) {
    case 8: return low ? k64[i] : kR64[i];
    case 4: return low ? k32[i] : kR32[i];
    case 2: return low ? k16[i] : kR16[i];
    default: return low ? k8[i] : kR8[i];
  }
}

void add_operand(Text& t, const Operand& o) {
  switch (o.type) {
    case Operand::kReg:
      t.add("%s", register_name(o.reg, o.size, o.high_byte));
      return;
    case Operand::kImm:
      t.add(o.imm < 0 ? "-0x%llx" : "0x%llx",
            static_cast<unsigned long long>(o.imm < 0 ? -static_cast<uint64_t>(o.imm)
                                                      : static_cast<uint64_t>(o.imm)));
      return;
    case Operand::kMem: {
      static const char* const kSize[] = {"", "byte", "word", "", "dword", "", "", "", "qword"};
      if (o.size <= 8 && kSize[o.size][0]) t.add("%s ptr ", kSize[o.size]);
      t.add("[");
      const char* sep = "";
      if (o.rip) {
        t.add("rip");
        sep = " + ";
      } else if (o.base >= 0) {
        t.add("%s", register_name(o.base, 8, false));
        sep = " + ";
      }
      if (o.index >= 0) {
        t.add("%s%s*%d", sep, register_name(o.index, 8, false), o.scale);
        sep = " + ";
      }
      if (o.disp != 0 || !*sep) {
        const bool neg = o.disp < 0 && *sep;
        t.add("%s0x%llx", neg ? " - " : sep,
              static_cast<unsigned long long>(neg ? -static_cast<uint64_t>(o.disp)
                                                  : static_cast<uint64_t>(o.disp)));
      }
      t.add("]");
      return;
    }
    default:
      return;
  }
}

const char* identity_name(InsnId id) {
  switch (id) {
    case InsnId::kMov: return "mov";
    case InsnId::kMovabs: return "movabs";
    case InsnId::kMovzx: return "movzx";
    case InsnId::kMovsx: return "movsx";
    case InsnId::kMovsxd: return "movsxd";
    case InsnId::kLea: return "lea";
    case InsnId::kAdd: return "add";
    case InsnId::kSub: return "sub";
    case InsnId::kAnd: return "and";
    case InsnId::kOr: return "or";
    case InsnId::kXor: return "xor";
    case InsnId::kCmp: return "cmp";
    case InsnId::kTest: return "test";
    case InsnId::kShl: return "shl";
    case InsnId::kShr: return "shr";
    case InsnId::kSar: return "sar";
    case InsnId::kInc: return "inc";
    case InsnId::kDec: return "dec";
    case InsnId::kNeg: return "neg";
    case InsnId::kNot: return "not";
    case InsnId::kNop: return "nop";
    case InsnId::kEndbr64: return "endbr64";
    case InsnId::kPush: return "push";
    case InsnId::kPop: return "pop";
    case InsnId::kCdqe: return "cdqe";
    case InsnId::kJmp: return "jmp";
    case InsnId::kUnknown: break;
  }
  return nullptr;
}

const char* kind_name(InsnKind k) {
  switch (k) {
    case InsnKind::kPlain: return "plain";
    case InsnKind::kRipRelative: return "rip-relative";
    case InsnKind::kTrap: return "trap";
    case InsnKind::kPrivileged: return "privileged";
    default: return "unsupported";
  }
}

}  // namespace

int disassemble(const uint8_t* code, size_t avail, uintptr_t pc, char* buf, size_t bufsize) {
  Insn insn;
  if (decode(code, avail, pc, &insn) != 0) return -EILSEQ;
  Text t(buf, bufsize);
  static const char* const kCond[] = {"o", "no", "b", "ae", "e", "ne", "be", "a",
                                      "s", "ns", "p", "np", "l", "ge", "le", "g"};
  static const char* const kLoop[] = {"loopne", "loope", "loop", "jrcxz", "jecxz"};
  const unsigned long long target = insn.target;
  Shape shape;
  switch (insn.kind) {
    case InsnKind::kJmpRel: t.add("jmp 0x%llx", target); break;
    case InsnKind::kJccRel: t.add("j%s 0x%llx", kCond[insn.cond & 15], target); break;
    case InsnKind::kCallRel: t.add("call 0x%llx", target); break;
    case InsnKind::kLoopRel: t.add("%s 0x%llx", kLoop[static_cast<int>(insn.loop)], target); break;
    case InsnKind::kRet:
      if (insn.ret_imm) t.add("ret 0x%x", insn.ret_imm);
      else t.add("ret");
      break;
    case InsnKind::kSyscall: t.add("syscall"); break;
    case InsnKind::kCallIndirect:
    case InsnKind::kJmpIndirect: {
      // call r/m is jmp r/m with ModRM.reg 2 instead of 4: read its operand as a jmp's.
      Insn as_jmp = insn;
      uint8_t& modrm = as_jmp.bytes[insn.opcode_offset + 1];
      modrm = static_cast<uint8_t>((modrm & ~0x38) | (4 << 3));
      t.add(insn.kind == InsnKind::kCallIndirect ? "call " : "jmp ");
      if (shape_of(as_jmp, &shape) && shape.id == InsnId::kJmp) add_operand(t, shape.ops[0]);
      break;
    }
    default:
      if (shape_of(insn, &shape) && identity_name(shape.id)) {
        t.add("%s", identity_name(shape.id));
        for (uint8_t i = 0; i < shape.count && i < 2; ++i) {
          t.add(i ? ", " : " ");
          add_operand(t, shape.ops[i]);
        }
        break;
      }
      t.add("(%s)", kind_name(insn.kind));
      for (uint8_t i = 0; i < insn.len; ++i) t.add(" %02x", insn.bytes[i]);
      break;
  }
  return insn.len;
}

}  // namespace probefs::arch::x86_64
