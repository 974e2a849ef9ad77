// Jump-optimization safety checks (see optimize_check.h for what is checked and why).
//
// The function is decoded once by linear sweep (insn.h's decode). Jump tables are
// recognised by walking backward from the indirect jmp along the only path that reaches it
// and matching what GCC and Clang emit for a dense switch on x86-64:
//
//   PIC (rel32 entries, offsets from the table's own address):
//       cmp   $N, %idx            ; the bound: N+1 entries after ja, N after jae
//       ja    .Ldefault           ; (or jbe/jb to the dispatch block placed elsewhere)
//       lea   .Ltable(%rip), %base
//       mov   %idx32, %idx32      ; zero extension or renaming; movzbl after a byte compare
//       movslq (%base,%idx,4), %entry
//       add   %base, %entry       ; (or add %entry, %base; or lea (%base,%entry), %dst)
//       [notrack] jmp *%entry
//
//   non-PIC (absolute 8-byte entries):
//       cmp $N, %idx ; ja .Ldefault ; jmp *.Ltable(,%idx,8)    (or mov ...,%r ; jmp *%r)
//
// Unrelated instructions may be scheduled in between when they provably leave the
// registers of the pattern alone. Anything else is not a recognised table, and the
// indirect jump refuses optimization.
#include "arch/x86_64/isa/optimize_check.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "arch/x86_64/isa/decoder.h"
#include "arch/x86_64/isa/relocate.h"
#include "arch/x86_64/isa/shape.h"

