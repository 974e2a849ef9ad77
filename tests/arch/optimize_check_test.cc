// Jump-optimization safety checks: hand-assembled functions (one per refusal, and the
// jump-table forms GCC and Clang emit), then real compiled code of this binary and libc.
#include "arch/x86_64/isa/optimize_check.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <initializer_list>
#include <map>
#include <ostream>
#include <set>
#include <vector>

#include "tests/arch/optimize_check_fixtures.h"

namespace probefs::arch::x86_64 {

// GoogleTest prints refusals by their text.
void PrintTo(OptimizeRefusal r, std::ostream* os) { *os << '"' << refusal_text(r) << '"'; }

namespace {

constexpr uintptr_t kFunc = 0x401000;   // where the hand-assembled functions "live"
constexpr uintptr_t kTable = 0x402000;  // and their jump tables (low: fits a disp32)

// Appends n bytes (resize and memcpy: GCC 12 at -O3 warns falsely about vector's range
// insert of raw bytes).
void append_bytes(std::vector<uint8_t>* v, const void* p, size_t n) {
  const size_t at = v->size();
  v->resize(at + n);
  std::memcpy(v->data() + at, p, n);
}

// A tiny assembler: raw bytes plus rel8/rel32/rip-relative fields patched to labels.
class Asm {
 public:
  explicit Asm(uintptr_t base = kFunc) : base_(base) {}

  uintptr_t here() const { return base_ + code_.size(); }
  Asm& raw(std::initializer_list<uint8_t> b) {
    append_bytes(&code_, b.begin(), b.size());
    return *this;
  }
  // Opcode bytes, then a rel8 / rel32 to `label` (the field ends the instruction).
  Asm& rel8(std::initializer_list<uint8_t> op, int label) { return rel(op, label, 1); }
  Asm& rel32(std::initializer_list<uint8_t> op, int label) { return rel(op, label, 4); }
  // Opcode bytes, then a disp32 reaching `abs` from the end of the instruction.
  Asm& rip32(std::initializer_list<uint8_t> op, uintptr_t abs) {
    raw(op);
    const int32_t d = static_cast<int32_t>(abs - (here() + 4));
    put(d, 4);
    return *this;
  }
  Asm& bind(int label) {
    labels_[label] = here();
    return *this;
  }
  uintptr_t at(int label) const { return labels_.at(label); }

  std::vector<uint8_t> finish() const {
    std::vector<uint8_t> out = code_;
    for (const Fixup& f : fixups_) {
      const int32_t d = static_cast<int32_t>(labels_.at(f.label) - (base_ + f.offset + f.width));
      std::memcpy(out.data() + f.offset, &d, f.width);  // little-endian: low bytes first
    }
    return out;
  }
  uintptr_t end() const { return here(); }

 private:
  struct Fixup {
    size_t offset;
    size_t width;
    int label;
  };
  Asm& rel(std::initializer_list<uint8_t> op, int label, size_t width) {
    raw(op);
    fixups_.push_back({code_.size(), width, label});
    put(0, width);
    return *this;
  }
  void put(int32_t v, size_t width) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    append_bytes(&code_, b, width);
  }

  uintptr_t base_;
  std::vector<uint8_t> code_;
  std::vector<Fixup> fixups_;
  std::map<int, uintptr_t> labels_;
};

// Memory outside the function: a few byte ranges; anything else is unreadable.
class FakeMemory {
 public:
  void add(uintptr_t addr, std::vector<uint8_t> bytes) { ranges_[addr] = std::move(bytes); }
  void rel32_table(uintptr_t table, std::initializer_list<uintptr_t> targets) {
    std::vector<uint8_t> b(targets.size() * 4);
    size_t at = 0;
    for (uintptr_t t : targets) {
      const int32_t off = static_cast<int32_t>(t - table);
      std::memcpy(b.data() + at, &off, 4);
      at += 4;
    }
    add(table, b);
  }
  void abs64_table(uintptr_t table, std::initializer_list<uintptr_t> targets) {
    std::vector<uint8_t> b(targets.size() * 8);
    size_t at = 0;
    for (uint64_t t : targets) {
      std::memcpy(b.data() + at, &t, 8);
      at += 8;
    }
    add(table, b);
  }
  static bool read(void* ctx, uintptr_t addr, void* buf, size_t n) {
    auto* self = static_cast<FakeMemory*>(ctx);
    ++self->reads_;
    for (const auto& [at, bytes] : self->ranges_) {
      if (addr >= at && addr + n <= at + bytes.size()) {
        std::memcpy(buf, bytes.data() + (addr - at), n);
        return true;
      }
    }
    return false;
  }
  int reads() const { return reads_; }

 private:
  std::map<uintptr_t, std::vector<uint8_t>> ranges_;
  int reads_ = 0;
};

OptimizeRefusal check_at(const Asm& a, uintptr_t addr, FakeMemory* mem = nullptr,
                         OptimizeRegion* region = nullptr) {
  const std::vector<uint8_t> code = a.finish();
  OptimizeRegion r;
  FakeMemory none;
  FakeMemory* m = mem ? mem : &none;
  return check_optimizable(code.data(), kFunc, kFunc + code.size(), addr, &FakeMemory::read, m,
                           region ? region : &r);
}


// ---- the region and its instructions ------------------------------------------------------

TEST(OptimizeCheck, PrologueIsOptimizableAndTheRegionIsWholeInstructions) {
  Asm a;
  a.raw({0x55})                     // push %rbp
      .raw({0x48, 0x89, 0xe5})      // mov %rsp,%rbp
      .raw({0x48, 0x83, 0xec, 0x10})  // sub $0x10,%rsp
      .raw({0xc9})                  // leave
      .raw({0xc3});                 // ret
  OptimizeRegion r;
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, nullptr, &r));
  EXPECT_EQ(r.addr, kFunc);
  EXPECT_EQ(r.len, 8);  // 1 + 3 + 4: the sub is whole, not cut at 5
  EXPECT_EQ(r.count, 3);
  EXPECT_EQ(r.insns[2].addr, kFunc + 4);
  // From the mov: mov + sub = 7 bytes, still inside.
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc + 1));
}

