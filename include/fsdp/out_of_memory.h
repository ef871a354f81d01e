// A device allocation that does not fit, and how a front end spells the options that a message
// advises (Note [Out of memory]).
//
// Note [Out of memory]
// Running out of device memory is the run's sizes, not a fault in the code: the device raises
// an OutOfMemoryError, a plain line with no source location, naming the device, what did not
// fit and the memory in use of the device's. train_rank adds the run's peak so far, the budget
// (the memory plan's, else the device's capacity) and what would fit in it: the memory
// planner's answer (Note [Memory plans] in src/runtime/memory_planner.h), or, when nothing
// the planner chooses fits, the least it found and fewer tokens or more ranks; with no
// capacity known, what to try. The command still writes its JSON summary (Note
// [Unreadable steps]). The advice names options, and a rank process prints its error itself
// (the front end never sees the exception to rephrase it), so the front end says once, before
// any rank starts, how it spells the API's options (set_option_spelling); a forked rank
// inherits it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "fsdp/device.h"
#include "fsdp/error.h"

namespace fsdp {

class OutOfMemoryError : public UserError {
 public:
  // `capacity`: the device's memory, 0 when unknown.
  OutOfMemoryError(const std::string& device, uint64_t requested, MemTag tag, int64_t live,
                   int64_t capacity);
  const std::string& device() const { return device_; }
  uint64_t requested() const { return requested_; }
  MemTag tag() const { return tag_; }
  int64_t live() const { return live_; }
  int64_t capacity() const { return capacity_; }
  // The same error, its message followed by `more` ("; the run's peak so far ...").
  OutOfMemoryError followed_by(const std::string& more) const;

 private:
  OutOfMemoryError(const OutOfMemoryError& e, const std::string& message);
  std::string device_;
  uint64_t requested_;
  MemTag tag_;
  int64_t live_, capacity_;
};

// "288.0 MiB", "517 bytes": sizes in messages.
std::string byte_size_text(uint64_t bytes);

// How the front end spells the API's option `name` ("micro_batches" -> "--micro-batches"),
// for advice in messages that reach the user without passing through the front end. Unset,
// the API's own name.
void set_option_spelling(std::function<std::string(const std::string& name)> spell);
std::string option_spelling(const std::string& name);

}  // namespace fsdp
