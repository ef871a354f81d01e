#include "core/allocation_ledger.h"

#include <algorithm>

#include "fsdp/error.h"

namespace fsdp::core {

int64_t AllocationLedger::add(void* ptr, size_t bytes, MemTag tag) {
  const int t = static_cast<int>(tag);
  FSDP_CHECK(t >= 0 && t < kMemTagCount, "bad memory tag ", t);
  const auto n = static_cast<int64_t>(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  live_.emplace(ptr, Entry{bytes, tag});
  stats_.current_bytes += n;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  stats_.tag_bytes[t] += n;
  stats_.tag_peak_bytes[t] = std::max(stats_.tag_peak_bytes[t], stats_.tag_bytes[t]);
  stats_.tag_live[t] += 1;
  stats_.tag_peak_live[t] = std::max(stats_.tag_peak_live[t], stats_.tag_live[t]);
  return stats_.current_bytes;
}

AllocationLedger::Entry AllocationLedger::remove(void* ptr, const std::string& device_name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  FSDP_CHECK(it != live_.end(), "free of ", ptr, ", which is not a live allocation of ",
             device_name, " (double free, or foreign memory)");
  const Entry e = it->second;
  live_.erase(it);
  const int t = static_cast<int>(e.tag);
  stats_.current_bytes -= static_cast<int64_t>(e.bytes);
  stats_.tag_bytes[t] -= static_cast<int64_t>(e.bytes);
  stats_.tag_live[t] -= 1;
  return e;
}

MemStats AllocationLedger::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

std::vector<void*> AllocationLedger::live_pointers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<void*> out;
  for (const auto& [ptr, entry] : live_) out.push_back(ptr);
  return out;
}

int64_t AllocationLedger::current_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.current_bytes;
}

void AllocationLedger::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
  for (int t = 0; t < kMemTagCount; ++t) {
    stats_.tag_peak_bytes[t] = stats_.tag_bytes[t];
    stats_.tag_peak_live[t] = stats_.tag_live[t];
  }
}

}  // namespace fsdp::core
