// The tracefs's probe definitions, written as perf probe writes them.
#include "tools/trace_probe.h"

#include <cstdio>

namespace probefs::tools {

std::string TraceArg::text() const {
  std::string out = name.empty() ? fetch : name + "=" + fetch;
  if (!type.empty()) out += ":" + type;
  return out;
}

std::string TraceProbe::definition(bool kprobe_syntax) const {
  std::string out = retprobe ? "r:" : "p:";
  out += group + "/" + event + " ";
  if (kprobe_syntax) {
    size_t slash = path.rfind('/');
    out += (slash == std::string::npos ? path : path.substr(slash + 1)) + ":" + symbol;
    if (symbol_offset != 0) out += "+" + std::to_string(symbol_offset);
  } else {
    char offset[24];
    std::snprintf(offset, sizeof offset, ":0x%llx", static_cast<unsigned long long>(file_offset));
    out += path + offset;
    if (ref_ctr_offset != 0) {
      std::snprintf(offset, sizeof offset, "(0x%llx)", static_cast<unsigned long long>(ref_ctr_offset));
      out += offset;
    }
  }
  for (const TraceArg& arg : args) out += " " + arg.text();
  return out;
}

}  // namespace probefs::tools
