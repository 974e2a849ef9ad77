#include "tools/strfilter.h"

#include <cctype>
#include <cstring>

#include "tools/probe_spec.h"

namespace probefs::tools {

struct StrFilter::Node {
  enum Kind { kGlob, kNot, kAnd, kOr } kind = kGlob;
  std::string glob;
  std::unique_ptr<Node> left, right;  // kNot uses right only
};

StrFilter::~StrFilter() = default;

namespace {

using Node = StrFilter::Node;

bool is_operator(char c) { return c != '\0' && std::strchr("!&|()", c) != nullptr; }

// The next token from `at`: blanks skipped; an operator is one character, anything else
// runs to the next blank or operator. Sets *start and *end; *start == text.size() at the end.
void next_token(std::string_view text, size_t at, size_t* start, size_t* end) {
  while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
  *start = at;
  if (at >= text.size()) {
    *end = at;
    return;
  }
  size_t p = at + 1;
  if (!is_operator(text[at]))
    while (p < text.size() && !is_operator(text[p]) && !std::isspace(static_cast<unsigned char>(text[p])))
      ++p;
  *end = p;
}

// One level of the expression, from `at` to the end or to a ')' (left at *stop). The tree
// grows as the tokens come: an operand fills the open slot (`hole`); '&' takes the operand
// just placed (the right side of the innermost operator, or the whole expression) as its
// left side, '|' takes the whole expression so far, so '&' binds before '|'; '!' opens a
// slot under it. nullptr on an error, with *stop at the token that could not be taken.
std::unique_ptr<Node> parse_level(std::string_view text, size_t at, size_t* stop) {
  std::unique_ptr<Node> root;
  std::unique_ptr<Node>* hole = &root;        // where the next operand goes
  std::unique_ptr<Node>* last_op = &root;     // the slot holding the innermost '&' or '|' chain
  size_t start, end;
  next_token(text, at, &start, &end);
  while (start < text.size() && text[start] != ')') {
    const char c = text[start];
    if (c == '&') {
      if (!*hole || !*last_op) break;
      auto n = std::make_unique<Node>();
      n->kind = Node::kAnd;
      n->left = std::move(*last_op);
      *last_op = std::move(n);
      hole = &(*last_op)->right;
      last_op = hole;
    } else if (c == '|') {
      if (!*hole || !root) break;
      auto n = std::make_unique<Node>();
      n->kind = Node::kOr;
      n->left = std::move(root);
      root = std::move(n);
      hole = &root->right;
      last_op = hole;
    } else if (c == '!') {
      if (*hole) break;
      *hole = std::make_unique<Node>();
      (*hole)->kind = Node::kNot;
      hole = &(*hole)->right;
    } else if (c == '(') {
      if (*hole) break;
      size_t close = 0;
      *hole = parse_level(text, start + 1, &close);
      if (!*hole || close >= text.size() || text[close] != ')') {
        *stop = close;
        return nullptr;
      }
      end = close + 1;
    } else {
      if (*hole) break;
      *hole = std::make_unique<Node>();
      (*hole)->glob = std::string(text.substr(start, end - start));
    }
    next_token(text, end, &start, &end);
  }
  *stop = start;
  if (start < text.size() && text[start] != ')' ) return nullptr;  // a token not taken
  if (!*hole) return nullptr;
  return root;
}

bool match(const Node& n, std::string_view name) {
  switch (n.kind) {
    case Node::kOr: return match(*n.left, name) || match(*n.right, name);
    case Node::kAnd: return match(*n.left, name) && match(*n.right, name);
    case Node::kNot: return !match(*n.right, name);
    default: return glob_match(n.glob, name);
  }
}

}  // namespace

std::unique_ptr<StrFilter> StrFilter::parse(std::string_view text, size_t* error_at) {
  size_t stop = 0;
  std::unique_ptr<Node> root = parse_level(text, 0, &stop);
  if (!root || stop != text.size()) {
    *error_at = stop + 1;
    return nullptr;
  }
  std::unique_ptr<StrFilter> f(new StrFilter);
  f->root_ = std::move(root);
  return f;
}

bool StrFilter::add_or(std::string_view text, size_t* error_at) {
  std::unique_ptr<StrFilter> more = parse(text, error_at);
  if (!more) return false;
  auto n = std::make_unique<Node>();
  n->kind = Node::kOr;
  n->left = std::move(root_);
  n->right = std::move(more->root_);
  root_ = std::move(n);
  return true;
}

bool StrFilter::matches(std::string_view name) const { return match(*root_, name); }

}  // namespace probefs::tools
