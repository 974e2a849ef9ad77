// Instantiates the hit-path code the way the agent will, so that check_hit_path.sh can
// verify from the machine code that it calls no library function (DESIGN.md §3).
#include "events/fetch.h"
#include "events/memory_reader.h"

using probefs::PtRegs;
using probefs::events::HitContext;
using probefs::events::LiveMemoryReader;
using probefs::events::ProgramView;

extern "C" uint32_t probefs_events_probe_write_record(const ProgramView* p,
                                                      const HitContext* hc,
                                                      const LiveMemoryReader* rd, uint8_t* rec,
                                                      uint32_t cap) {
  return probefs::events::write_record(*p, *hc, *rd, rec, cap);
}

extern "C" uint32_t probefs_events_probe_write_record_ft(const ProgramView* p,
                                                         const HitContext* hc, uint8_t* rec,
                                                         uint32_t cap) {
  probefs::events::FaultTolerantReader rd;
  return probefs::events::write_record(*p, *hc, rd, rec, cap);
}

extern "C" void probefs_events_probe_save_entry_args(const ProgramView* p, const PtRegs* regs,
                                                     const LiveMemoryReader* rd, uint64_t* out) {
  probefs::events::save_entry_args(*p, *regs, *rd, out);
}
