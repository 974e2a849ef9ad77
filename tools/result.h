// The helper's two error tiers: a Result carries either a value or an Error, which is what
// perf probe would print for the same failure (its message and its negative errno, as in
// "Error: Failed to add events. Reason: No such file or directory (Code: -2)").
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace probefs::tools {

struct Error {
  int code = 0;          // a negative errno (-ENOENT, -EINVAL, ...)
  std::string message;   // one line, perf's wording where perf has one
};

inline Error make_error(int code, std::string message) { return Error{code, std::move(message)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Error error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& operator*() { return std::get<0>(v_); }
  const T& operator*() const { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// For operations with nothing to return.
struct Ok {};
using Status = Result<Ok>;

}  // namespace probefs::tools