namespace probefs::arch::x86_64 {
namespace {

// relocate() is tried with the copy this far below and above the original: beyond any
// rel8, well within rel32 of whatever the code addresses. The detour builder relocates
// again at the detour's real address, which can still fail (-ERANGE) and keep the int3.
constexpr uintptr_t kTrialDistance = uintptr_t{64} << 20;

// A bound larger than this is not believed to be a switch table.
constexpr uint64_t kMaxTableEntries = 4096;

// How many instructions back from the indirect jmp the table's setup may reach.
constexpr int kMaxSliceLen = 32;

constexpr uint8_t kCondBelow = 0x2;         // jb / jnae / jc:  CF
constexpr uint8_t kCondBelowOrEqual = 0x6;  // jbe / jna:       CF | ZF

constexpr uint16_t bit(int family) { return static_cast<uint16_t>(1u << family); }

// ---- operands ---------------------------------------------------------------------------
//
// shape_of() (shape.h) reads the operands of the few instructions a table dispatch is made
// of, in Intel order (destination first), and the general-purpose registers they write.
// Every other instruction is kUnknown and taken to write every register, which ends the
// walk if it crosses a register the walk follows.

using decoder::Decoded;

constexpr uint16_t kWritesAll = 0xffff;
constexpr int kRsp = 4;

// The operand size of an instruction with a v-sized operand: REX.W, else 66, else 32.
uint8_t operand_size(const Decoded& d) {
  if (d.rex_w()) return 8;
  return (d.prefixes & decoder::kPrefixOpSize) ? 2 : 4;
}

// A register operand: number 0..15 (REX extension included) of the given size. Without
// any REX byte, byte registers 4..7 are ah, ch, dh, bh: the upper halves of 0..3.
Operand gpr(const Decoded& d, unsigned number, uint8_t size) {
  Operand o;
  o.type = Operand::kReg;
  o.size = size;
  o.high_byte = size == 1 && d.rex == 0 && number >= 4 && number < 8;
  o.reg = static_cast<int>(o.high_byte ? number - 4 : number);
  return o;
}

Operand immediate(int64_t value, uint8_t size) {
  Operand o;
  o.type = Operand::kImm;
  o.size = size;
  o.imm = value;
  return o;
}

int64_t read_signed(const uint8_t* p, unsigned size) {
  switch (size) {
    case 1: return static_cast<int8_t>(p[0]);
    case 2: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case 4: { int32_t v; std::memcpy(&v, p, 4); return v; }
    default: { int64_t v; std::memcpy(&v, p, 8); return v; }
  }
}

// The ModRM r/m operand: a register, or the memory operand with its base, index, scale
// and displacement.
Operand rm_operand(const Decoded& d, const uint8_t* bytes, uint8_t size) {
  if (d.mod() == 3) return gpr(d, d.rm() | ((d.rex & 1) << 3), size);
  Operand o;
  o.type = Operand::kMem;
  o.size = size;
  const bool addr32 = d.prefixes & decoder::kPrefixAddrSize;
  if (d.has_sib) {
    const unsigned base = d.sib & 7, index = (d.sib >> 3) & 7;
    if (!(base == 5 && d.mod() == 0)) o.base = static_cast<int>(base | ((d.rex & 1) << 3));
    const unsigned ix = index | ((d.rex & 2) << 2);
    if (ix != 4) o.index = static_cast<int>(ix);
    o.scale = 1 << (d.sib >> 6);
  } else if (d.rip_relative()) {
    o.rip = !addr32;  // [eip + disp32] names no register we follow
  } else {
    o.base = static_cast<int>(d.rm() | ((d.rex & 1) << 3));
  }
  if (d.disp_size) o.disp = read_signed(bytes + d.disp_at, d.disp_size);
  o.simple = !(d.prefixes & decoder::kPrefixSegment) && !addr32;
  return o;
}

// mov al/ax/eax/rax <-> [moffs]: an absolute address, no register.
Operand moffs_operand(const Decoded& d, const uint8_t* bytes, uint8_t size) {
  Operand o;
  o.type = Operand::kMem;
  o.size = size;
  const bool addr32 = d.prefixes & decoder::kPrefixAddrSize;
  o.disp = addr32 ? static_cast<int64_t>(static_cast<uint32_t>(read_signed(bytes + d.imm_at, 4)))
                  : read_signed(bytes + d.imm_at, 8);
  o.simple = !(d.prefixes & decoder::kPrefixSegment) && !addr32;
  return o;
}

uint16_t written(const Operand& dest) {
  return dest.type == Operand::kReg && dest.reg >= 0 ? bit(dest.reg) : 0;
}

void set2(Shape* out, InsnId id, const Operand& a, const Operand& b, uint16_t writes) {
  out->id = id;
  out->count = 2;
  out->ops[0] = a;
  out->ops[1] = b;
  out->writes = writes;
}

void set1(Shape* out, InsnId id, const Operand& a, uint16_t writes) {
  out->id = id;
  out->count = 1;
  out->ops[0] = a;
  out->writes = writes;
}

// The one-byte map's share of the identities.
void shape_one_byte(const Decoded& d, const uint8_t* b, Shape* out) {
  const uint8_t op = d.opcode, reg = d.reg();
  const uint8_t v = operand_size(d);
  const unsigned reg_number = reg | ((d.rex & 4) << 1);
  const uint8_t imm_size = d.imm_size;
  auto imm = [&](uint8_t size) { return immediate(read_signed(b + d.imm_at, imm_size), size); };
  static constexpr InsnId kAlu[8] = {InsnId::kAdd, InsnId::kOr,  InsnId::kUnknown,
                                     InsnId::kUnknown, InsnId::kAnd, InsnId::kSub,
                                     InsnId::kXor, InsnId::kCmp};
  if (op < 0x40 && (op & 7) < 6) {  // add or adc sbb and sub xor cmp
    const InsnId id = kAlu[op >> 3];
    if (id == InsnId::kUnknown) return;
    const uint16_t keep = id == InsnId::kCmp ? 0 : kWritesAll;
    const uint8_t size = (op & 1) ? v : 1;
    Operand dst, src;
    switch (op & 7) {
      case 0: case 1: dst = rm_operand(d, b, size); src = gpr(d, reg_number, size); break;
      case 2: case 3: dst = gpr(d, reg_number, size); src = rm_operand(d, b, size); break;
      default: dst = gpr(d, 0, size); src = imm(size); break;
    }
    set2(out, id, dst, src, written(dst) & keep);
    return;
  }
  switch (op) {
    case 0x80: case 0x81: case 0x83: {  // group 1 r/m, imm
      const InsnId id = kAlu[reg];
      if (id == InsnId::kUnknown) return;
      const uint8_t size = op == 0x80 ? 1 : v;
      const Operand dst = rm_operand(d, b, size);
      set2(out, id, dst, imm(size), id == InsnId::kCmp ? 0 : written(dst));
      return;
    }
    case 0x84: case 0x85: {  // test r/m, r
      const uint8_t size = op == 0x84 ? 1 : v;
      set2(out, InsnId::kTest, rm_operand(d, b, size), gpr(d, reg_number, size), 0);
      return;
    }
    case 0xa8: case 0xa9: {  // test al/eax, imm
      const uint8_t size = op == 0xa8 ? 1 : v;
      set2(out, InsnId::kTest, gpr(d, 0, size), imm(size), 0);
      return;
    }
    case 0x88: case 0x89: case 0x8a: case 0x8b: {  // mov
      const uint8_t size = (op & 1) ? v : 1;
      const Operand r = gpr(d, reg_number, size), m = rm_operand(d, b, size);
      if (op <= 0x89) set2(out, InsnId::kMov, m, r, written(m));
      else set2(out, InsnId::kMov, r, m, written(r));
      return;
    }
    case 0x8c: {  // mov r/m, Sreg: a register operand of the operand size, else a word
      Operand seg;
      seg.type = Operand::kReg;
      seg.size = 2;
      const Operand dst = rm_operand(d, b, d.mod() == 3 ? v : 2);
      set2(out, InsnId::kMov, dst, seg, written(dst));
      return;
    }
    case 0x8e: {  // mov Sreg, r/m
      Operand seg;
      seg.type = Operand::kReg;
      seg.size = 2;
      set2(out, InsnId::kMov, seg, rm_operand(d, b, d.mod() == 3 ? v : 2), 0);
      return;
    }
    case 0xc6: case 0xc7: {  // mov r/m, imm
      if (reg != 0) return;  // xabort, xbegin
      const uint8_t size = op == 0xc6 ? 1 : v;
      const Operand dst = rm_operand(d, b, size);
      set2(out, InsnId::kMov, dst, imm(size), written(dst));
      return;
    }
    case 0xa0: case 0xa1: case 0xa2: case 0xa3: {  // mov al/rax <-> moffs
      const uint8_t size = (op & 1) ? v : 1;
      const InsnId id = (d.prefixes & decoder::kPrefixAddrSize) ? InsnId::kMov : InsnId::kMovabs;
      const Operand r = gpr(d, 0, size), m = moffs_operand(d, b, size);
      if (op <= 0xa1) set2(out, id, r, m, written(r));
      else set2(out, id, m, r, 0);
      return;
    }
    case 0x8d: {  // lea
      const Operand dst = gpr(d, reg_number, v);
      set2(out, InsnId::kLea, dst, rm_operand(d, b, v), written(dst));
      return;
    }
    case 0x63: {  // movsxd r, r/m32 (without REX.W the destination is 32 bits)
      const Operand dst = gpr(d, reg_number, v);
      set2(out, InsnId::kMovsxd, dst, rm_operand(d, b, v == 2 ? 2 : 4), written(dst));
      return;
    }
    case 0xc0: case 0xc1: case 0xd0: case 0xd1: case 0xd2: case 0xd3: {  // shifts
      const InsnId id = reg == 4 ? InsnId::kShl : reg == 5 ? InsnId::kShr
                                : reg == 7 ? InsnId::kSar : InsnId::kUnknown;
      if (id == InsnId::kUnknown) return;  // rol ror rcl rcr sal
      const uint8_t size = (op & 1) ? v : 1;
      const Operand dst = rm_operand(d, b, size);
      Operand count;
      if (op <= 0xc1) count = immediate(b[d.imm_at], 1);  // an unsigned count
      else if (op <= 0xd1) count = immediate(1, size);
      else count = gpr(d, 1, 1);  // cl
      set2(out, id, dst, count, written(dst));
      return;
    }
    case 0xf6: case 0xf7: {  // test r/m, imm; not; neg
      const uint8_t size = op == 0xf6 ? 1 : v;
      const Operand dst = rm_operand(d, b, size);
      if (reg <= 1) set2(out, InsnId::kTest, dst, imm(size), 0);
      else if (reg == 2) set1(out, InsnId::kNot, dst, written(dst));
      else if (reg == 3) set1(out, InsnId::kNeg, dst, written(dst));
      return;
    }
    case 0xfe: case 0xff: {  // inc dec; push r/m; jmp r/m
      const uint8_t size = op == 0xfe ? 1 : v;
      if (reg <= 1) {
        const Operand dst = rm_operand(d, b, size);
        set1(out, reg == 0 ? InsnId::kInc : InsnId::kDec, dst, written(dst));
      } else if (op == 0xff && reg == 6) {
        set1(out, InsnId::kPush, rm_operand(d, b, v == 2 ? 2 : 8), bit(kRsp));
      } else if (op == 0xff && reg == 4) {
        set1(out, InsnId::kJmp, rm_operand(d, b, v == 2 ? 2 : 8), kWritesAll);
      }
      return;
    }
    case 0x8f: {  // pop r/m
      const Operand dst = rm_operand(d, b, v == 2 ? 2 : 8);
      set1(out, InsnId::kPop, dst, static_cast<uint16_t>(bit(kRsp) | written(dst)));
      return;
    }
    case 0x68: case 0x6a:  // push imm
      set1(out, InsnId::kPush, imm(8), bit(kRsp));
      return;
    case 0x90:  // nop (xchg eax, eax); with REX.B xchg r8, rax; pause under F3
      if ((d.rex & 1) || (d.prefixes & decoder::kPrefixRep)) return;
      out->id = InsnId::kNop;
      out->writes = 0;
      return;
    case 0x98:  // cdqe (cwde, cbw without REX.W)
      if (!d.rex_w()) return;
      out->id = InsnId::kCdqe;
      out->writes = bit(0);
      return;
    default:
      break;
  }
  if (op >= 0x50 && op <= 0x5f) {  // push pop r
    const Operand r = gpr(d, (op & 7) | ((d.rex & 1) << 3), v == 2 ? 2 : 8);
    if (op < 0x58) set1(out, InsnId::kPush, r, bit(kRsp));
    else set1(out, InsnId::kPop, r, static_cast<uint16_t>(bit(kRsp) | written(r)));
    return;
  }
  if (op >= 0xb0 && op <= 0xbf) {  // mov r, imm
    const unsigned number = (op & 7) | ((d.rex & 1) << 3);
    const uint8_t size = op < 0xb8 ? 1 : v;
    const Operand dst = gpr(d, number, size);
    set2(out, size == 8 ? InsnId::kMovabs : InsnId::kMov, dst, imm(size), written(dst));
  }
}

// Map 0F's share.
void shape_0f(const Decoded& d, const uint8_t* b, Shape* out) {
  const uint8_t op = d.opcode;
  const uint8_t v = operand_size(d);
  const unsigned reg_number = d.reg() | ((d.rex & 4) << 1);
  switch (op) {
    case 0xb6: case 0xb7: case 0xbe: case 0xbf: {  // movzx movsx
      const Operand dst = gpr(d, reg_number, v);
      const uint8_t from = (op & 1) ? 2 : 1;
      set2(out, op < 0xb8 ? InsnId::kMovzx : InsnId::kMovsx, dst, rm_operand(d, b, from),
           written(dst));
      return;
    }
    case 0x1f:  // nop r/m
      if (d.memory()) set1(out, InsnId::kNop, rm_operand(d, b, v), 0);
      else out->id = InsnId::kNop;
      out->writes = 0;
      return;
    case 0x1e:  // endbr64
      if (d.mandatory == 0xf3 && d.modrm == 0xfa) {
        out->id = InsnId::kEndbr64;
        out->writes = 0;
      }
      return;
    case 0xa0: case 0xa8: case 0xa1: case 0xa9: {  // push/pop fs/gs
      Operand seg;
      seg.type = Operand::kReg;
      seg.size = 2;
      set1(out, (op & 1) ? InsnId::kPop : InsnId::kPush, seg, bit(kRsp));
      return;
    }
    default:
      return;
  }
}

}  // namespace

bool shape_of(const Insn& insn, Shape* out) {
  *out = Shape{};
  out->writes = kWritesAll;
  Decoded d;
  if (decoder::decode(insn.bytes, insn.len, &d) != 0 || d.len != insn.len) return false;
  // What the CPU would make of an ignored REX, or of an unknown instruction, is not
  // followed: unknown, writes everything.
  if (d.rex_ignored || !d.known || d.encoding != decoder::Encoding::kLegacy) return true;
  if (d.map == decoder::kMapOne) shape_one_byte(d, insn.bytes, out);
  else if (d.map == decoder::kMap0F) shape_0f(d, insn.bytes, out);
  if (out->id == InsnId::kUnknown) {
    *out = Shape{};
    out->writes = kWritesAll;
  }
  return true;
}

namespace {

bool is_reg(const Operand& o, int family, uint8_t size) {
  return o.type == Operand::kReg && o.reg >= 0 && o.reg == family && o.size == size;
}

// ---- the function -----------------------------------------------------------------------

bool has_direct_target(const Insn& i) {
  return i.kind == InsnKind::kJmpRel || i.kind == InsnKind::kJccRel ||
         i.kind == InsnKind::kCallRel || i.kind == InsnKind::kLoopRel;
}

constexpr size_t kFromElsewhere = SIZE_MAX;

struct Edge {
  uintptr_t target;
  size_t from;  // index of the transfer in Function::insns, or kFromElsewhere
  bool operator<(const Edge& o) const { return target < o.target; }
};

// How control arrives at an instruction from its only predecessor.
enum class Arrival : uint8_t {
  kFallThrough,  // the predecessor is the previous instruction, and it does not branch here
  kTaken,        // the predecessor is a branch to here (and does not fall through to here)
  kEither,       // the previous instruction is a jcc whose target is the next instruction
};

struct Predecessor {
  size_t index = 0;
  Arrival how = Arrival::kFallThrough;
};

class Function {
 public:
  // Linear sweep of [start, end), and of the related code for its branches into it.
  // false when some bytes do not decode, or a way in lands inside an instruction (the
  // sweep is then not what executes).
  bool decode(const uint8_t* code, uintptr_t start, uintptr_t end,
              const OutsideEntries& outside) {
    start_ = start;
    end_ = end;
    insns_.reserve((end - start) / 4 + 1);
    for (uintptr_t pc = start; pc < end;) {
      Insn insn;
      if (x86_64::decode(code + (pc - start), end - pc, pc, &insn) != 0) return false;
      if (has_direct_target(insn) && contains(insn.target)) {
        edges_.push_back({insn.target, insns_.size()});
      }
      insns_.push_back(insn);
      pc += insn.len;
    }
    for (size_t r = 0; r < outside.n_related; ++r) {
      const RelatedCode& rc = outside.related[r];
      if (!rc.code || rc.end < rc.start) return false;
      for (uintptr_t pc = rc.start; pc < rc.end;) {
        Insn insn;
        if (x86_64::decode(rc.code + (pc - rc.start), rc.end - pc, pc, &insn) != 0) return false;
        if (has_direct_target(insn) && contains(insn.target)) {
          edges_.push_back({insn.target, kFromElsewhere});
        }
        pc += insn.len;
      }
    }
    for (size_t i = 0; i < outside.n_addrs; ++i) {
      if (contains(outside.addrs[i])) edges_.push_back({outside.addrs[i], kFromElsewhere});
    }
    std::sort(edges_.begin(), edges_.end());
    for (const Edge& e : edges_) {
      if (index_of(e.target) < 0) return false;
    }
    return true;
  }

