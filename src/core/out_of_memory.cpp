// Note [Out of memory] (include/fsdp/out_of_memory.h).
#include "fsdp/out_of_memory.h"

#include <cstdio>
#include <mutex>

namespace fsdp {

namespace {

std::string message(const std::string& device, uint64_t requested, MemTag tag, int64_t live,
                    int64_t capacity) {
  return detail::concat("out of memory on ", device, ": ", byte_size_text(requested), " for ",
                        mem_tag_name(tag), " did not fit beside the ",
                        byte_size_text(static_cast<uint64_t>(live)), " in use",
                        capacity > 0 ? " of the device's " + byte_size_text(static_cast<uint64_t>(capacity))
                                     : std::string());
}

std::mutex spelling_mutex;
std::function<std::string(const std::string&)>& spelling() {
  static std::function<std::string(const std::string&)> spell;
  return spell;
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(const std::string& device, uint64_t requested, MemTag tag,
                                   int64_t live, int64_t capacity)
    : UserError(message(device, requested, tag, live, capacity)),
      device_(device),
      requested_(requested),
      tag_(tag),
      live_(live),
      capacity_(capacity) {}

OutOfMemoryError::OutOfMemoryError(const OutOfMemoryError& e, const std::string& message)
    : UserError(message),
      device_(e.device_),
      requested_(e.requested_),
      tag_(e.tag_),
      live_(e.live_),
      capacity_(e.capacity_) {}

OutOfMemoryError OutOfMemoryError::followed_by(const std::string& more) const {
  return OutOfMemoryError(*this, what() + more);
}

std::string byte_size_text(uint64_t bytes) {
  char buf[48];
  if (bytes < 1024)
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  else if (bytes < (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(bytes) / 1024);
  else if (bytes < (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

void set_option_spelling(std::function<std::string(const std::string&)> spell) {
  std::lock_guard<std::mutex> lock(spelling_mutex);
  spelling() = std::move(spell);
}

std::string option_spelling(const std::string& name) {
  std::lock_guard<std::mutex> lock(spelling_mutex);
  return spelling() ? spelling()(name) : name;
}

}  // namespace fsdp
