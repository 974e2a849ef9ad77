#include "tools/cxx_names.h"

#include <cctype>
#include <cstdio>

#include "tools/demangle.h"
#include "tools/probe_spec.h"

namespace probefs::tools {

namespace {

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Whether "operator" starts at AT as a word.
bool operator_at(std::string_view text, size_t at) {
  return text.substr(at).starts_with("operator") && (at == 0 || !ident_char(text[at - 1])) &&
         (at + 8 >= text.size() || !ident_char(text[at + 8]));
}

// Past an operator's own name after "operator" (at AT): "()", "[]", a run of symbol
// characters, or a word ("new", "delete", a conversion's type) with "[]" after it.
size_t past_operator(std::string_view text, size_t at) {
  while (at < text.size() && text[at] == ' ') ++at;
  if (text.substr(at).starts_with("()") || text.substr(at).starts_with("[]")) return at + 2;
  const std::string_view symbols = "+-*/%^&|~!=<>,";
  size_t end = at;
  while (end < text.size() && symbols.find(text[end]) != std::string_view::npos) ++end;
  if (end > at) return end;
  while (end < text.size() && ident_char(text[end])) ++end;
  if (text.substr(end).starts_with("[]")) end += 2;
  return end;
}

// TEXT without blanks, for comparing spellings.
std::string squeezed(std::string_view text) {
  std::string out;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) out += c;
  return out;
}

// A glob of '*' and '?' only ('[' is literal: operator[], arrays).
bool cxx_glob(std::string_view pattern, std::string_view text) {
  std::string escaped;
  for (char c : pattern) {
    if (c == '[' || c == ']' || c == '\\') escaped += '\\';
    escaped += c;
  }
  return glob_match(escaped, text);
}

// An operator's symbols as a word ("operator<" -> "operator_lt").
std::string_view operator_word(std::string_view symbols) {
  static constexpr std::pair<std::string_view, std::string_view> kWords[] = {
      {"()", "call"}, {"[]", "index"}, {"<=>", "cmp"}, {"<<=", "shl_assign"},
      {">>=", "shr_assign"}, {"->*", "arrow_star"}, {"->", "arrow"}, {"<<", "shl"},
      {">>", "shr"}, {"<=", "le"}, {">=", "ge"}, {"==", "eq"}, {"!=", "ne"}, {"&&", "and"},
      {"||", "or"}, {"++", "inc"}, {"--", "dec"}, {"+=", "plus_assign"},
      {"-=", "minus_assign"}, {"*=", "mul_assign"}, {"/=", "div_assign"},
      {"%=", "mod_assign"}, {"&=", "and_assign"}, {"|=", "or_assign"}, {"^=", "xor_assign"},
      {"<", "lt"}, {">", "gt"}, {"=", "assign"}, {"+", "plus"}, {"-", "minus"}, {"*", "mul"},
      {"/", "div"}, {"%", "mod"}, {"&", "amp"}, {"|", "bar"}, {"^", "xor"}, {"~", "compl"},
      {"!", "not"}, {",", "comma"}};
  for (const auto& [sym, word] : kWords)
    if (symbols == sym) return word;
  return {};
}

// "a::b<c> d" -> "a_b_c_d": runs of other characters become one '_', none at the ends; a
// destructor's '~' is "dtor_", an operator's symbols a word ("operator_lt").
std::string tracefs_name(std::string_view text) {
  std::string out;
  auto separate = [&] {
    if (!out.empty() && out.back() != '_') out += '_';
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (operator_at(text, i)) {
      const size_t end = past_operator(text, i + 8);
      size_t sym = i + 8;
      while (sym < end && text[sym] == ' ') ++sym;
      const std::string_view word = operator_word(text.substr(sym, end - sym));
      separate();
      out += "operator";
      if (!word.empty()) {
        out += "_";
        out += word;
        i = end - 1;
      } else {
        i += 7;  // "operator new", a conversion: the words follow as they are
      }
      continue;
    }
    if (c == '~') {
      separate();
      out += "dtor_";
    } else if (ident_char(c)) {
      out += c;
    } else {
      separate();
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  if (!out.empty() && std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  return out;
}

// Whether NAME ends in a parameter list: a '(' outside brackets that is not an operator's
// own ("operator()" names the call operator; "operator()(int)" has parameters).
bool has_parameter_list(std::string_view name) {
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    if (operator_at(name, i)) {
      i = past_operator(name, i + 8) - 1;
      continue;
    }
    const char c = name[i];
    if (c == '(' && depth == 0) return true;
    if (c == '(' || c == '<' || c == '{' || c == '[') ++depth;
    if ((c == ')' || c == '>' || c == '}' || c == ']') && depth > 0) --depth;
  }
  return false;
}

}  // namespace

bool is_cxx_name(std::string_view function) {
  if (function.find("::") != std::string_view::npos || has_parameter_list(function) ||
      function.starts_with("_Z"))
    return true;
  for (size_t at = function.find("operator"); at != std::string_view::npos;
       at = function.find("operator", at + 1))
    if (operator_at(function, at)) return true;
  return false;
}

size_t cxx_name_end(std::string_view text, size_t at) {
  int depth = 0;
  size_t i = at;
  while (i < text.size()) {
    const char c = text[i];
    if (operator_at(text, i)) {
      i = past_operator(text, i + 8);
      continue;
    }
    if (depth == 0) {
      if (c == ':' && i + 1 < text.size() && text[i + 1] == ':') {
        i += 2;
        continue;
      }
      if (std::isspace(static_cast<unsigned char>(c)) || c == ':' || c == '+' || c == '@' ||
          c == '%' || c == ';')
        break;
    }
    if (c == '(' || c == '<' || c == '{' || c == '[') {
      ++depth;
    } else if (c == ')' || c == '>' || c == '}' || c == ']') {
      if (depth == 0) break;
      --depth;
      if (depth == 0 && c == ')') {
        // A parameter list's qualifiers: " const", " volatile", " &", " &&".
        size_t q = i + 1;
        for (;;) {
          size_t w = q;
          while (w < text.size() && text[w] == ' ') ++w;
          std::string_view rest = text.substr(w);
          size_t len = rest.starts_with("const") ? 5 : rest.starts_with("volatile") ? 8
                       : rest.starts_with("&&")  ? 2
                       : rest.starts_with("&")   ? 1 : 0;
          if (len == 0 || (len > 2 && w + len < text.size() && ident_char(text[w + len]))) break;
          q = w + len;
        }
        i = q;
        continue;
      }
    }
    ++i;
  }
  return i;
}

bool cxx_name_matches(std::string_view pattern, std::string_view linkage, std::string_view name) {
  if (pattern.starts_with("_Z")) return !linkage.empty() && cxx_glob(pattern, linkage);
  if (has_parameter_list(pattern)) {
    std::optional<std::string> full = linkage.empty() ? std::nullopt : demangle(linkage, true);
    return full && cxx_glob(squeezed(pattern), squeezed(*full));
  }
  return cxx_glob(squeezed(pattern), squeezed(cxx_qualified_name(linkage, name)));
}

std::string cxx_qualified_name(std::string_view linkage, std::string_view name) {
  if (!linkage.empty())
    if (std::optional<std::string> d = demangle(linkage)) return *d;
  return std::string(name);
}

bool is_overload(std::string_view linkage_a, std::string_view name_a, std::string_view linkage_b,
                 std::string_view name_b) {
  if (linkage_a.empty() || linkage_b.empty() || linkage_a == linkage_b) return false;
  if (cxx_qualified_name(linkage_a, name_a) != cxx_qualified_name(linkage_b, name_b)) return false;
  return demangle(linkage_a, true) != demangle(linkage_b, true);
}

std::string cxx_event_name(std::string_view linkage, std::string_view name, bool overload) {
  std::string out = tracefs_name(cxx_qualified_name(linkage, name));
  if (overload && !linkage.empty()) {
    if (std::optional<std::string> full = demangle(linkage, true)) {
      // The parameters: what the full name adds after the qualified one's last '('.
      const std::string plain = cxx_qualified_name(linkage, name);
      const size_t at = full->find(plain);
      const std::string params =
          tracefs_name(at == std::string::npos ? *full : full->substr(at + plain.size()));
      out += "__" + (params.empty() ? std::string("void") : params);
    }
  }
  constexpr size_t kMax = 63;  // the kernel's longest event name
  if (out.size() > kMax) {
    unsigned long h = 5381;
    for (char c : linkage.empty() ? name : linkage) h = h * 33 + static_cast<unsigned char>(c);
    char tail[16];
    std::snprintf(tail, sizeof tail, "_%08lx", h & 0xffffffffUL);
    out = out.substr(0, kMax - 9) + tail;
  }
  return out;
}

}  // namespace probefs::tools
