// Status: what every entry point returns. A non-ok status carries a message a user can act on
// (SPEC §14: it names the argument, the value received and what is accepted).
#pragma once

#include <string>
#include <utility>

namespace fmha {

enum class StatusCode {
  kOk,
  kInvalidArgument,  // the input breaks the contract of SPEC.md
  kNotSupported,     // valid input that the selected backend cannot run (the message says which and why)
  kBackendError,     // a CUDA runtime error or similar, reported with the runtime's own text
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok_status() { return Status(); }
  static Status invalid_argument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status not_supported(std::string message) {
    return Status(StatusCode::kNotSupported, std::move(message));
  }
  static Status backend_error(std::string message) {
    return Status(StatusCode::kBackendError, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace fmha

// Returns early from the enclosing function when `expr` yields a non-ok Status.
#define FMHA_RETURN_IF_ERROR(expr)           \
  do {                                       \
    ::fmha::Status fmha_status_ = (expr);    \
    if (!fmha_status_.ok()) return fmha_status_; \
  } while (0)
