// The flat byte form of a fetch program and of a filter, for the daemon -> agent link.
//
// The agent runs what it receives on the hit path, so decoding validates everything the
// interpreter relies on: every argument is a well-formed stage sequence, every store
// lands inside the record's fixed part, register offsets stay inside PtRegs, immediate
// strings are terminated, filter operands stay inside the pattern pool and the postfix
// program never under- or overflows its stack. A program that decodes can only write
// inside [0, cap) of a record buffer whose cap >= fixed_size.
//
// Layout (little-endian, 8-byte aligned sections):
//   program: u32 magic 'PFP1', u32 nargs, u32 header_size, u32 fixed_size,
//            u32 string_slots, u32 entry_args, u64 probe_offset, u8 is_return,
//            u8 imm_string_faults, u16 0, u32 n_insns, u32 strings_len, u32 n_fast,
//            then n_insns FetchInsn, strings_len bytes, n_fast u32
//   filter:  u32 magic 'PFF1', u32 n_insns, u32 patterns_len, u32 max_depth,
//            u32 text_len, then n_insns FilterInsn, patterns, text
#pragma once

#include <cstdint>
#include <vector>

#include "events/compile.h"
#include "events/filter.h"

namespace probefs::events {

std::vector<uint8_t> encode_program(const FetchProgram& p);
[[nodiscard]] bool decode_program(const uint8_t* data, size_t n, FetchProgram* out);

std::vector<uint8_t> encode_filter(const CompiledFilter& f);
[[nodiscard]] bool decode_filter(const uint8_t* data, size_t n, CompiledFilter* out);

// The checks decode_program()/decode_filter() apply, for programs built in process.
[[nodiscard]] bool validate_program(const FetchProgram& p);
[[nodiscard]] bool validate_filter(const CompiledFilter& f);

}  // namespace probefs::events
