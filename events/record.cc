// Whether a record fits its event's layout: record.h says what the writer produces.
#include "events/record.h"

#include <cstring>

namespace probefs::events {

RecordFault check_record_strings(const CompiledEvent& ev, const uint8_t* rec, uint32_t len) {
  const uint32_t fixed = ev.program.fixed_size;
  if (len < fixed) return RecordFault::kShort;
  if (len > max_record_len(ev)) return RecordFault::kTooLong;
  // Where the next string must start: the writer appends them one after the other.
  uint32_t at = fixed;
  if (ev.program.string_slots != 0) {
    for (const FieldLayout& f : ev.fields) {
      if (!f.type->is_string) continue;
      const bool symstr = std::strcmp(f.type->name, "symstr") == 0;
      const uint32_t n = f.count ? f.count : 1;
      for (uint32_t i = 0; i < n; ++i) {
        // Inside the fixed part, which the layout and len >= fixed_size vouch for.
        uint32_t loc;
        std::memcpy(&loc, rec + f.offset + 4 * i, 4);
        const uint32_t slen = loc >> 16, off = loc & 0xffff;
        if (slen == 0) continue;  // a fault: nothing to follow
        if (off < fixed || off >= len || slen > len - off) return RecordFault::kStringOutside;
        if (slen > static_cast<uint32_t>(kMaxStringSize)) return RecordFault::kStringTooLong;
        if (symstr && slen != 8) return RecordFault::kSymstrSize;
        if (off != at) return RecordFault::kStringOrder;
        at = off + slen;
      }
    }
  }
  return at == len ? RecordFault::kFits : RecordFault::kTrailing;
}

const char* record_fault_name(RecordFault f) {
  switch (f) {
    case RecordFault::kFits: return "fits";
    case RecordFault::kShort: return "short";
    case RecordFault::kTooLong: return "too_long";
    case RecordFault::kStringOutside: return "string_outside";
    case RecordFault::kStringTooLong: return "string_too_long";
    case RecordFault::kSymstrSize: return "symstr_size";
    case RecordFault::kStringOrder: return "string_order";
    case RecordFault::kTrailing: return "trailing";
  }
  return "unknown";
}

}  // namespace probefs::events
