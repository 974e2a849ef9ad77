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

#include "arch/x86_64/isa/capstone_handle.h"

#include <capstone/capstone.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "arch/x86_64/isa/relocate.h"

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

// ---- operands, through Capstone -------------------------------------------------------

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

struct Operand {
  enum Type : uint8_t { kNone, kReg, kImm, kMem };
  Type type = kNone;
  uint8_t size = 0;   // bytes
  int reg = -1;       // kReg: GPR family, -1 for any other register
  int64_t imm = 0;    // kImm
  // kMem. `simple`: no segment override, 64-bit addressing, base and index are GPRs (or
  // absent; the base may be rip). Only simple operands take part in a table pattern.
  bool simple = false;
  bool rip = false;
  int base = -1, index = -1;
  int scale = 1;
  int64_t disp = 0;
};

// An instruction as the table matcher sees it.
struct Shape {
  unsigned id = X86_INS_INVALID;
  uint8_t count = 0;        // operands
  Operand ops[2];
  uint16_t writes = 0;      // GPR families written, one bit each
};

constexpr uint16_t bit(int family) { return static_cast<uint16_t>(1u << family); }

bool shape_of(const Insn& insn, Shape* out) {
  *out = Shape{};
  const cs_insn* ci = operand_reader().one(insn.bytes, insn.len, insn.addr);
  if (!ci || ci->size != insn.len) return false;
  const cs_x86& x = ci->detail->x86;
  const bool addr32 = x.prefix[3] == X86_PREFIX_ADDRSIZE;
  out->id = ci->id;
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
        if (s.id == X86_INS_ADD && src.type == Operand::kReg && src.reg >= 0 &&
            src.size == 8 && src.reg != sum_) {
          addend_a_ = sum_;  // add %src, %sum: sum = sum + src
          addend_b_ = src.reg;
          phase_ = Phase::kAddends;
          return true;
        }
        if (s.id == X86_INS_LEA && src.type == Operand::kMem && src.simple && !src.rip &&
            src.base >= 0 && src.index >= 0 && src.base != src.index && src.scale == 1 &&
            src.disp == 0) {
          addend_a_ = src.base;  // lea (%a,%b), %sum
          addend_b_ = src.index;
          phase_ = Phase::kAddends;
          return true;
        }
        if (s.id == X86_INS_MOV) return start_abs64_load(src);  // mov tbl(,%i,8), %sum
        return false;
      }
      case Phase::kAddends: {
        if (!(s.writes & (bit(addend_a_) | bit(addend_b_)))) return true;
        // movslq (%base,%idx,4), %entry with {entry, base} = the two addends.
        const Operand& d = s.ops[0];
        const Operand& m = s.ops[1];
        if (s.id != X86_INS_MOVSXD || s.count != 2 || d.type != Operand::kReg || d.reg < 0 ||
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
          if (s.id != X86_INS_LEA || s.count != 2 || !is_reg(s.ops[0], base_, 8)) return false;
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
        if (s.id != X86_INS_MOV && s.id != X86_INS_MOVZX) return false;
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
    if (!shape_of(f_.insns()[pred.index], &cmp) || cmp.id != X86_INS_CMP || cmp.count != 2) {
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
