// Variables at one probe address, translated into the tracefs's fetch arguments, the way
// perf probe translates them: a parameter in a register at the address is "%si", one on the
// stack "-28(%bp)" (DW_OP_fbreg through the frame base, DW_OP_call_frame_cfa through the
// CFI at that address), a member "+8(%di)", a member through a pointer "+0(+56(%di))", a
// global "@+0xOFF" (uprobe syntax) or "@SYM+OFF" (kprobe syntax), a constant "\2", with the
// kernel type the DWARF type gives (s32 for signed types, x8..x64 for the others, none for
// arrays, bitfields b<width>@<bit>/<container>). Location lists are evaluated at the
// address: a variable the DWARF has no location for there is "optimized out".
//
// Where perf 6.1 writes what the kernel would take wrongly, this writes what it means:
//   - a location that is a DWARF expression (several operations: a computed value, pieces,
//     an entry value) is refused where perf translates its first operation alone;
//   - globals in uprobe syntax are "@+OFF" (perf writes "@SYM+0", which uprobe_events
//     refuses), kprobe syntax names the ELF symbol ("fstatic.0" for a function's static);
//   - bitfields get their bit offset from the low bit (perf takes DWARF 4's DW_AT_bit_offset,
//     counted from the high bit, as it is) and DWARF 5's DW_AT_data_bit_offset works (perf:
//     "Failed to get the offset of FIELD.");
//   - an index into a multi-dimensional array steps by a row, and sizes come from the whole
//     type (perf steps by the element and reads only DW_AT_byte_size);
//   - at a return probe, $params and $vars are refused like variables; $retval is refused
//     at an entry probe (perf passes all three to the kernel, which refuses them);
//   - an argument name made from a type is sanitized ("k:b3@0/32" -> "k_b3_0_32").
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
  // Innermost first, ending with the CU (dwarf_getscopes order). The first
  // DW_TAG_subprogram or DW_TAG_inlined_subroutine among them is the place's scope, perf's:
  // variables are looked up in it (depth first, into the blocks and inlined calls that hold
  // pc), then among the CU's globals. For an inlined instance that is the instance; a place
  // whose scope is an outer function (FUNC:RLN inside an inlined call) starts the list there.
  std::vector<Dwarf_Die> scopes;
  Dwarf_CFI* cfi = nullptr;        // for DW_OP_call_frame_cfa (may be nullptr)
  // Globals: their ELF symbols, and the file offset of pc. uprobe_events reads "@+OFF" at
  // the probed mapping's start + OFF, so OFF is the global's address - pc + pc's file
  // offset (its address itself in common PIE objects, where text's address is its offset).
  const ElfImage* image = nullptr;
  bool retprobe = false;           // %return: only $retval (and raw arguments) are allowed
  bool kprobe_syntax = false;      // -k: globals as @SYM+OFF
};

// One argument: $params and $vars become one TraceArg per variable (those without a
// location here are left out, as perf does; none at all is an empty list); everything else
// one. Raw arguments (%REG, +OFF(...), @SYM, $argN, $stackN, $comm, literals) pass through
// with the name and type given. Errors as perf words them:
//   "Failed to find the location of the 'NAME' variable at this address."  (-ENOENT: not
//       found, or no location here; see is_missing_variable)
//   "Sorry, we don't support this variable location yet."                 (-ENOTSUP)
//   "Structure on a register is not supported yet."                      (-ENOTSUP)
//   "NAME(type:TYPE) has no member FIELD."                                (-EINVAL)
//   "NAME is not a data structure nor a union."                           (-EINVAL)
//   "Semantic error: NAME is not a pointer nor array."                    (-EINVAL)
//   "Semantic error: FIELD must be referred by '->'" (and '.')            (-EINVAL)
//   "Failed to cast into string: NAME(TYPE) is not a pointer nor array."  (-EINVAL)
//   "Failed to cast into string: NAME is not (unsigned) char *."          (-EINVAL)
//   "Failed to get the offset of FIELD."                                 (-ENOENT)
//   "Failed to get the type of NAME."                                    (-ENOENT)
//   "Semantic error :You can't specify local variable for kretprobe."    (-EINVAL)
//   "$retval is not available on probe"                                  (-EINVAL)
Result<std::vector<TraceArg>> translate_arg(const VarContext& ctx, const ProbeArg& arg);

// perf probe's fetch for an argument that one place of a probe has no location for while
// another place has: the argument keeps its name (arg_name) and the other place's type.
inline constexpr char kMissingArgFetch[] = "\\deade12d";

// Whether ERROR is translate_arg's "not here" (the variable is not found, or has no
// location at this address), which perf forgives at a place when another place of the same
// probe has the variable (kMissingArgFetch), and reports only when no place has it.
bool is_missing_variable(const Error& error);

// The name perf gives ARG's TraceArg: NAME= when given, else the last member of a chain
// ("o->bill->postcode" -> "postcode", "r->arr[2]" -> "arr"), else the variable and its type
// ("k:x32" -> "k_x32"). "" for a raw argument without NAME= (the kernel names it).
std::string arg_name(const ProbeArg& arg);

// What -V prints for the place: "TYPE\tNAME" for every variable in scope with a location
// at the address (parameters and locals; globals of the CU with EXTERNS), sorted by the
// text as perf sorts it, each once. With RANGE (--range), perf's
// "[VAL]\tTYPE\tNAME\t@<FUNC+[S-E,...]>" (where it is valid, from the function's entry),
// "[INV]" for a local that has a location only later in the function, and
// "[EXT]\tTYPE\tNAME" for a global.
std::vector<std::string> available_variables(const VarContext& ctx, bool externs,
                                             bool range = false);

// The name of a DWARF type as perf prints it ("int", "struct rec*", "char*" for a const
// char *, "long int", "int*" for an int[4], "(function_type)*"); "(unknown_type)" for what
// perf cannot name (void *, an anonymous struct, nullptr).
std::string type_name(Dwarf_Die* type);

}  // namespace probefs::tools