TEST(OptimizeCheck, RegionMustLieInsideTheFunction) {
  Asm a;
  a.raw({0x48, 0x89, 0xf8})  // mov %rdi,%rax
      .raw({0x48, 0x01, 0xf0})  // add %rsi,%rax
      .raw({0xc3});           // ret
  OptimizeRegion r;
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc));
  // From the add: add + ret = 4 bytes, and the function ends there.
  EXPECT_EQ(OptimizeRefusal::kOutsideFunction, check_at(a, kFunc + 3, nullptr, &r));
  EXPECT_EQ(r.len, 0);
  EXPECT_EQ(OptimizeRefusal::kOutsideFunction, check_at(a, kFunc - 1));
  EXPECT_EQ(OptimizeRefusal::kOutsideFunction, check_at(a, a.end()));
}

TEST(OptimizeCheck, AddressInsideAnInstructionIsNotABoundary) {
  Asm a;
  a.raw({0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc9, 0xc3});  // mov; sub; leave; ret
  EXPECT_EQ(OptimizeRefusal::kNotBoundary, check_at(a, kFunc + 1));
  EXPECT_EQ(OptimizeRefusal::kNotBoundary, check_at(a, kFunc + 5));
}

TEST(OptimizeCheck, UndecodableBytesAnywhereInTheFunctionRefuse) {
  Asm a;
  a.raw({0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10})  // mov %rsp,%rbp ; sub $0x10,%rsp
      .raw({0xc9, 0xc3})                           // leave ; ret
      .raw({0x06});                                // push %es: invalid in 64-bit mode
  EXPECT_EQ(OptimizeRefusal::kDecodeFailed, check_at(a, kFunc));
  Asm cut;
  cut.raw({0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc3})
      .raw({0x48, 0x8b});  // mov r64, r/m64 without its ModRM: runs past the end
  EXPECT_EQ(OptimizeRefusal::kDecodeFailed, check_at(cut, kFunc));
}

TEST(OptimizeCheck, TrapsAndPaddingAfterNoreturnCallsStillDecode) {
  Asm a;
  a.raw({0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10})  // mov %rsp,%rbp ; sub $0x10,%rsp
      .rel32({0xe8}, 1)                             // call abort (outside)
      .raw({0x0f, 0x0b})                            // ud2
      .raw({0xcc, 0xcc})                            // int3 padding
      .raw({0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0});  // cs nopw 0x0(%rax,%rax,1)
  a.bind(1);  // (the label sits right at the end; only its distance matters)
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc));
}

TEST(OptimizeCheck, JumpIntoTheMiddleOfAnInstructionMeansTheSweepIsWrong) {
  Asm a;
  a.raw({0xeb, 0x01})              // jmp .+3: into the mov's ModRM byte
      .raw({0x48, 0x89, 0xe5})     // mov %rsp,%rbp
      .raw({0x48, 0x83, 0xec, 0x10, 0xc3});
  EXPECT_EQ(OptimizeRefusal::kDecodeFailed, check_at(a, kFunc + 5));
}

TEST(OptimizeCheck, CallInTheRegionRefuses) {
  Asm a;
  a.rel32({0xe8}, 1)            // call f
      .raw({0x48, 0x89, 0xc7})  // mov %rax,%rdi
      .raw({0x48, 0x89, 0xc6})  // mov %rax,%rsi
      .raw({0xc3});
  a.bind(1);
  EXPECT_EQ(OptimizeRefusal::kCallInRegion, check_at(a, kFunc));
  Asm b;
  b.raw({0x55})                 // push %rbp
      .raw({0xff, 0xd0})        // call *%rax
      .raw({0x5d, 0xc3, 0x90});  // pop %rbp ; ret ; nop
  EXPECT_EQ(OptimizeRefusal::kCallInRegion, check_at(b, kFunc));
  // After the call the region no longer holds it.
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc + 5));
}

TEST(OptimizeCheck, SyscallInTheRegionRefuses) {
  Asm a;
  a.raw({0x0f, 0x05})           // syscall
      .raw({0x48, 0x89, 0xc7})  // mov %rax,%rdi
      .raw({0xc3});
  EXPECT_EQ(OptimizeRefusal::kSyscallInRegion, check_at(a, kFunc));
}

TEST(OptimizeCheck, TrapsPrivilegedAndUnsupportedInstructionsAreNotRelocatable) {
  Asm ud2;
  ud2.raw({0x48, 0x89, 0xe5, 0x0f, 0x0b, 0x90});  // mov %rsp,%rbp ; ud2 ; nop
  EXPECT_EQ(OptimizeRefusal::kNotRelocatable, check_at(ud2, kFunc));
  Asm hlt;
  hlt.raw({0x48, 0x89, 0xe5, 0xf4, 0x90, 0xc3});  // mov ; hlt ; nop ; ret
  EXPECT_EQ(OptimizeRefusal::kNotRelocatable, check_at(hlt, kFunc));
  Asm xbegin;
  xbegin.raw({0xc7, 0xf8, 0, 0, 0, 0, 0xc3});  // xbegin .+6 ; ret
  EXPECT_EQ(OptimizeRefusal::kNotRelocatable, check_at(xbegin, kFunc));
}

TEST(OptimizeCheck, RelativeBranchesInTheRegionRelocateWhenTheyLeaveIt) {
  Asm a;
  a.raw({0x48, 0x85, 0xff})  // test %rdi,%rdi
      .rel8({0x74}, 1)       // je out (rel8: must become rel32 in the detour)
      .raw({0x48, 0x8b, 0x05, 0x10, 0, 0, 0})  // mov 0x10(%rip),%rax
      .raw({0xc3});
  a.bind(1).raw({0x31, 0xc0, 0xc3});
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc));
  // A jcc in the region aimed at the first byte after it is fine too.
  Asm b;
  b.rel8({0x74}, 1)  // je 5
      .raw({0x48, 0x89, 0xe5});
  b.bind(1).raw({0xc3});
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(b, kFunc));
}

