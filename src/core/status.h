// Status and Result<T>: errors a user or the environment can cause (bad checkpoint, bad request,
// out of memory). Library code returns these instead of throwing or exiting.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace bs {

enum class StatusCode {
  kOk,
  kInvalidArgument,
  kNotFound,
  kDataLoss,
  kUnimplemented,
  kOutOfMemory,
  kFailedPrecondition,
  kInternal
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Prefixes context ("loading model.safetensors: ...") to the message.
  Status with_context(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status DataLoss(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kDataLoss, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status Unimplemented(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kUnimplemented, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status OutOfMemory(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kOutOfMemory, fmt::format(f, std::forward<Args>(args)...)};
}
template <typename... Args>
Status FailedPrecondition(fmt::format_string<Args...> f, Args&&... args) {
  return {StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...)};
}

// Either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace bs

#define BS_CONCAT_INNER(a, b) a##b
#define BS_CONCAT(a, b) BS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when expr is not ok.
#define BS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::bs::Status bs_status_ = (expr);        \
    if (!bs_status_.ok()) return bs_status_; \
  } while (0)

// `BS_ASSIGN_OR_RETURN(auto x, MakeX());` binds the value or returns the error.
#define BS_ASSIGN_OR_RETURN(lhs, expr)                                                        \
  auto BS_CONCAT(bs_result_, __LINE__) = (expr);                                              \
  if (!BS_CONCAT(bs_result_, __LINE__).ok()) return BS_CONCAT(bs_result_, __LINE__).status(); \
  lhs = std::move(BS_CONCAT(bs_result_, __LINE__)).value()
