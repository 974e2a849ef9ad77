// The fetch interpreter and record writer. Reentrant: any thread of a traced process runs
// it at the same time as others, sharing only the read-only program. It runs on the hit
// path inside that process (DESIGN.md §3): no allocation, no locks, no exceptions and no
// call into libc or any other library. Memory is read only through the Reader
// (memory_reader.h), so a bad pointer gives the kernel's fault values: 0 for numbers, a
// zero-length string ("(fault)") for strings. Byte copies use fixed-size builtins or
// loops the compiler cannot turn into library calls.
#pragma once

#include <cstdint>

#include "arch/regs.h"
#include "events/compile.h"
#include "events/definition.h"

namespace probefs::events {

// What one hit offers the program.
struct HitContext {
  const PtRegs* regs = nullptr;
  uint64_t ip = 0;            // entry probe: the probed address; return probe: the function
  uint64_t ret_ip = 0;        // return probe: where the function returns to
  const char* comm = nullptr; // the thread's name, at most 15 bytes + NUL
  // Return probe: the arguments save_entry_args() stored at entry, at least
  // ProgramView::entry_args of them.
  const uint64_t* entry_args = nullptr;
  int32_t pid = 0;            // thread id
  uint16_t event_id = 0;
};

// The program as the interpreter sees it: pointers into memory the caller keeps alive.
struct ProgramView {
  const FetchInsn* insns = nullptr;
  const uint32_t* fast_regs = nullptr;  // see FetchProgram::fast_regs; null when absent
  const char* strings = nullptr;
  uint32_t header_size = 16;
  uint32_t fixed_size = 16;
  uint32_t nargs = 0;
  uint32_t entry_args = 0;
  uint64_t probe_offset = 0;
  bool is_return = false;
  bool imm_string_faults = false;
};

inline ProgramView view_of(const FetchProgram& p) {
  ProgramView v;
  v.insns = p.insns.data();
  v.fast_regs = p.fast_regs.empty() ? nullptr : p.fast_regs.data();
  v.strings = p.strings.data();
  v.header_size = p.header_size;
  v.fixed_size = p.fixed_size;
  v.nargs = p.nargs;
  v.entry_args = p.entry_args;
  v.probe_offset = p.probe_offset;
  v.is_return = p.is_return;
  v.imm_string_faults = p.imm_string_faults;
  return v;
}

namespace detail {

// Stores the low `size` bytes of v, little-endian.
inline void store_le(uint8_t* d, uint64_t v, unsigned size) {
  switch (size) {
    case 1: { uint8_t x = static_cast<uint8_t>(v); __builtin_memcpy(d, &x, 1); break; }
    case 2: { uint16_t x = static_cast<uint16_t>(v); __builtin_memcpy(d, &x, 2); break; }
    case 4: { uint32_t x = static_cast<uint32_t>(v); __builtin_memcpy(d, &x, 4); break; }
    default: __builtin_memcpy(d, &v, 8); break;
  }
}

inline uint64_t load_le(const uint8_t* s, unsigned size) {
  switch (size) {
    case 1: return *s;
    case 2: { uint16_t x; __builtin_memcpy(&x, s, 2); return x; }
    case 4: { uint32_t x; __builtin_memcpy(&x, s, 4); return x; }
    default: { uint64_t x; __builtin_memcpy(&x, s, 8); return x; }
  }
}

// The empty asm keeps the compiler from recognising these loops as memset/memcpy.
inline void zero_bytes(uint8_t* d, uint32_t n) {
  for (uint32_t i = 0; i < n; ++i) {
    asm("" : "+r"(i));
    d[i] = 0;
  }
}

inline uint32_t copy_cstr(uint8_t* d, const char* s, uint32_t cap) {
  uint32_t i = 0;
  for (; i + 1 < cap && s[i]; ++i) {
    asm("" : "+r"(i));
    d[i] = static_cast<uint8_t>(s[i]);
  }
  d[i] = 0;
  return i + 1;
}

inline uint64_t apply_bitfield(uint64_t v, const FetchInsn& bf) {
  unsigned bits = bf.size * 8u;
  uint64_t x = v << (64 - bits + bf.lshift);
  return x >> (64 - bits + bf.rshift);
}

inline uint64_t reg_at(const PtRegs& r, uint32_t byte_off) {
  uint64_t v;
  __builtin_memcpy(&v, reinterpret_cast<const uint8_t*>(&r) + byte_off, 8);
  return v;
}

template <class Reader>
inline uint64_t stack_nth(const PtRegs& r, Reader& rd, uint64_t n) {
  uint64_t v;
  return rd.read(r.sp + n * 8, &v, 8) ? v : 0;
}

template <class Reader>
inline uint64_t argument(const PtRegs& r, Reader& rd, uint32_t n /* 0-based */) {
  if (n < 6) return regs_get_argument(r, n + 1);
  return stack_nth(r, rd, n - 5);  // above the return address
}

enum class Source : uint8_t { kMemory, kComm, kData };

// One argument: runs its stages and returns the instruction after its kEnd.
template <class Reader>
__attribute__((always_inline)) inline const FetchInsn* run_arg(
    const FetchInsn* pc, const ProgramView& p, const HitContext& hc, Reader& rd, uint8_t* rec,
    uint32_t cap, uint32_t* dyn) {
  const PtRegs& regs = *hc.regs;
  // The common case, a register stored as it is, skips the staged machinery.
  if (pc->op == FetchOp::kReg && pc[1].op == FetchOp::kStRaw && pc[2].op == FetchOp::kEnd) {
    store_le(rec + pc[1].param, reg_at(regs, pc->param), pc[1].size);
    return pc + 3;
  }
  uint64_t val = 0;
  Source src = Source::kMemory;
  bool fault = false;
  // Stage 1: load.
  switch (pc->op) {
    case FetchOp::kReg: val = reg_at(regs, pc->param); break;
    case FetchOp::kStackP: val = regs.sp; break;
    case FetchOp::kStack: val = stack_nth(regs, rd, pc->param); break;
    case FetchOp::kRetval: val = regs.ax; break;
    case FetchOp::kArg: val = argument(regs, rd, pc->param); break;
    case FetchOp::kEntryData:
      val = hc.entry_args ? hc.entry_args[pc->param / 8] : 0;
      break;
    case FetchOp::kImm: val = pc->imm; break;
    case FetchOp::kComm: src = Source::kComm; break;
    case FetchOp::kData:
      src = Source::kData;
      val = pc->param;
      break;
    case FetchOp::kFileOffset: val = hc.ip - p.probe_offset + pc->imm; break;
    default: break;
  }
  ++pc;
  // Stage 2: dereference. lval/last_off let a string array walk its pointer table.
  uint64_t lval = 0;
  int64_t last_off = 0;
  bool derefed = false;
  while (pc->op == FetchOp::kDeref || pc->op == FetchOp::kUDeref) {
    if (!fault) {
      lval = val;
      last_off = pc->offset;
      derefed = true;
      uint64_t v;
      if (rd.read(val + static_cast<uint64_t>(pc->offset), &v, 8))
        val = v;
      else
        fault = true;
    }
    ++pc;
  }
  // Stage 3 (store), 4 (bitfield), 5 (array).
  const FetchInsn& st = *pc++;
  const FetchInsn* bf = nullptr;
  if (pc->op == FetchOp::kModBitfield) bf = pc++;
  uint32_t count = 1;
  if (pc->op == FetchOp::kLoopArray) count = (pc++)->param;
  ++pc;  // kEnd
  uint8_t* dest = rec + st.param;
  switch (st.op) {
    case FetchOp::kStRaw: {
      uint64_t v = bf ? apply_bitfield(val, *bf) : val;
      store_le(dest, v, st.size);
      break;
    }
    case FetchOp::kStMem:
    case FetchOp::kStUMem: {
      for (uint32_t i = 0; i < count; ++i) {
        uint8_t* d = dest + i * st.size;
        uint64_t v = 0;
        uint64_t addr = val + static_cast<uint64_t>(st.offset) + i * st.size;
        if (fault || !rd.read(addr, &v, st.size)) v = 0;
        if (bf) v = apply_bitfield(v, *bf);
        store_le(d, v, st.size);
      }
      break;
    }
    case FetchOp::kStString:
    case FetchOp::kStUString:
    case FetchOp::kStSymstr: {
      for (uint32_t i = 0; i < count; ++i) {
        uint8_t* loc = dest + i * 4;
        uint32_t at = *dyn;
        uint32_t room = cap > at ? cap - at : 0;
        if (room > static_cast<uint32_t>(kMaxStringSize)) room = kMaxStringSize;
        if (at > 0xffff) room = 0;
        long n = -1;
        uint64_t addr = val;
        bool bad = fault;
        if (i > 0) {
          uint64_t v;
          bad = bad || !derefed ||
                !rd.read(lval + static_cast<uint64_t>(last_off) + i * 8ull, &v, 8);
          addr = bad ? 0 : v;
        }
        if (!bad && room) {
          if (st.op == FetchOp::kStSymstr) {
            // The address is stored; the daemon turns it into "sym+off/size" when it
            // formats the line (symbol tables are not available in the target).
            if (room >= 8) {
              store_le(rec + at, addr, 8);
              n = 8;
            }
          } else if (src == Source::kComm) {
            n = copy_cstr(rec + at, hc.comm ? hc.comm : "", room < 16 ? room : 16);
          } else if (src == Source::kData) {
            if (!p.imm_string_faults) n = copy_cstr(rec + at, p.strings + val, room);
          } else {
            n = rd.read_string(addr + static_cast<uint64_t>(st.offset),
                               reinterpret_cast<char*>(rec + at), room);
          }
        }
        if (n > 0) {
          store_le(loc, (static_cast<uint64_t>(n) << 16) | at, 4);
          *dyn = at + static_cast<uint32_t>(n);
        } else {
          store_le(loc, at & 0xffff, 4);
        }
      }
      break;
    }
    default:
      break;
  }
  return pc;
}

}  // namespace detail

// Writes one record into rec[0, cap) and returns its size, or 0 when cap cannot hold the
// fixed part. Strings that do not fit the remaining room are recorded as faults.
template <class Reader>
inline uint32_t write_record(const ProgramView& p, const HitContext& hc, Reader& rd,
                             uint8_t* rec, uint32_t cap) {
  if (cap < p.fixed_size) return 0;
  detail::store_le(rec, hc.event_id, 2);
  rec[2] = 0;  // common_flags: a user thread never runs with interrupts off
  rec[3] = 0;  // common_preempt_count
  detail::store_le(rec + 4, static_cast<uint32_t>(hc.pid), 4);
  if (p.is_return) {
    detail::store_le(rec + 8, hc.ip, 8);
    detail::store_le(rec + 16, hc.ret_ip, 8);
  } else {
    detail::store_le(rec + 8, hc.ip, 8);
  }
  if (p.fast_regs) {
    const uint8_t* r = reinterpret_cast<const uint8_t*>(hc.regs);
    for (uint32_t a = 0; a < p.nargs; ++a) {
      uint32_t f = p.fast_regs[a];
      uint64_t v;
      __builtin_memcpy(&v, r + (f & 0xff), 8);
      detail::store_le(rec + (f >> 16), v, (f >> 8) & 0xff);
    }
    return p.fixed_size;
  }
  uint32_t dyn = p.fixed_size;
  const FetchInsn* pc = p.insns;
  for (uint32_t a = 0; a < p.nargs; ++a) pc = detail::run_arg(pc, p, hc, rd, rec, cap, &dyn);
  return dyn;
}

// At the entry of a function with a return probe that reads $argN: saves the first
// `p.entry_args` arguments for the return.
template <class Reader>
inline void save_entry_args(const ProgramView& p, const PtRegs& regs, Reader& rd,
                            uint64_t* out) {
  for (uint32_t i = 0; i < p.entry_args; ++i) out[i] = detail::argument(regs, rd, i);
}

}  // namespace probefs::events