  bool contains(uintptr_t a) const { return a >= start_ && a < end_; }
  const std::vector<Insn>& insns() const { return insns_; }
  const std::vector<Edge>& edges() const { return edges_; }

  // Index of the instruction that starts at `a`, or -1.
  long index_of(uintptr_t a) const {
    auto it = std::lower_bound(insns_.begin(), insns_.end(), a,
                               [](const Insn& i, uintptr_t v) { return i.addr < v; });
    return it != insns_.end() && it->addr == a ? it - insns_.begin() : -1;
  }

  // The only instruction control can come from to reach insns[p], as far as the
  // function's own direct transfers tell (jump-table entries are checked afterwards).
  // false at the function's entry and wherever paths merge.
  bool unique_predecessor(size_t p, Predecessor* out) const {
    if (p == 0) return false;
    auto [lo, hi] = std::equal_range(edges_.begin(), edges_.end(), Edge{insns_[p].addr, 0});
    const size_t branches = static_cast<size_t>(hi - lo);
    if (!insns_[p - 1].ends_flow()) {
      if (branches == 0) {
        *out = {p - 1, Arrival::kFallThrough};
        return true;
      }
      if (branches == 1 && lo->from == p - 1) {
        *out = {p - 1, Arrival::kEither};
        return true;
      }
      return false;
    }
    if (branches != 1 || lo->from == kFromElsewhere) return false;
    *out = {lo->from, Arrival::kTaken};
    return true;
  }

