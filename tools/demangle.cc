#include "tools/demangle.h"

#include <libiberty/demangle.h>

#include <cstdlib>
#include <memory>

namespace probefs::tools {

std::optional<std::string> demangle(std::string_view name, bool with_params) {
  if (!name.starts_with("_Z")) return std::nullopt;  // C, and the other languages' schemes
  const std::string z(name);
  std::unique_ptr<char, decltype(&std::free)> out(
      cplus_demangle(z.c_str(), with_params ? DMGL_PARAMS | DMGL_ANSI : DMGL_NO_OPTS),
      &std::free);
  if (!out) return std::nullopt;
  return std::string(out.get());
}

}  // namespace probefs::tools
