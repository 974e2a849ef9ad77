// Synthetic events: the kernel's `synthetic_events` language (and `s:` in dynamic_events).
// A synthetic event has no probe of its own; it is a record layout, a format file and a
// name under events/synthetic/, made to be written by hist trigger actions.
//
//   synthetic_events:  NAME FIELD[;FIELD]...     defines
//                      !NAME                     removes
//   dynamic_events:    s:[synthetic/]NAME FIELD[;FIELD]...
//   FIELD:             TYPE NAME | unsigned TYPE NAME | char NAME[N] | char NAME[]
//
// TYPE is one of the kernel's synthetic field types (s8..u64, char, int, long, bool,
// pid_t, gfp_t, their unsigned forms), `char[N]` (a string kept in place, N <= 256) or
// `char[]` (a __data_loc string). Each field takes a u64 slot of the record after the
// common header; a string kept in place takes 256 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "events/compile.h"
#include "events/errors.h"

namespace probefs::events {

inline constexpr std::string_view kSynthSystem = "synthetic";
inline constexpr std::string_view kLogSynth = "synthetic_events";
inline constexpr uint32_t kSynthFieldsMax = 64;
inline constexpr uint32_t kSynthStringMax = 256;  // the kernel's STR_VAR_LEN_MAX

struct SynthField {
  std::string type;  // as the format file declares it ("u64", "char[16]", "__data_loc char[]")
  std::string name;
  uint32_t size = 0;    // the format file's size
  uint32_t offset = 0;  // in the record
  bool is_signed = false;
  bool is_string = false;
  bool is_dynamic = false;  // a __data_loc string
  bool is_stack = false;    // long[]: a __data_loc array of addresses
};

struct SynthEvent {
  std::string name;
  std::vector<SynthField> fields;
};

enum class SynthStatus : uint8_t { kEmpty, kDefine, kRemove, kError };

struct SynthResult {
  SynthStatus status = SynthStatus::kEmpty;
  SynthEvent event;        // kDefine
  std::string remove;      // kRemove: the name after '!'
  Diagnostic error;        // kError: err set; logged() when the kernel logs it
  std::string command;     // the line without its leading blanks, as error_log shows it
};

// One line of a write to `synthetic_events` (comment already cut at '#').
SynthResult parse_synthetic_command(std::string_view line);

// One line of `dynamic_events` that starts with "s:" (after blanks).
SynthResult parse_synthetic_dynamic(std::string_view line);

// Whether a line of dynamic_events is a synthetic event's ("s:" after blanks).
bool is_synthetic_dynamic(std::string_view line);

// "NAME\tTYPE NAME; TYPE NAME": a line of synthetic_events without its newline
// (dynamic_events prefixes "s:synthetic/").
std::string synthetic_description(const SynthEvent& ev);

// The event as the rest of the house sees one: its fields (by name, offset, size, sign),
// print fmt, and a format file without probe fields.
CompiledEvent synthetic_compiled(const SynthEvent& ev);

}  // namespace probefs::events