 private:
  uintptr_t start_ = 0, end_ = 0;
  std::vector<Insn> insns_;
  std::vector<Edge> edges_;  // direct transfers into the function, sorted by target
};

// ---- jump tables ------------------------------------------------------------------------

enum class TableForm : uint8_t {
  kRel32,  // int32 offsets from the table's own address (PIC)
  kAbs64,  // absolute 8-byte addresses
};

struct JumpTable {
  uintptr_t table = 0;
  uint64_t count = 0;
  TableForm form = TableForm::kRel32;
  // Addresses whose single predecessor the recognition relied on: a jump-table entry
  // landing on one of them would open a path the walk did not see.
  std::vector<uintptr_t> relied_on;
};

// Walks backward from insns[j] along the only path that reaches it, recognising a table
// dispatch. false: not a recognised jump table.
class TableMatcher {
 public:
  TableMatcher(const Function& f, size_t j) : f_(f), pos_(j) {}

  bool match(JumpTable* out) {
    Shape jmp;
    if (!shape_of(f_.insns()[pos_], &jmp) || jmp.count != 1) return false;
    const Operand& target = jmp.ops[0];
    if (target.type == Operand::kReg && target.reg >= 0 && target.size == 8) {
      phase_ = Phase::kSum;
      sum_ = target.reg;
    } else if (!start_abs64_load(target)) {
      return false;
    }

    while (!done()) {
      if (!step()) return false;
      const Insn& in = f_.insns()[pos_];
      switch (in.kind) {
        case InsnKind::kJmpRel:
          continue;  // an unconditional jump on the path: writes nothing
        case InsnKind::kJccRel:
          note_bound();
          continue;
        case InsnKind::kPlain:
        case InsnKind::kRipRelative:
          break;
        default:
          return false;  // a call, syscall, loop...: registers are not followed across it
      }
      Shape s;
      if (!shape_of(in, &s)) return false;
      if (!advance(in, s)) return false;
    }

    out->form = form_;
    out->count = count_;
    out->table = base_ >= 0 ? base_value_ + static_cast<uintptr_t>(disp_)
                            : static_cast<uintptr_t>(disp_);
    out->relied_on = std::move(relied_on_);
    return true;
  }

