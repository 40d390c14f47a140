// Status and Expected<T>: errors as values at every boundary user input can reach.
// Messages name the file, node or op, expected vs actual, and what to do.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,    // The user's input (file, graph, tensor, flag) is wrong.
  kNotFound,           // A file, model or name the user named does not exist.
  kUnimplemented,      // A valid request kiln does not support (yet).
  kIo,                 // Reading or writing a file failed.
  kResourceExhausted,  // A limit is exceeded: the user's (--max-memory) or the machine's memory.
  kInternal,           // A bug in kiln.
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool isOk() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return isOk(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // True when the error is the user's to fix (exit code 2 in the CLI).
  bool isUserError() const {
    return code_ == ErrorCode::kInvalidArgument || code_ == ErrorCode::kNotFound ||
           code_ == ErrorCode::kUnimplemented || code_ == ErrorCode::kIo ||
           code_ == ErrorCode::kResourceExhausted;
  }

  // Prefixes context ("while reading model.json: ...") and keeps the code.
  Status withContext(const std::string& context) const {
    if (isOk()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string msg) {
  return {ErrorCode::kInvalidArgument, std::move(msg)};
}
inline Status notFound(std::string msg) {
  return {ErrorCode::kNotFound, std::move(msg)};
}
inline Status unimplemented(std::string msg) {
  return {ErrorCode::kUnimplemented, std::move(msg)};
}
inline Status ioError(std::string msg) {
  return {ErrorCode::kIo, std::move(msg)};
}
inline Status resourceExhausted(std::string msg) {
  return {ErrorCode::kResourceExhausted, std::move(msg)};
}
inline Status internalError(std::string msg) {
  return {ErrorCode::kInternal, std::move(msg)};
}

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design.
  Expected(Status status) : v_(std::move(status)) {
    assert(!std::get<Status>(v_).isOk() && "Expected constructed from an OK status");
  }

  bool hasValue() const { return v_.index() == 0; }
  explicit operator bool() const { return hasValue(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return hasValue() ? Status::ok() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when it is an error.
#define KILN_TRY(expr)                             \
  do {                                             \
    ::kiln::Status kiln_status_ = (expr);          \
    if (!kiln_status_.isOk()) return kiln_status_; \
  } while (0)

// `KILN_ASSIGN_OR_RETURN(auto x, f());` binds the value or returns the error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(kiln_expected_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.hasValue()) return tmp.status();        \
  lhs = std::move(tmp).value()