// ---- branches into the region ---------------------------------------------------------------

TEST(OptimizeCheck, LoopBackIntoTheFirstFiveBytesRefusesTheEntry) {
  Asm a;
  a.raw({0x31, 0xc0});             // 0: xor %eax,%eax
  a.bind(1).raw({0x48, 0xff, 0xc0})  // 2: inc %rax        <- loop head
      .raw({0x48, 0x39, 0xf8})     // 5: cmp %rdi,%rax
      .rel8({0x72}, 1)             // 8: jb 2
      .raw({0xc3});                // a: ret
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(a, kFunc));
  // At the loop head itself the branch lands on the region's first byte: fine.
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc + 2));
}

TEST(OptimizeCheck, BranchFromInsideTheRegionToItsOwnMiddleRefuses) {
  Asm a;
  a.rel8({0xeb}, 1);  // jmp 2
  a.bind(1).raw({0x48, 0x89, 0xe5, 0xc3});
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(a, kFunc));
}

TEST(OptimizeCheck, CallsAndLoopsIntoTheRegionRefuse) {
  Asm call;
  call.raw({0x48, 0x89, 0xf8});      // 0: mov %rdi,%rax
  call.bind(1).raw({0x48, 0x01, 0xf0, 0xc3});  // 3: add %rsi,%rax ; ret
  call.rel32({0xe8}, 1).raw({0xc3});  // call 3
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(call, kFunc));

  Asm loop;
  loop.raw({0x31, 0xc0});            // 0: xor %eax,%eax
  loop.bind(1).raw({0x48, 0xff, 0xc0});  // 2: inc %rax
  loop.rel8({0xe2}, 1).raw({0xc3});  // loop 2 ; ret
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(loop, kFunc));
}

// A part of the function the compiler split off (`foo.cold`) branches back into it.
TEST(OptimizeCheck, BranchesFromRelatedCodeCount) {
  Asm a;
  a.raw({0x48, 0x85, 0xff});        // 0: test %rdi,%rdi
  a.bind(1).raw({0x48, 0x89, 0xf8})  // 3: mov %rdi,%rax   <- the cold part returns here
      .raw({0x48, 0x01, 0xf0, 0xc3});  // add %rsi,%rax ; ret
  const std::vector<uint8_t> code = a.finish();
  Asm cold(kFunc + 0x1000);
  cold.raw({0x48, 0x31, 0xff}).raw({0xe9});  // xor %rdi,%rdi ; jmp back to 3
  std::vector<uint8_t> cold_code = cold.finish();
  const int32_t back = static_cast<int32_t>((kFunc + 3) - (cold.end() + 4));
  append_bytes(&cold_code, &back, 4);
  const RelatedCode related{cold_code.data(), kFunc + 0x1000, kFunc + 0x1000 + cold_code.size()};
  FakeMemory none;
  OptimizeRegion r;
  EXPECT_EQ(OptimizeRefusal::kNone,
            check_optimizable(code.data(), kFunc, a.end(), kFunc, &FakeMemory::read, &none, &r));
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion,
            check_optimizable(code.data(), kFunc, a.end(), kFunc, &FakeMemory::read, &none,
                              OutsideEntries{&related, 1}, &r));
  // At the join point itself the branch lands on the region's first byte.
  EXPECT_EQ(OptimizeRefusal::kNone,
            check_optimizable(code.data(), kFunc, a.end(), kFunc + 3, &FakeMemory::read, &none,
                              OutsideEntries{&related, 1}, &r));
  const uint8_t junk[] = {0x48, 0x89, 0xe5, 0x06};  // mov %rsp,%rbp ; (invalid)
  const RelatedCode bad{junk, kFunc + 0x2000, kFunc + 0x2000 + sizeof junk};
  EXPECT_EQ(OptimizeRefusal::kDecodeFailed,
            check_optimizable(code.data(), kFunc, a.end(), kFunc + 3, &FakeMemory::read, &none,
                              OutsideEntries{&bad, 1}, &r));
}

// ---- indirect jumps ---------------------------------------------------------------------------

TEST(OptimizeCheck, RegisterIndirectJumpAnywhereRefuses) {
  Asm a;
  a.raw({0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10})  // mov ; sub
      .raw({0x48, 0x8b, 0x07})                     // mov (%rdi),%rax
      .raw({0xff, 0xe0});                          // jmp *%rax: a tail call through a pointer
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc));
  Asm m;
  m.raw({0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10})
      .raw({0xff, 0x60, 0x10});  // jmp *0x10(%rax)
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(m, kFunc));
}

TEST(OptimizeCheck, JumpThroughARipRelativeSlotIsATailCallOut) {
  Asm a;
  a.raw({0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0xc9})  // mov ; sub ; leave
      .rip32({0xff, 0x25}, 0x403000);                    // jmp *slot(%rip)
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc));
}

// The PIC switch GCC emits:
//   0: mov %esi,%edx ; cmp $3,%edi ; ja default ; lea table(%rip),%rcx ; mov %edi,%edi
//      movslq (%rcx,%rdi,4),%rax ; add %rcx,%rax ; notrack jmp *%rax
//   case0..3: lea k(%rdx),%eax ; ret        default: mov $-1,%eax ; ret
enum Label { kDefault = 100, kCase0, kCase1, kCase2, kCase3, kLea, kLoad };

void emit_cases(Asm& a) {
  for (int c = 0; c < 4; ++c) {
    a.bind(kCase0 + c).raw({0x8d, 0x42, static_cast<uint8_t>(c + 1), 0xc3});  // lea c+1(%rdx),%eax
  }
  a.bind(kDefault).raw({0xb8, 0xff, 0xff, 0xff, 0xff, 0xc3});  // mov $-1,%eax ; ret
}

