// perf's filter language for -F and -V (--filter, and -F's own argument): globs combined
// with '!' (not), '&' (and, binding first), '|' (or) and parentheses, e.g.
// "!_* & !*@plt". Errors are reported as perf reports them: the 1-based position of the
// token that could not be taken (the end of the text when it stopped early).
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace probefs::tools {

class StrFilter {
 public:
  // The filter of TEXT, or nullptr with *error_at set (1-based).
  static std::unique_ptr<StrFilter> parse(std::string_view text, size_t* error_at);
  ~StrFilter();

  // Whether NAME passes (globs as glob_match of tools/probe_spec.h).
  bool matches(std::string_view name) const;
  // Adds TEXT as an alternative: this | (TEXT). false (and *error_at) when TEXT is not a
  // filter; the filter is then unchanged.
  bool add_or(std::string_view text, size_t* error_at);

  struct Node;

 private:
  StrFilter() = default;
  std::unique_ptr<Node> root_;
};

// perf's defaults: what -F lists, and -V's filter when none is given.
inline constexpr std::string_view kDefaultFuncsFilter = "!_* & !*@plt";
inline constexpr std::string_view kDefaultVarsFilter = "!__k???tab_* & !__crc_*";

}  // namespace probefs::tools
