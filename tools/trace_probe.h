// A probe as the tracefs takes it: what the helper writes into uprobe_events (or, with
// -k, kprobe_events), one per place a spec resolved to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace probefs::tools {

struct TraceArg {
  std::string name;   // "" for a raw argument written without a name ($retval, %di, ...)
  std::string fetch;  // "-28(%bp)", "+0(+56(%di))", "%si", "@+0x4010", "$retval"
  std::string type;   // "s32", "x64", "string", "b3@0/32"; "" for the kernel's default
  std::string text() const;  // name=fetch:type
};

struct TraceProbe {
  std::string group;      // "probe_prog"
  std::string event;      // "price_order", "price_order_L3", "price_order__return"
  bool retprobe = false;
  std::string path;       // the object, absolute
  uint64_t file_offset = 0;  // uprobe syntax: PATH:0xOFFSET
  uint64_t ref_ctr_offset = 0;  // PATH:0xOFFSET(0xREF_CTR): an SDT point's semaphore
  // kprobe syntax (-k): MOD:SYM+OFF, MOD the object's basename.
  std::string symbol;
  uint64_t symbol_offset = 0;
  std::vector<TraceArg> args;

  // For perf's messages: "(on price_order:3 in /path/prog with id qty)".
  std::string where;           // "price_order:3", "price_order%return", "prog.c:40"
  std::vector<std::string> arg_texts;  // the arguments as the user wrote them

  // "p:probe_prog/price_order /path/prog:0x1139 id=-20(%bp):s32", the offset in lowercase
  // hex without padding as perf writes it ('r' for a retprobe); with KPROBE_SYNTAX
  // "p:probe_prog/price_order prog:price_order+16 ...", the offset in decimal as the kernel
  // reads it, and "MOD:SYM" when it is 0.
  std::string definition(bool kprobe_syntax) const;
};

}  // namespace probefs::tools