Asm gcc_switch(uint8_t bound = 3, uint8_t ja = 0x77,
               std::initializer_list<uint8_t> index_setup = {0x89, 0xff}) {
  Asm a;
  a.raw({0x89, 0xf2})                  // mov %esi,%edx
      .raw({0x83, 0xff, bound})        // cmp $bound,%edi
      .rel8({ja}, kDefault);           // ja default
  a.bind(kLea).rip32({0x48, 0x8d, 0x0d}, kTable)  // lea table(%rip),%rcx
      .raw(index_setup);                         // mov %edi,%edi
  a.bind(kLoad).raw({0x48, 0x63, 0x04, 0xb9})    // movslq (%rcx,%rdi,4),%rax
      .raw({0x48, 0x01, 0xc8})                   // add %rcx,%rax
      .raw({0x3e, 0xff, 0xe0});                  // notrack jmp *%rax
  emit_cases(a);
  return a;
}

void gcc_table(FakeMemory& mem, const Asm& a) {
  mem.rel32_table(kTable, {a.at(kCase0), a.at(kCase1), a.at(kCase2), a.at(kCase3)});
}

TEST(OptimizeCheck, GccJumpTableIsDecodedAndItsEntriesChecked) {
  Asm a = gcc_switch();
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, &mem));
  EXPECT_GT(mem.reads(), 0);
  // From case 0: lea (3) + ret (1) + lea (3) of case 1: the table's entry for case 1 is
  // strictly inside the region.
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(a, a.at(kCase0), &mem));
  // From the ret of case 0: ret + case 1's lea + ret = 5 bytes, case 1 at byte 1.
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(a, a.at(kCase0) + 3, &mem));
}

TEST(OptimizeCheck, JumpTableBoundComesFromTheCompareAndItsCondition) {
  // ja after cmp $3: 4 entries, exactly what the fake memory holds (a 5th read fails).
  {
    Asm a = gcc_switch(3, 0x77);
    FakeMemory mem;
    gcc_table(mem, a);
    EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, &mem));
  }
  // jae after cmp $4: idx < 4, again 4 entries.
  {
    Asm a = gcc_switch(4, 0x73);
    FakeMemory mem;
    gcc_table(mem, a);
    EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, &mem));
  }
  // ja after cmp $4 would need 5 entries: the read of 20 bytes fails, nothing is trusted.
  {
    Asm a = gcc_switch(4, 0x77);
    FakeMemory mem;
    gcc_table(mem, a);
    EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &mem));
  }
  // jg (signed): a negative index passes, nothing bounds the table.
  {
    Asm a = gcc_switch(3, 0x7f);
    FakeMemory mem;
    gcc_table(mem, a);
    EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &mem));
  }
}

TEST(OptimizeCheck, JumpTableRefusedWhenTheIndexChangesAfterTheCompare) {
  Asm a = gcc_switch(3, 0x77, {0x83, 0xc7, 0x01});  // add $1,%edi instead of mov %edi,%edi
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &mem));
  // movzbl %dil,%edi keeps the bound (zero extension); movsbl %dil,%edi does not.
  Asm zx = gcc_switch(3, 0x77, {0x40, 0x0f, 0xb6, 0xff});
  FakeMemory zmem;
  gcc_table(zmem, zx);
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(zx, kFunc, &zmem));
  Asm sx = gcc_switch(3, 0x77, {0x40, 0x0f, 0xbe, 0xff});
  FakeMemory smem;
  gcc_table(smem, sx);
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(sx, kFunc, &smem));
}

TEST(OptimizeCheck, JumpTableRefusedWhenUnreadableOrItsEntriesAreWrong) {
  Asm a = gcc_switch();
  FakeMemory empty;
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &empty));
  const std::vector<uint8_t> code = a.finish();
  OptimizeRegion r;
  EXPECT_EQ(OptimizeRefusal::kIndirectJump,
                 check_optimizable(code.data(), kFunc, a.end(), kFunc, nullptr, nullptr, &r));

  FakeMemory outside;  // an entry past the function's end
  outside.rel32_table(kTable, {a.at(kCase0), a.at(kCase1), a.end() + 0x40, a.at(kCase3)});
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &outside));

  FakeMemory mid;  // an entry inside an instruction
  mid.rel32_table(kTable, {a.at(kCase0), a.at(kCase1) + 1, a.at(kCase2), a.at(kCase3)});
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &mid));
}

TEST(OptimizeCheck, JumpTableRefusedWhenAnotherPathEntersItsSetup) {
  // A case jumps back to the movslq: the index there is not the compared one.
  Asm a;
  a.raw({0x89, 0xf2}).raw({0x83, 0xff, 0x03}).rel8({0x77}, kDefault);
  a.bind(kLea).rip32({0x48, 0x8d, 0x0d}, kTable).raw({0x89, 0xff});
  a.bind(kLoad).raw({0x48, 0x63, 0x04, 0xb9, 0x48, 0x01, 0xc8, 0x3e, 0xff, 0xe0});
  emit_cases(a);
  a.raw({0xff, 0xc7}).rel8({0xeb}, kLoad);  // inc %edi ; jmp load
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &mem));

  // The same through the table itself: an entry lands on the mov %edi,%edi.
  Asm b = gcc_switch();
  FakeMemory self;
  self.rel32_table(kTable, {b.at(kCase0), b.at(kLea) + 7, b.at(kCase2), b.at(kCase3)});
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(b, kFunc, &self));
}

