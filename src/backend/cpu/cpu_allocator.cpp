#include "backend/cpu/cpu_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {
size_t rounded_size(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment; zero-byte requests still get a unique
  // pointer so that free(alloc(0)) works like any other pair.
  return std::max(kAllocAlignment,
                  (bytes + kAllocAlignment - 1) / kAllocAlignment * kAllocAlignment);
}
}  // namespace

CheckedAllocator::~CheckedAllocator() {
  for (auto& [ptr, live] : live_) std::free(ptr);
  for (auto& q : quarantine_) std::free(q.ptr);
}

void* CheckedAllocator::allocate(size_t bytes, MemTag tag) {
  const int t = static_cast<int>(tag);
  FSDP_CHECK(t >= 0 && t < kMemTagCount, "bad memory tag ", t);
  void* ptr = std::aligned_alloc(kAllocAlignment, rounded_size(bytes));
  FSDP_CHECK(ptr != nullptr, "out of host memory allocating ", bytes, " bytes (tag ",
             mem_tag_name(tag), ")");
  if (checked_) std::memset(ptr, kPoisonByte, bytes);
  const auto signed_bytes = static_cast<int64_t>(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  live_.emplace(ptr, Live{bytes, tag});
  stats_.current_bytes += signed_bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  stats_.tag_bytes[t] += signed_bytes;
  stats_.tag_peak_bytes[t] = std::max(stats_.tag_peak_bytes[t], stats_.tag_bytes[t]);
  stats_.tag_live[t] += 1;
  stats_.tag_peak_live[t] = std::max(stats_.tag_peak_live[t], stats_.tag_live[t]);
  return ptr;
}

size_t CheckedAllocator::forget(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  FSDP_CHECK(it != live_.end(), "free of ", ptr,
             ", which is not a live allocation of this device (double free, or foreign memory)");
  const Live live = it->second;
  live_.erase(it);
  const int t = static_cast<int>(live.tag);
  stats_.current_bytes -= static_cast<int64_t>(live.bytes);
  stats_.tag_bytes[t] -= static_cast<int64_t>(live.bytes);
  stats_.tag_live[t] -= 1;
  return live.bytes;
}

void CheckedAllocator::release(void* ptr, size_t bytes) {
  if (!checked_) {
    std::free(ptr);
    return;
  }
  std::memset(ptr, kPoisonByte, bytes);
  std::deque<Quarantined> expired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quarantine_.push_back({ptr, bytes});
    quarantine_bytes_ += bytes;
    while (quarantine_bytes_ > kQuarantineBytes && !quarantine_.empty()) {
      quarantine_bytes_ -= quarantine_.front().bytes;
      expired.push_back(quarantine_.front());
      quarantine_.pop_front();
    }
  }
  for (auto& q : expired) std::free(q.ptr);
}

MemStats CheckedAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CheckedAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
  for (int t = 0; t < kMemTagCount; ++t) {
    stats_.tag_peak_bytes[t] = stats_.tag_bytes[t];
    stats_.tag_peak_live[t] = stats_.tag_live[t];
  }
}

int64_t CheckedAllocator::current_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_.current_bytes;
}

}  // namespace fsdp::cpu
