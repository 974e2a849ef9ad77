// Whether a record fits its event's layout (daemon side; a pure function, any thread).
//
// Records come from shared memory that the traced process can write (DESIGN.md §8): the
// daemon takes nothing in one on trust. check_record() compares a record with what the
// event's own program (compile.h, fetch.h) can have written, from facts the daemon owns:
// the layout it compiled. A trace reader drops and counts a record that does not fit,
// before any trigger, filter or formatter sees it; the stream goes on with the next.
//
// What the record writer (fetch.h, write_record) produces, and so what a record must be:
//   - the fixed part whole: len >= fixed_size;
//   - at most fixed_size + string_slots * kMaxStringSize bytes (every string at its most);
//   - its strings (string, ustring, symstr, $comm; each element of a string array) in the
//     order of the fields, each where the one before it ended, the first at fixed_size,
//     and the record ending with the last one: every byte after the fixed part belongs to
//     exactly one string, so no two __data_locs name the same bytes;
//   - each string 1..kMaxStringSize bytes (its NUL included), a symstr exactly 8 (the
//     address the daemon names);
//   - a string the fetch could not read is a zero-length __data_loc (the kernel's
//     "(fault)"). Its offset is never followed, so it is not checked (the writer stores
//     the low 16 bits of its position there, which wrap in a record past 64 KiB).
// Nothing here checks what the payload claims about itself (common_type, common_pid):
// identity comes from the daemon (which ring, which target), not from the record.
//
// format_trace_line (output.h) and filter_match (filter.h) stay memory-safe and bounded
// on records never checked; this check is what makes a hostile record count as dropped
// rather than print as an odd line.
#pragma once

#include <cstdint>

#include "events/compile.h"

namespace probefs::events {

// Why a record does not fit; kFits when it does. Values are stable (they may be counted).
enum class RecordFault : uint8_t {
  kFits = 0,
  kShort,           // len < fixed_size: the fixed part is cut
  kTooLong,         // len above fixed_size + string_slots * kMaxStringSize
  kStringOutside,   // a __data_loc names bytes outside [fixed_size, len)
  kStringTooLong,   // a string longer than kMaxStringSize
  kSymstrSize,      // a symstr string that is not 8 bytes
  kStringOrder,     // a string not where the previous one ended: overlap, gap or disorder
  kTrailing,        // bytes after the last string (or after the fixed part, without any)
};

// The longest record `ev`'s program can write: every string at kMaxStringSize.
inline uint64_t max_record_len(const CompiledEvent& ev) {
  return uint64_t{ev.program.fixed_size} +
         uint64_t{ev.program.string_slots} * static_cast<uint64_t>(kMaxStringSize);
}

// check_record() of an event with strings: one pass over their __data_locs.
RecordFault check_record_strings(const CompiledEvent& ev, const uint8_t* rec, uint32_t len);

// Whether rec[0, len) is a record `ev`'s program can have written (see above). Reads
// nothing outside rec[0, len). An event without strings costs two comparisons, inline: a
// raw reader checks tens of millions of records a second.
inline RecordFault check_record(const CompiledEvent& ev, const uint8_t* rec, uint32_t len) {
  if (ev.program.string_slots != 0) return check_record_strings(ev, rec, len);
  const uint32_t fixed = ev.program.fixed_size;
  if (len < fixed) return RecordFault::kShort;
  return len == fixed ? RecordFault::kFits : RecordFault::kTooLong;  // the longest is fixed
}

// "short", "too_long", ...: a name for logs and tests.
const char* record_fault_name(RecordFault f);

}  // namespace probefs::events