// GCC 12 -O2 for `int foo(int x) { G g; bar(x); return x + 1; }` (G with an out-of-line
// destructor): the landing pad follows the ret. A jmp from the pop would cover the ret and
// the pad's first bytes, so the first exception through foo would run the jmp's tail.
TEST(OptimizeCheck, BytesAfterARetInTheRegionRefuseEvenWithNoWayInKnown) {
  Asm a;
  a.raw({0x53})                                // +0x00 push %rbx
      .raw({0x89, 0xfb})                       // +0x01 mov %edi,%ebx
      .raw({0x48, 0x83, 0xec, 0x10})           // +0x03 sub $0x10,%rsp
      .raw({0x90, 0x90, 0x90, 0x90, 0x90})     // +0x07 (call bar: a nop here)
      .raw({0x48, 0x8d, 0x7c, 0x24, 0x0f})     // +0x0c lea 0xf(%rsp),%rdi
      .raw({0x90, 0x90, 0x90, 0x90, 0x90})     // +0x11 (call G::~G)
      .raw({0x48, 0x83, 0xc4, 0x10})           // +0x16 add $0x10,%rsp
      .raw({0x8d, 0x43, 0x01})                 // +0x1a lea 0x1(%rbx),%eax
      .raw({0x5b})                             // +0x1d pop %rbx
      .raw({0xc3})                             // +0x1e ret
      .raw({0x48, 0x89, 0xc3})                 // +0x1f mov %rax,%rbx   (the landing pad)
      .raw({0xeb, 0x00});                      // +0x22 jmp (to foo.cold)
  EXPECT_EQ(OptimizeRefusal::kCodeAfterTransfer, check_at(a, kFunc + 0x1d));
  EXPECT_EQ(OptimizeRefusal::kCodeAfterTransfer, check_at(a, kFunc + 0x1e));
  // The region from the lea ends with the ret: nothing after it is replaced.
  OptimizeRegion r;
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc + 0x1a, nullptr, &r));
  EXPECT_EQ(r.end(), kFunc + 0x1f);
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc + 0x16));
}

TEST(OptimizeCheck, BytesAfterAJmpInTheRegionRefuse) {
  Asm a;
  a.raw({0x50})                      // 0: push %rax
      .rel8({0xeb}, 1)               // 1: jmp .L1
      .raw({0x48, 0x01, 0xf0})       // 3: add %rsi,%rax  (reached from nowhere we see)
      .bind(1)
      .raw({0x58})                   // 6: pop %rax
      .raw({0x48, 0x01, 0xf0})       // 7: add %rsi,%rax
      .raw({0xc3});                  // 10: ret
  EXPECT_EQ(OptimizeRefusal::kCodeAfterTransfer, check_at(a, kFunc));
  // A jmp as the region's last instruction replaces nothing after it.
  Asm b;
  b.raw({0x48, 0x89, 0xf8})          // 0: mov %rdi,%rax
      .rel32({0xe9}, 1)              // 3: jmp .L1 (rel32)
      .raw({0x48, 0x01, 0xf0})       // 8: add %rsi,%rax
      .bind(1)
      .raw({0xc3});                  // 11: ret
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(b, kFunc));
  // An indirect jump through a rip-relative slot (a tail call out) ends the flow too, and
  // the region may end with it.
  Asm c;
  c.raw({0x48, 0x89, 0xf8})                          // 0: mov %rdi,%rax
      .rip32({0xff, 0x25}, kTable)                   // 3: jmp *slot(%rip)
      .raw({0x48, 0x01, 0xf0, 0xc3});                // 9: add %rsi,%rax ; ret
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(c, kFunc));       // ends with the jmp
  EXPECT_EQ(OptimizeRefusal::kOutsideFunction, check_at(c, kFunc + 9));
}

TEST(OptimizeCheck, LandingPadsAreWaysIn) {
  Asm a;
  a.raw({0x48, 0x89, 0xf8})            // 0: mov %rdi,%rax
      .raw({0x48, 0x01, 0xf0, 0xc3})   // 3: add %rsi,%rax ; ret
      .raw({0x48, 0x89, 0xc7, 0xc3});  // 7: mov %rax,%rdi ; ret   (a landing pad)
  const std::vector<uint8_t> code = a.finish();
  FakeMemory none;
  OptimizeRegion r;
  // From the add: add, ret, and the pad's mov; the unwinder would land in the jmp. Told
  // of the pad, the check names it; not told, the bytes after the ret refuse all the same.
  const uintptr_t pad[] = {kFunc + 7};
  EXPECT_EQ(OptimizeRefusal::kCodeAfterTransfer,
            check_optimizable(code.data(), kFunc, a.end(), kFunc + 3, &FakeMemory::read, &none,
                              &r));
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion,
            check_optimizable(code.data(), kFunc, a.end(), kFunc + 3, &FakeMemory::read, &none,
                              OutsideEntries{nullptr, 0, pad, 1}, &r));
  const uintptr_t inside_an_insn[] = {kFunc + 8};
  EXPECT_EQ(OptimizeRefusal::kDecodeFailed,
            check_optimizable(code.data(), kFunc, a.end(), kFunc, &FakeMemory::read, &none,
                              OutsideEntries{nullptr, 0, inside_an_insn, 1}, &r));
}

TEST(OptimizeCheck, RelatedCodeEnteringATableSetupRefuses) {
  Asm a = gcc_switch();
  FakeMemory mem;
  gcc_table(mem, a);
  const std::vector<uint8_t> code = a.finish();
  // Elsewhere: jmp load (a second way into the dispatch, with an unchecked index).
  std::vector<uint8_t> cold = {0xe9, 0, 0, 0, 0};
  const uintptr_t cold_at = kFunc + 0x1000;
  const int32_t rel = static_cast<int32_t>(a.at(kLoad) - (cold_at + 5));
  std::memcpy(cold.data() + 1, &rel, 4);
  const RelatedCode related{cold.data(), cold_at, cold_at + cold.size()};
  OptimizeRegion r;
  EXPECT_EQ(OptimizeRefusal::kNone,
            check_optimizable(code.data(), kFunc, a.end(), kFunc, &FakeMemory::read, &mem,
                              OutsideEntries{}, &r));
  EXPECT_EQ(OptimizeRefusal::kIndirectJump,
            check_optimizable(code.data(), kFunc, a.end(), kFunc, &FakeMemory::read, &mem,
                              OutsideEntries{&related, 1}, &r));

  // A dispatch block reached only from elsewhere (after a ret): its bound is not ours to see.
  Asm d;
  d.raw({0x48, 0x89, 0xf8, 0x48, 0x01, 0xf0, 0xc3});  // mov %rdi,%rax ; add %rsi,%rax ; ret
  d.bind(kLea).rip32({0x48, 0x8d, 0x0d}, kTable);
  d.raw({0x48, 0x63, 0x04, 0xb9, 0x48, 0x01, 0xc8, 0xff, 0xe0});
  emit_cases(d);
  FakeMemory dmem;
  gcc_table(dmem, d);
  const std::vector<uint8_t> dcode = d.finish();
  std::vector<uint8_t> dcold = {0x83, 0xff, 0x03, 0x0f, 0x86, 0, 0, 0, 0};  // cmp $3 ; jbe lea
  const int32_t to_lea = static_cast<int32_t>(d.at(kLea) - (cold_at + dcold.size()));
  std::memcpy(dcold.data() + 5, &to_lea, 4);
  const RelatedCode drelated{dcold.data(), cold_at, cold_at + dcold.size()};
  EXPECT_EQ(OptimizeRefusal::kIndirectJump,
            check_optimizable(dcode.data(), kFunc, d.end(), kFunc, &FakeMemory::read, &dmem,
                              OutsideEntries{&drelated, 1}, &r));
}