 private:
  enum class Phase : uint8_t {
    kSum,       // find what wrote the register the jmp goes through
    kAddends,   // find the load of one addend from a table indexed by the other
    kOperands,  // find the table's base (lea from rip) and the bound on the index
  };

  bool done() const {
    return phase_ == Phase::kOperands && bounded_ && (base_ < 0 || base_known_);
  }

  bool step() {
    if (++steps_ > kMaxSliceLen) return false;
    Predecessor pred;
    if (!f_.unique_predecessor(pos_, &pred)) return false;
    relied_on_.push_back(f_.insns()[pos_].addr);
    arrival_ = pred.how;
    pos_ = pred.index;
    return true;
  }

  // jmp *disp(%base,%idx,8) or its load into a register: absolute 8-byte entries.
  bool start_abs64_load(const Operand& m) {
    if (m.type != Operand::kMem || !m.simple || m.rip || m.size != 8) return false;
    if (m.index < 0 || m.scale != 8 || m.base == m.index) return false;
    form_ = TableForm::kAbs64;
    base_ = m.base;
    index_ = m.index;
    disp_ = m.disp;
    phase_ = Phase::kOperands;
    return true;
  }

  bool advance(const Insn& in, const Shape& s) {
    switch (phase_) {
      case Phase::kSum: {
        if (!(s.writes & bit(sum_))) return true;
        const Operand& d = s.ops[0];
        const Operand& src = s.ops[1];
        if (s.count != 2 || !is_reg(d, sum_, 8)) return false;
        if (s.id == InsnId::kAdd && src.type == Operand::kReg && src.reg >= 0 &&
            src.size == 8 && src.reg != sum_) {
          addend_a_ = sum_;  // add %src, %sum: sum = sum + src
          addend_b_ = src.reg;
          phase_ = Phase::kAddends;
          return true;
        }
        if (s.id == InsnId::kLea && src.type == Operand::kMem && src.simple && !src.rip &&
            src.base >= 0 && src.index >= 0 && src.base != src.index && src.scale == 1 &&
            src.disp == 0) {
          addend_a_ = src.base;  // lea (%a,%b), %sum
          addend_b_ = src.index;
          phase_ = Phase::kAddends;
          return true;
        }
        if (s.id == InsnId::kMov) return start_abs64_load(src);  // mov tbl(,%i,8), %sum
        return false;
      }
      case Phase::kAddends: {
        if (!(s.writes & (bit(addend_a_) | bit(addend_b_)))) return true;
        // movslq (%base,%idx,4), %entry with {entry, base} = the two addends.
        const Operand& d = s.ops[0];
        const Operand& m = s.ops[1];
        if (s.id != InsnId::kMovsxd || s.count != 2 || d.type != Operand::kReg || d.reg < 0 ||
            s.writes != bit(d.reg)) {
          return false;
        }
        const int entry = d.reg;
        const int base = entry == addend_a_ ? addend_b_ : addend_a_;
        if (!is_reg(d, entry, 8) || (entry != addend_a_ && entry != addend_b_)) return false;
        if (m.type != Operand::kMem || !m.simple || m.rip || m.size != 4) return false;
        if (m.base != base || m.index < 0 || m.index == base || m.scale != 4 || m.disp != 0) {
          return false;
        }
        form_ = TableForm::kRel32;
        base_ = base;
        index_ = m.index;
        disp_ = 0;
        phase_ = Phase::kOperands;
        return true;
      }
      case Phase::kOperands: {
        const bool base_pending = base_ >= 0 && !base_known_;
        const uint16_t watched = static_cast<uint16_t>((base_pending ? bit(base_) : 0) |
                                                       (!bounded_ ? bit(index_) : 0));
        if (!(s.writes & watched)) return true;
        if (base_pending && (s.writes & bit(base_))) {
          // lea table(%rip), %base — and nothing else written that we follow.
          if (s.writes != bit(base_) || (!bounded_ && index_ == base_)) return false;
          if (s.id != InsnId::kLea || s.count != 2 || !is_reg(s.ops[0], base_, 8)) return false;
          const Operand& m = s.ops[1];
          if (m.type != Operand::kMem || !m.simple || !m.rip || m.index >= 0) return false;
          base_value_ = in.next() + static_cast<uintptr_t>(m.disp);
          base_known_ = true;
          return true;
        }
        // The index, renamed or zero-extended: mov %src32/64, %idx32/64 or movz[bw]l.
        // Narrower destinations would keep stale upper bits, sign extension could make a
        // small unsigned value huge: neither preserves the bound.
        const Operand& d = s.ops[0];
        const Operand& src = s.ops[1];
        if (s.writes != bit(index_) || s.count != 2) return false;
        if (s.id != InsnId::kMov && s.id != InsnId::kMovzx) return false;
        if (d.type != Operand::kReg || d.reg != index_ || d.size < 4) return false;
        if (src.type != Operand::kReg || src.reg < 0) return false;
        index_ = src.reg;
        return true;
      }
    }
    return false;
  }

