// x86-64 instruction decoding and classification for probing: pure functions over byte
// buffers, no live patching, no library (the toolkit has its own decoder, decoder.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch::x86_64 {

constexpr size_t kMaxInsnLen = 15;
constexpr uint8_t kInt3 = 0xcc;
constexpr size_t kJmpRel32Len = 5;  // jmp rel32: what a jump-optimized probe writes

enum class InsnKind : uint8_t {
  kPlain,         // position independent: runs anywhere as it is
  kRipRelative,   // has a rip-relative memory operand (disp32 must follow the copy)
  kJmpRel,        // jmp rel8 / rel32
  kJccRel,        // jcc rel8 / rel32
  kCallRel,       // call rel32
  kLoopRel,       // loop, loope, loopne, jrcxz, jecxz (rel8 only)
  kRet,           // ret, ret imm16
  kJmpIndirect,   // jmp r/m64
  kCallIndirect,  // call r/m64
  kSyscall,       // syscall
  kTrap,          // int3, int n, int1, into, ud0/ud1/ud2: never probed
  kPrivileged,    // hlt, in/out, cli/sti, ...: never probed
  kUnsupported,   // decodes, but its meaning depends on its address in a way we do not
                  // relocate (xbegin, far transfers, ...): never probed
};

enum class LoopOp : uint8_t { kLoopne, kLoope, kLoop, kJrcxz, kJecxz };

struct Insn {
  uintptr_t addr = 0;            // where the instruction lives
  uint8_t len = 0;
  uint8_t bytes[kMaxInsnLen] = {};
  InsnKind kind = InsnKind::kPlain;
  uint8_t cond = 0;              // kJccRel: the condition code (low nibble of the opcode)
  LoopOp loop = LoopOp::kLoop;   // kLoopRel
  uint8_t disp_offset = 0;       // kRipRelative: where disp32 sits in bytes (0: none)
  uint8_t opcode_offset = 0;     // first byte after legacy and REX prefixes
  uint16_t ret_imm = 0;          // kRet: bytes popped after the return address
  uintptr_t target = 0;          // relative branches: absolute destination
  bool is_nop = false;           // nop/endbr: executing it changes nothing but ip
  bool uses_rsp = false;         // indirect branches: the operand reads rsp
  bool uses_rip = false;         // indirect branches: the operand is rip-relative

  uintptr_t next() const { return addr + len; }
  bool is_branch() const;        // any control transfer
  bool ends_flow() const;        // execution never falls through (jmp, ret)
};

// Decodes the instruction in code[0..avail) as if it were at `pc`. 0, or -EILSEQ when the
// bytes are not a valid instruction (or run past `avail`).
int decode(const uint8_t* code, size_t avail, uintptr_t pc, Insn* out);

// Proves that `addr` starts an instruction by decoding `code` (the bytes of a function that
// starts at `start`) from its first byte. 0, or -EILSEQ when addr falls inside an
// instruction or decoding stops before it. `code` must hold end - start bytes.
int check_boundary(const uint8_t* code, uintptr_t start, uintptr_t end, uintptr_t addr);

// Human-readable text for diagnostics: "mnemonic operands" (Intel syntax) for the
// control transfers and the instructions the optimizer's checks read, the mnemonic-less
// bytes ("(plain) 0f 58 c1") for the rest. Returns the length, or -EILSEQ.
int disassemble(const uint8_t* code, size_t avail, uintptr_t pc, char* buf, size_t bufsize);

}  // namespace probefs::arch::x86_64