TEST(OptimizeCheck, JumpTableWithoutABoundRefuses) {
  Asm a;
  a.raw({0x89, 0xf2});  // mov %esi,%edx (no cmp/ja: the index is whatever came in)
  a.rip32({0x48, 0x8d, 0x0d}, kTable).raw({0x89, 0xff});
  a.raw({0x48, 0x63, 0x04, 0xb9, 0x48, 0x01, 0xc8, 0x3e, 0xff, 0xe0});
  emit_cases(a);
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &mem));
}

TEST(OptimizeCheck, FunctionEntryIsAlwaysAWayIn) {
  // 0: lea table(%rip),%rcx ; movslq (%rcx,%rdi,4),%rax ; add %rcx,%rax ; jmp *%rax
  // cases ; later: cmp $3,%edi ; ja default ; jmp 0
  // The only branch to the entry is bounded, but callers arrive there with any index.
  Asm a;
  a.bind(kLea).rip32({0x48, 0x8d, 0x0d}, kTable);
  a.raw({0x48, 0x63, 0x04, 0xb9, 0x48, 0x01, 0xc8, 0xff, 0xe0});
  emit_cases(a);
  a.raw({0x83, 0xff, 0x03}).rel8({0x77}, kDefault).rel8({0xeb}, kLea);
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, a.at(kCase0) + 3, &mem));
}

TEST(OptimizeCheck, ClangJumpTableWithUnrelatedInstructionsInBetween) {
  // cmp $3,%edi ; ja default ; mov %esi,%eax ; mov %edi,%ecx ; lea table(%rip),%rdx
  // movslq (%rdx,%rcx,4),%rcx ; add %rdx,%rcx ; jmp *%rcx
  Asm a;
  a.raw({0x83, 0xff, 0x03}).rel8({0x77}, kDefault);
  a.raw({0x89, 0xf0}).raw({0x89, 0xf9});
  a.rip32({0x48, 0x8d, 0x15}, kTable);
  a.raw({0x48, 0x63, 0x0c, 0x8a}).raw({0x48, 0x01, 0xd1}).raw({0xff, 0xe1});
  for (int c = 0; c < 4; ++c) {
    a.bind(kCase0 + c).raw({0x83, 0xc0, static_cast<uint8_t>(c), 0xc3});  // add $c,%eax ; ret
  }
  a.bind(kDefault).raw({0xb8, 0xff, 0xff, 0xff, 0xff, 0xc3});
  FakeMemory mem;
  gcc_table(mem, a);
  // The entry region holds the cmp and the ja (rel8 to default: relocated as rel32).
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, &mem));
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(a, a.at(kCase1), &mem));
}

TEST(OptimizeCheck, JumpTableBehindAJbeToTheDispatchBlock) {
  // cmp $3,%edi ; jbe dispatch ; mov $-1,%eax ; ret
  // dispatch: lea table(%rip),%rcx ; movslq (%rcx,%rdi,4),%rax ; add %rcx,%rax ; jmp *%rax
  Asm a;
  a.raw({0x83, 0xff, 0x03}).rel8({0x76}, kLea);
  a.raw({0xb8, 0xff, 0xff, 0xff, 0xff, 0xc3});
  a.bind(kLea).rip32({0x48, 0x8d, 0x0d}, kTable);
  a.raw({0x48, 0x63, 0x04, 0xb9, 0x48, 0x01, 0xc8, 0xff, 0xe0});
  emit_cases(a);
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, &mem));
  // With a fall-through into the dispatch block as well (nop instead of the ret), the
  // block has two ways in and the bound no longer holds on one of them.
  Asm b;
  b.raw({0x83, 0xff, 0x03}).rel8({0x76}, kLea);
  b.raw({0xb8, 0xff, 0xff, 0xff, 0xff, 0x90});
  b.bind(kLea).rip32({0x48, 0x8d, 0x0d}, kTable);
  b.raw({0x48, 0x63, 0x04, 0xb9, 0x48, 0x01, 0xc8, 0xff, 0xe0});
  emit_cases(b);
  FakeMemory bmem;
  gcc_table(bmem, b);
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(b, kFunc, &bmem));
}