  // pos_ is a jcc and control went from it to the instruction we came from. If the jcc
  // tests `cmp $N, %idx` right before it, that edge bounds the index.
  void note_bound() {
    if (phase_ != Phase::kOperands || bounded_ || arrival_ == Arrival::kEither) return;
    const Insn& jcc = f_.insns()[pos_];
    Predecessor pred;
    if (!f_.unique_predecessor(pos_, &pred) || pred.how != Arrival::kFallThrough) return;
    Shape cmp;
    if (!shape_of(f_.insns()[pred.index], &cmp) || cmp.id != InsnId::kCmp || cmp.count != 2) {
      return;
    }
    const Operand& r = cmp.ops[0];
    const Operand& n = cmp.ops[1];
    if (r.type != Operand::kReg || r.reg != index_ || n.type != Operand::kImm) return;
    if (r.size != 1 && r.size != 2 && r.size != 4 && r.size != 8) return;
    const uint64_t mask = r.size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * r.size)) - 1;
    const uint64_t limit = static_cast<uint64_t>(n.imm) & mask;
    const uint8_t holds = arrival_ == Arrival::kTaken ? jcc.cond : jcc.cond ^ 1;
    uint64_t count;
    if (holds == kCondBelowOrEqual) {
      count = limit + 1;  // idx <= N
    } else if (holds == kCondBelow) {
      count = limit;      // idx < N
    } else {
      return;  // a signed or unrelated test bounds nothing
    }
    if (count > kMaxTableEntries) return;
    relied_on_.push_back(jcc.addr);  // the cmp must be the only way into the jcc
    count_ = count;
    bounded_ = true;
  }

