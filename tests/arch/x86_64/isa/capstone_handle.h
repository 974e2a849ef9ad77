// The Capstone handle of the test oracle (capstone_oracle.cc): one
// per thread, since decoding runs on control paths of any thread and a csh is not safe to
// share. Test code only: the ISA toolkit itself has its own decoder.
#pragma once

#include <capstone/capstone.h>

#include <cstddef>
#include <cstdint>

namespace probefs::arch::x86_64 {

class Disassembler {
 public:
  Disassembler() {
    if (cs_open(CS_ARCH_X86, CS_MODE_64, &handle_) != CS_ERR_OK) return;
    cs_option(handle_, CS_OPT_DETAIL, CS_OPT_ON);
    insn_ = cs_malloc(handle_);
  }
  ~Disassembler() {
    if (insn_) cs_free(insn_, 1);
    if (handle_) cs_close(&handle_);
  }
  Disassembler(const Disassembler&) = delete;
  Disassembler& operator=(const Disassembler&) = delete;

  // The instruction at code[0..len) decoded as if at pc, or nullptr. Valid until the next
  // call on this thread.
  const cs_insn* one(const uint8_t* code, size_t len, uintptr_t pc) {
    if (!insn_) return nullptr;
    const uint8_t* p = code;
    size_t n = len;
    uint64_t a = pc;
    return cs_disasm_iter(handle_, &p, &n, &a, insn_) ? insn_ : nullptr;
  }
  csh handle() const { return handle_; }

 private:
  csh handle_ = 0;
  cs_insn* insn_ = nullptr;
};

// This thread's handle.
inline Disassembler& disassembler() {
  thread_local Disassembler d;
  return d;
}

}  // namespace probefs::arch::x86_64