TEST(OptimizeCheck, JumpTableSummedWithLeaAndAddIntoTheBase) {
  // cmp $3,%rdx ; ja default ; lea table(%rip),%r11 ; movslq (%r11,%rdx,4),%rcx
  // lea (%r11,%rcx,1),%rcx ; jmp *%rcx
  Asm a;
  a.raw({0x48, 0x83, 0xfa, 0x03}).rel8({0x77}, kDefault);
  a.rip32({0x4c, 0x8d, 0x1d}, kTable);
  a.raw({0x49, 0x63, 0x0c, 0x93}).raw({0x49, 0x8d, 0x0c, 0x0b}).raw({0xff, 0xe1});
  emit_cases(a);
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, &mem));

  // ... ; movslq (%rcx,%rdi,4),%rax ; add %rax,%rcx ; jmp *%rcx
  Asm b;
  b.raw({0x83, 0xff, 0x03}).rel8({0x77}, kDefault);
  b.rip32({0x48, 0x8d, 0x0d}, kTable);
  b.raw({0x48, 0x63, 0x04, 0xb9}).raw({0x48, 0x01, 0xc1}).raw({0xff, 0xe1});
  emit_cases(b);
  FakeMemory bmem;
  gcc_table(bmem, b);
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(b, kFunc, &bmem));
}

TEST(OptimizeCheck, NonPicJumpTableWithAbsoluteEntries) {
  // cmp $3,%edi ; ja default ; mov %edi,%edi ; jmp *table(,%rdi,8)
  Asm a;
  a.raw({0x83, 0xff, 0x03}).rel8({0x77}, kDefault).raw({0x89, 0xff});
  a.raw({0xff, 0x24, 0xfd, 0x00, 0x20, 0x40, 0x00});  // disp32 = kTable
  emit_cases(a);
  FakeMemory mem;
  mem.abs64_table(kTable, {a.at(kCase0), a.at(kCase1), a.at(kCase2), a.at(kCase3)});
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(a, kFunc, &mem));
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_at(a, a.at(kCase0), &mem));

  // The same table loaded into a register first: mov table(,%rdi,8),%rax ; jmp *%rax
  Asm b;
  b.raw({0x83, 0xff, 0x03}).rel8({0x77}, kDefault).raw({0x89, 0xff});
  b.raw({0x48, 0x8b, 0x04, 0xfd, 0x00, 0x20, 0x40, 0x00}).raw({0xff, 0xe0});
  emit_cases(b);
  FakeMemory bmem;
  bmem.abs64_table(kTable, {b.at(kCase0), b.at(kCase1), b.at(kCase2), b.at(kCase3)});
  EXPECT_EQ(OptimizeRefusal::kNone, check_at(b, kFunc, &bmem));
}

TEST(OptimizeCheck, HugeBoundIsNotBelievedToBeATable) {
  Asm a;
  a.raw({0x89, 0xf2}).raw({0x81, 0xff, 0xff, 0xff, 0xff, 0x00}).rel8({0x77}, kDefault);
  a.rip32({0x48, 0x8d, 0x0d}, kTable).raw({0x89, 0xff});
  a.raw({0x48, 0x63, 0x04, 0xb9, 0x48, 0x01, 0xc8, 0x3e, 0xff, 0xe0});
  emit_cases(a);
  FakeMemory mem;
  gcc_table(mem, a);
  EXPECT_EQ(OptimizeRefusal::kIndirectJump, check_at(a, kFunc, &mem));
  EXPECT_EQ(mem.reads(), 0);
}

TEST(OptimizeCheck, EveryRefusalHasItsOwnText) {
  std::set<std::string> seen;
  for (auto r : {OptimizeRefusal::kNone, OptimizeRefusal::kOutsideFunction,
                 OptimizeRefusal::kDecodeFailed, OptimizeRefusal::kNotBoundary,
                 OptimizeRefusal::kCallInRegion, OptimizeRefusal::kSyscallInRegion,
                 OptimizeRefusal::kNotRelocatable, OptimizeRefusal::kJumpIntoRegion,
                 OptimizeRefusal::kIndirectJump}) {
    const char* t = refusal_text(r);
    ASSERT_NE(t, nullptr);
    EXPECT_GT(std::strlen(t), 0u);
    EXPECT_TRUE(seen.insert(t).second) << t;
  }
}

// ---- real code of this process ---------------------------------------------------------------

struct Bounds {
  uintptr_t start = 0, end = 0;
};

// The function's extent from its ELF symbol (arch_test exports its symbols).
Bounds bounds_of(const void* fn) {
  Dl_info info;
  void* extra = nullptr;
  if (!dladdr1(fn, &info, &extra, RTLD_DL_SYMENT)) return {};
  const auto* sym = static_cast<const ElfW(Sym)*>(extra);
  if (!sym ||
      info.dli_saddr != fn || sym->st_size == 0) {
    return {};
  }
  const auto start = reinterpret_cast<uintptr_t>(fn);
  return {start, start + sym->st_size};
}

// Reads our own memory without faulting on a wild address.
bool read_self(void*, uintptr_t addr, void* buf, size_t n) {
  iovec local{buf, n};
  iovec remote{reinterpret_cast<void*>(addr), n};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

OptimizeRefusal check_live(const Bounds& b, uintptr_t addr, OptimizeRegion* region = nullptr) {
  OptimizeRegion r;
  return check_optimizable(reinterpret_cast<const uint8_t*>(b.start), b.start, b.end, addr,
                           &read_self, nullptr, region ? region : &r);
}

std::vector<Insn> decode_function(const Bounds& b) {
  std::vector<Insn> out;
  for (uintptr_t pc = b.start; pc < b.end;) {
    Insn i;
    if (decode(reinterpret_cast<const uint8_t*>(pc), b.end - pc, pc, &i) != 0) return {};
    out.push_back(i);
    pc += i.len;
  }
  return out;
}

TEST(OptimizeCheckLive, LeafFunctionsAreOptimizableAtEntry) {
  long a[] = {1, 2, 3};
  ASSERT_EQ(optimize_check_sum(a, 3), 1 + 4 + 9);
  ASSERT_EQ(optimize_check_mix(7, 9), (7u * 2654435761u) ^ (9u >> 3) ^ 16u);
  for (const void* fn : {reinterpret_cast<const void*>(&optimize_check_sum),
                         reinterpret_cast<const void*>(&optimize_check_mix)}) {
    const Bounds b = bounds_of(fn);
    ASSERT_NE(b.start, 0u) << "no symbol size: is arch_test linked with ENABLE_EXPORTS?";
    OptimizeRegion r;
    EXPECT_EQ(OptimizeRefusal::kNone, check_live(b, b.start, &r));
    EXPECT_GE(r.len, kJmpRel32Len);
    EXPECT_LE(r.end(), b.end);
  }
}

TEST(OptimizeCheckLive, LoopIntoTheFirstFiveBytesRefusesTheEntryOnly) {
  ASSERT_EQ(optimize_check_loop_to_entry_plus_2(5), 5);
  const Bounds b = bounds_of(reinterpret_cast<const void*>(&optimize_check_loop_to_entry_plus_2));
  ASSERT_EQ(b.end - b.start, 13u);
  EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, check_live(b, b.start));
  EXPECT_EQ(OptimizeRefusal::kNone, check_live(b, b.start + 2));
}

