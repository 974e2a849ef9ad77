// C++ function names in probe specs, beyond perf (which reads "shop::Pricer::price" as a
// function "shop" with a bad line number): a name qualified with "::", with template
// arguments, an operator, a lambda as the demangler names it, a parameter list choosing
// one overload ("shop::Pricer::price(shop::Order const&, int) const", spelled as
// `probefs-probe -v -F` shows it, spaces free), or a mangled name ("_ZNK4shop...").
#pragma once

#include <string>
#include <string_view>

namespace probefs::tools {

// Whether FUNCTION is to be matched as a C++ name: it has "::", a parameter list, an
// operator, or is mangled. A plain identifier keeps perf's matching (the DIE's own name,
// so "price" is every method named price).
bool is_cxx_name(std::string_view function);

// Where a C++ name that starts TEXT at AT ends: identifiers joined by "::", with <...>,
// (...), {...} and [...] nested (spaces allowed inside them), operator names taken as
// they are ("operator<", "operator()", "operator new[]"), and after a parameter list its
// qualifiers (" const", " volatile", " &", " &&"). It stops at a blank outside brackets,
// or at a single ':', '+', '@', '%' or ';'.
size_t cxx_name_end(std::string_view text, size_t at = 0);

// Whether a function matches PATTERN (is_cxx_name): a mangled pattern against LINKAGE;
// one with a parameter list against the demangled signature; else against the qualified
// name without parameters. '*' and '?' are globs; blanks do not count. LINKAGE is the
// function's mangled name ("" for a C function: NAME is then its whole name).
bool cxx_name_matches(std::string_view pattern, std::string_view linkage, std::string_view name);

// The qualified name of a function ("shop::Pricer::price"): LINKAGE demangled without
// parameters, or NAME when there is no mangled name.
std::string cxx_qualified_name(std::string_view linkage, std::string_view name);

// Whether two functions are overloads of one name: the same qualified name, another
// signature (a constructor's or destructor's variants, C1/C2, D0/D1/D2, are one function).
bool is_overload(std::string_view linkage_a, std::string_view name_a, std::string_view linkage_b,
                 std::string_view name_b);

// An event name for a C++ function: its qualified name with every run of characters that
// cannot be in a tracefs name made one '_' ("shop_Pricer_price", "shop_twice_int"); with
// OVERLOAD, "__" and its parameters the same way ("shop_Pricer_price__shop_Order_const_int").
// At most 63 characters: a longer one keeps its head and ends in a hash of LINKAGE.
std::string cxx_event_name(std::string_view linkage, std::string_view name, bool overload);

}  // namespace probefs::tools
