// C++ (Itanium ABI) names as perf probe shows them: the GNU demangler of libiberty, the
// one binutils and perf use, so that `probefs-probe -F` prints perf's very text.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace probefs::tools {

// The demangled form of a mangled NAME: without the parameter list (perf's symbol names,
// "shop::Pricer::price") or with it and its qualifiers ("shop::Pricer::price(shop::Order
// const&, int) const"). nullopt for a name that is not a mangled C++ name.
std::optional<std::string> demangle(std::string_view name, bool with_params = false);

}  // namespace probefs::tools
