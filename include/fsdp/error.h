// Errors of the fsdp library.
//
// Note [Errors]
// Inside the library every failure is an fsdp::Error exception. Its message names the rank,
// the device, the source file and line, so a failure in a multi-rank run says where it came
// from. Only `main` (tools/) turns an Error into a message and a non-zero exit; nothing deep
// inside calls exit() or abort(). The one macro family below builds every such message:
//   FSDP_CHECK(cond, ...)          an invariant or a user input that must hold
//   FSDP_FAIL(...)                 unconditional failure
//   FSDP_CUDA_CHECK / FSDP_NCCL_CHECK / FSDP_CUBLAS_CHECK   (src/backend/cuda only)
// all funnel into fsdp::detail::raise(). Bad user input is a UserError instead, raised by
//   FSDP_USER_CHECK(cond, ...)     the message alone, as a plain sentence
//   FSDP_USER_FAIL(...)
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fsdp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad input from the user (a flag, a file, a size the machine cannot hold): the message is a
// plain sentence, with no source location, since nothing in the code is wrong.
class UserError : public Error {
 public:
  explicit UserError(const std::string& what) : Error(what) {}
};

// Note [Options checked once]
// A bad option is refused where the API takes it, in the API's own terms: the message starts
// with the option's name as the API spells it ("hsdp_replicas 3 must divide the world size
// 4"), and option() names it. A front end that spells options otherwise (the command line's
// "--hsdp") maps the name and puts its own in front, in one place (tools/train_checks.cpp);
// the rule itself is never written again.
class OptionError : public UserError {
 public:
  // `rest` follows the name: OptionError("steps", " must be >= 1, got 0").
  OptionError(std::string option, const std::string& rest)
      : UserError(option + rest), option_(std::move(option)), rest_(rest) {}
  const std::string& option() const { return option_; }
  const std::string& rest() const { return rest_; }  // the message after the name

 private:
  std::string option_, rest_;
};

// The rank and device that the current thread works for; set by the launcher so that
// errors raised anywhere name them. -1 means "not a rank thread".
struct ThreadIdentity {
  int rank = -1;
  std::string device = "host";
};
ThreadIdentity& this_thread_identity();

namespace detail {
[[noreturn]] void raise(const char* file, int line, const std::string& message);

template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace fsdp

#define FSDP_FAIL(...) ::fsdp::detail::raise(__FILE__, __LINE__, ::fsdp::detail::concat(__VA_ARGS__))

#define FSDP_CHECK(cond, ...)                                                     \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::fsdp::detail::raise(__FILE__, __LINE__,                                   \
                            ::fsdp::detail::concat("check failed: " #cond ": ", \
                                                   __VA_ARGS__));                 \
  } while (0)

#define FSDP_USER_FAIL(...) throw ::fsdp::UserError(::fsdp::detail::concat(__VA_ARGS__))

#define FSDP_USER_CHECK(cond, ...)                                     \
  do {                                                                 \
    if (!(cond)) [[unlikely]]                                          \
      throw ::fsdp::UserError(::fsdp::detail::concat(__VA_ARGS__));    \
  } while (0)