  const Function& f_;
  size_t pos_;
  int steps_ = 0;
  Arrival arrival_ = Arrival::kFallThrough;
  std::vector<uintptr_t> relied_on_;

  Phase phase_ = Phase::kSum;
  int sum_ = -1;
  int addend_a_ = -1, addend_b_ = -1;
  TableForm form_ = TableForm::kRel32;
  int base_ = -1;          // register holding the table's address, -1: none (absolute disp)
  bool base_known_ = false;
  uintptr_t base_value_ = 0;
  int64_t disp_ = 0;
  int index_ = -1;
  bool bounded_ = false;
  uint64_t count_ = 0;
};

// Reads a recognised table's entries as absolute addresses.
bool read_entries(const JumpTable& t, ReadMemory read, void* ctx, std::vector<uintptr_t>* out) {
  if (t.count == 0) return true;
  if (!read) return false;
  const size_t width = t.form == TableForm::kRel32 ? 4 : 8;
  std::vector<uint8_t> raw(t.count * width);
  if (!read(ctx, t.table, raw.data(), raw.size())) return false;
  for (uint64_t i = 0; i < t.count; ++i) {
    if (t.form == TableForm::kRel32) {
      int32_t off;
      std::memcpy(&off, raw.data() + i * 4, 4);
      out->push_back(t.table + static_cast<uintptr_t>(static_cast<int64_t>(off)));
    } else {
      uint64_t abs;
      std::memcpy(&abs, raw.data() + i * 8, 8);
      out->push_back(static_cast<uintptr_t>(abs));
    }
  }
  return true;
}

OptimizeRefusal check_region_insn(const Insn& insn) {
  switch (insn.kind) {
    case InsnKind::kCallRel:
    case InsnKind::kCallIndirect:
      return OptimizeRefusal::kCallInRegion;
    case InsnKind::kSyscall:
      return OptimizeRefusal::kSyscallInRegion;
    case InsnKind::kTrap:
    case InsnKind::kPrivileged:
    case InsnKind::kUnsupported:
      return OptimizeRefusal::kNotRelocatable;
    default:
      break;
  }
  // Whether a rip-relative operand reaches depends on where the detour lands, which is
  // decided later: a copy below or above the code will do. What never relocates refuses.
  bool reaches = false;
  for (uintptr_t pc : {insn.addr + kTrialDistance, insn.addr - kTrialDistance}) {
    uint8_t copy[kMaxRelocatedLen];
    const int rc = relocate(insn, pc, copy, sizeof copy);
    if (rc == -EINVAL) return OptimizeRefusal::kNotRelocatable;
    reaches |= rc >= 0;
  }
  return reaches ? OptimizeRefusal::kNone : OptimizeRefusal::kNotRelocatable;
}

}  // namespace

