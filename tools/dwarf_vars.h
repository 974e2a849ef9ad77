// Variables at one probe address, translated into the tracefs's fetch arguments, the way
// perf probe translates them: a parameter in a register at the address is "%si", one on the
// stack "-28(%bp)" (DW_OP_fbreg through the frame base, DW_OP_call_frame_cfa through the
// CFI at that address), a member "+8(%di)", a member through a pointer "+0(+56(%di))", a
// global "@+0xFILEOFF" (uprobe syntax) or "@SYM+OFF" (kprobe syntax), with the kernel type
// the DWARF type gives (s32, u8, x64 for pointers, bitfields b<width>@<bit>/<container>).
// Location lists are evaluated at the address: a variable the DWARF has no location for
// there is "optimized out".
#pragma once

#include <elfutils/libdw.h>

#include <string>
#include <vector>

#include "tools/elf_image.h"
#include "tools/probe_spec.h"
#include "tools/result.h"
#include "tools/trace_probe.h"

namespace probefs::tools {

struct VarContext {
  Dwarf_Addr pc = 0;               // the probe's link-time address
  std::vector<Dwarf_Die> scopes;   // innermost first, as dwarf_getscopes gives them, ending
                                   // with the CU; for an inlined instance the scopes of the
                                   // instance (DW_TAG_inlined_subroutine) come first
  Dwarf_CFI* cfi = nullptr;        // for DW_OP_call_frame_cfa (may be nullptr)
  const ElfImage* image = nullptr; // globals: address -> file offset
  bool retprobe = false;           // %return: only $retval (and raw arguments) are allowed
  bool kprobe_syntax = false;      // -k: globals as @SYM+OFF
};

// One argument: $params and $vars become one TraceArg per variable (those without a
// location here are left out, as perf does); everything else one. Errors as perf words them:
//   "Failed to find the location of the 'NAME' variable at this address."  (-ENOENT)
//   "Failed to find 'NAME' in this function."                            (-ENOENT)
//   "Structure on a register is not supported yet."                      (-ENOTSUP)
//   "FIELD(TYPE) is not a pointer nor array."                            (-EINVAL)
//   "Failed to get the offset of FIELD."                                 (-ENOENT)
Result<std::vector<TraceArg>> translate_arg(const VarContext& ctx, const ProbeArg& arg);

// What -V prints for the place: "TYPE\tNAME" for every variable in scope with a location
// at the address (parameters and locals; globals of the CU with EXTERNS), sorted by the
// text as perf sorts it.
std::vector<std::string> available_variables(const VarContext& ctx, bool externs);

// The name of a DWARF type as perf prints it ("int", "struct rec*", "char*", "long int").
std::string type_name(Dwarf_Die* type);

}  // namespace probefs::tools