// The switch fixture, checked at every instruction boundary against an oracle built here
// from the bytes: the table (found by its lea, sized by the C source) and the direct
// branches. A region that strictly contains an entry or a target must be refused; any
// other region that fits must be accepted.
TEST(OptimizeCheckLive, SwitchJumpTableIsDecodedAtEveryBoundary) {
  ASSERT_EQ(optimize_check_switch(1, 6), 42);
  ASSERT_EQ(optimize_check_switch(99, 6), -1);
  const Bounds b = bounds_of(reinterpret_cast<const void*>(&optimize_check_switch));
  ASSERT_NE(b.start, 0u);
  const std::vector<Insn> insns = decode_function(b);
  ASSERT_FALSE(insns.empty());

  // The oracle: the one indirect jump, the lea before it, the table's entries.
  std::vector<uintptr_t> into;  // addresses no region may strictly contain
  size_t indirect = insns.size(), calls = 0;
  for (size_t i = 0; i < insns.size(); ++i) {
    const Insn& in = insns[i];
    if (in.kind == InsnKind::kJmpIndirect) indirect = i;
    if (in.kind == InsnKind::kCallRel || in.kind == InsnKind::kCallIndirect ||
        in.kind == InsnKind::kSyscall) {
      ++calls;
    }
    if (in.kind == InsnKind::kJmpRel || in.kind == InsnKind::kJccRel) into.push_back(in.target);
  }
  ASSERT_LT(indirect, insns.size()) << "the compiler made no jump table of the switch";
  ASSERT_EQ(calls, 0u);
  uintptr_t table = 0;
  for (size_t i = indirect; i-- > 0 && table == 0;) {
    const Insn& in = insns[i];
    if (in.kind == InsnKind::kRipRelative && in.bytes[in.opcode_offset] == 0x8d) {  // lea
      int32_t disp;
      std::memcpy(&disp, in.bytes + in.disp_offset, 4);
      table = in.next() + disp;
    }
  }
  ASSERT_NE(table, 0u);
  std::set<uintptr_t> entries;
  for (int k = 0; k < OPTIMIZE_CHECK_SWITCH_CASES; ++k) {
    int32_t off;
    std::memcpy(&off, reinterpret_cast<const void*>(table + 4 * k), 4);
    entries.insert(table + off);
  }
  ASSERT_EQ(entries.size(), size_t{OPTIMIZE_CHECK_SWITCH_CASES});  // distinct bodies
  into.insert(into.end(), entries.begin(), entries.end());

  size_t accepted = 0, refused_for_entries = 0;
  for (size_t i = 0; i < insns.size(); ++i) {
    const uintptr_t addr = insns[i].addr;
    uintptr_t end = addr;
    for (size_t k = i; k < insns.size() && end - addr < kJmpRel32Len; ++k) end += insns[k].len;
    OptimizeRegion r;
    const OptimizeRefusal got = check_live(b, addr, &r);
    SCOPED_TRACE(testing::Message() << "at +" << addr - b.start);
    if (end - addr < kJmpRel32Len) {
      EXPECT_EQ(OptimizeRefusal::kOutsideFunction, got);
      continue;
    }
    EXPECT_EQ(r.end(), end);
    bool hit = false, hit_entry = false;
    for (uintptr_t t : into) {
      if (t > addr && t < end) {
        hit = true;
        hit_entry |= entries.count(t) > 0;
      }
    }
    bool after_transfer = false;
    for (size_t k = i; k < insns.size() && insns[k].next() < end; ++k)
      after_transfer |= insns[k].ends_flow();
    if (hit) {
      EXPECT_EQ(OptimizeRefusal::kJumpIntoRegion, got);
      refused_for_entries += hit_entry;
    } else if (after_transfer) {
      EXPECT_EQ(OptimizeRefusal::kCodeAfterTransfer, got);
    } else {
      EXPECT_EQ(OptimizeRefusal::kNone, got);
      ++accepted;
    }
  }
  EXPECT_EQ(OptimizeRefusal::kNone, check_live(b, b.start));
  EXPECT_GT(refused_for_entries, 0u);  // some regions do cover a case label
  EXPECT_GT(accepted, 1u);
}

// libc's functions, bounded by their exported symbols, decode by linear sweep.
TEST(OptimizeCheckLive, LibcFunctionsDecodeByLinearSweep) {
  size_t checked = 0;
  for (const char* name : {"malloc", "free", "realloc", "calloc", "qsort_r", "bsearch",
                           "getenv", "fwrite", "fread", "puts", "fgets", "strdup", "abort",
                           "getaddrinfo", "glob", "fnmatch", "pthread_mutex_lock"}) {
    const void* fn = dlsym(RTLD_DEFAULT, name);
    if (!fn) continue;
    const Bounds b = bounds_of(fn);
    if (b.start == 0) continue;  // an alias whose symbol is not the one found first
    ++checked;
    const OptimizeRefusal got = check_live(b, b.start);
    EXPECT_NE(got, OptimizeRefusal::kDecodeFailed) << name;
    EXPECT_NE(got, OptimizeRefusal::kNotBoundary) << name;
  }
  EXPECT_GT(checked, 5u);
}

}  // namespace
}  // namespace probefs::arch::x86_64