const char* refusal_text(OptimizeRefusal r) {
  switch (r) {
    case OptimizeRefusal::kNone: return "optimizable";
    case OptimizeRefusal::kOutsideFunction: return "region not inside the function";
    case OptimizeRefusal::kDecodeFailed: return "function does not decode";
    case OptimizeRefusal::kNotBoundary: return "not an instruction boundary";
    case OptimizeRefusal::kCallInRegion: return "call in the region";
    case OptimizeRefusal::kSyscallInRegion: return "syscall in the region";
    case OptimizeRefusal::kNotRelocatable: return "instruction in the region not relocatable";
    case OptimizeRefusal::kJumpIntoRegion: return "jump into the region";
    case OptimizeRefusal::kIndirectJump: return "indirect jump in the function";
    case OptimizeRefusal::kCodeAfterTransfer: return "code after a jump or return in the region";
  }
  return "unknown";
}

OptimizeRefusal check_optimizable(const uint8_t* code, uintptr_t func_start, uintptr_t func_end,
                                  uintptr_t addr, ReadMemory read, void* ctx,
                                  OptimizeRegion* out) {
  return check_optimizable(code, func_start, func_end, addr, read, ctx, OutsideEntries{}, out);
}

OptimizeRefusal check_optimizable(const uint8_t* code, uintptr_t func_start, uintptr_t func_end,
                                  uintptr_t addr, ReadMemory read, void* ctx,
                                  const OutsideEntries& outside, OptimizeRegion* out) {
  *out = OptimizeRegion{};
  if (!code || func_start >= func_end || addr < func_start || addr >= func_end) {
    return OptimizeRefusal::kOutsideFunction;
  }
  Function f;
  if (!f.decode(code, func_start, func_end, outside)) {
    return OptimizeRefusal::kDecodeFailed;
  }
  const long first = f.index_of(addr);
  if (first < 0) return OptimizeRefusal::kNotBoundary;

  // The region: whole instructions from addr until the jmp fits.
  const std::vector<Insn>& insns = f.insns();
  OptimizeRegion region;
  region.addr = addr;
  size_t len = 0;
  for (size_t i = static_cast<size_t>(first); len < kJmpRel32Len; ++i) {
    if (i == insns.size()) return OptimizeRefusal::kOutsideFunction;
    region.insns[region.count++] = insns[i];
    len += insns[i].len;
  }
  region.len = static_cast<uint8_t>(len);
  *out = region;
  const uintptr_t end = region.end();
  auto strictly_inside = [&](uintptr_t a) { return a > addr && a < end; };

  for (uint8_t i = 0; i < region.count; ++i) {
    if (OptimizeRefusal r = check_region_insn(region.insns[i]); r != OptimizeRefusal::kNone) {
      return r;
    }
  }

  // Direct transfers anywhere in the function (the region's own included), in the
  // related code, and the other ways in.
  for (const Edge& e : f.edges()) {
    if (strictly_inside(e.target)) return OptimizeRefusal::kJumpIntoRegion;
  }

  // Indirect jumps: harmless through a rip-relative slot (a GOT or tail-call pointer,
  // which leaves the function), bounded when they are a recognised jump table.
  std::vector<JumpTable> tables;
  std::vector<uintptr_t> entries;
  bool entry_into_region = false;
  for (size_t j = 0; j < insns.size(); ++j) {
    const Insn& insn = insns[j];
    if (insn.kind != InsnKind::kJmpIndirect || insn.uses_rip) continue;
    JumpTable t;
    if (!TableMatcher(f, j).match(&t)) return OptimizeRefusal::kIndirectJump;
    const size_t before = entries.size();
    if (!read_entries(t, read, ctx, &entries)) return OptimizeRefusal::kIndirectJump;
    for (size_t k = before; k < entries.size(); ++k) {
      // An entry elsewhere than on an instruction of this function means we misread the
      // table (or the code is not what the sweep saw): trust nothing then.
      if (!f.contains(entries[k]) || f.index_of(entries[k]) < 0) {
        return OptimizeRefusal::kIndirectJump;
      }
      entry_into_region |= strictly_inside(entries[k]);
    }
    tables.push_back(std::move(t));
  }
  // A table's entry on an instruction another table's walk went through backward would
  // have given that walk a second way in: its bound or base may not hold.
  std::sort(entries.begin(), entries.end());
  for (const JumpTable& t : tables) {
    for (uintptr_t a : t.relied_on) {
      if (std::binary_search(entries.begin(), entries.end(), a)) {
        return OptimizeRefusal::kIndirectJump;
      }
    }
  }
  if (entry_into_region) return OptimizeRefusal::kJumpIntoRegion;
  // Last, so that a way in that is known gets its own refusal: the bytes after a jmp or
  // ret inside the region are reached only from somewhere, and that somewhere may be a
  // way in nobody told us about.
  for (uint8_t i = 0; i + 1 < region.count; ++i) {
    if (region.insns[i].ends_flow()) return OptimizeRefusal::kCodeAfterTransfer;
  }
  return OptimizeRefusal::kNone;
}

}  // namespace probefs::arch::x86_64
