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
//   FSDP_OPTION_CHECK(cond, ...)   a bad option: an OptionError (Note [Options checked once])
#pragma once

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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
// A bad option is refused where the API takes it, in the API's own terms: the message names
// options as the API spells them ("hsdp_replicas 3 must divide the world size 4", "dim (64)
// must be a multiple of heads (3)"), never as a command-line flag, and option() names the
// first. The message keeps which of its words are option names (OptionName), so a front end
// that spells options otherwise (the command line's "--hsdp") respells them, in one place
// (tools/train_checks.cpp, spelled()); the rule itself is never written again.
struct OptionName {
  std::string name;
};

class OptionError : public UserError {
 public:
  // `rest` follows the name: OptionError("steps", " must be >= 1, got 0").
  OptionError(std::string option, const std::string& rest)
      : OptionError(std::vector<Piece>{{std::move(option), true}, {rest, false}}) {}
  // Text and option names in any order: of(OptionName{"dim"}, " (", 64, ") must be a
  // multiple of ", OptionName{"heads"}, " (", 3, ")").
  template <typename... Parts>
  static OptionError of(const Parts&... parts) {
    std::vector<Piece> pieces;
    (add(pieces, parts), ...);
    return OptionError(std::move(pieces));
  }
  const std::string& option() const { return option_; }  // the first option named; "" if none
  // The message with each option name as spell(name) gives it.
  std::string spelled(const std::function<std::string(const std::string&)>& spell) const {
    std::string out;
    for (const Piece& p : pieces_) out += p.option ? spell(p.text) : p.text;
    return out;
  }

 private:
  struct Piece {
    std::string text;
    bool option = false;  // text is an option's name
  };
  explicit OptionError(std::vector<Piece> pieces)
      : UserError(joined(pieces)), pieces_(std::move(pieces)) {
    for (const Piece& p : pieces_)
      if (p.option) {
        option_ = p.text;
        break;
      }
  }
  static std::string joined(const std::vector<Piece>& pieces) {
    std::string out;
    for (const Piece& p : pieces) out += p.text;
    return out;
  }
  static void add(std::vector<Piece>& pieces, const OptionName& name) {
    pieces.push_back({name.name, true});
  }
  template <typename Text>
  static void add(std::vector<Piece>& pieces, const Text& text) {
    std::ostringstream out;
    out << text;
    if (pieces.empty() || pieces.back().option) pieces.push_back({});
    pieces.back().text += out.str();
  }

  std::vector<Piece> pieces_;
  std::string option_;
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

// A bad option: the message's parts, with the options it names as OptionName (Note [Options
// checked once]).
#define FSDP_OPTION_CHECK(cond, ...)                                   \
  do {                                                                 \
    if (!(cond)) [[unlikely]]                                          \
      throw ::fsdp::OptionError::of(__VA_ARGS__);                      \
  } while (0)
