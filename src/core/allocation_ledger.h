// The allocator's own count (Note [Stream-ordered memory]): every live allocation with its
// size and tag, and the exact current/peak bytes and live counts per tag, changed when alloc
// and free are called. Both backends keep one, so the numbers mean the same on CPU and GPU.
#pragma once

#include <mutex>
#include <unordered_map>
#include <vector>

#include "fsdp/device.h"

namespace fsdp::core {

class AllocationLedger {
 public:
  struct Entry {
    size_t bytes = 0;
    MemTag tag = MemTag::Other;
  };

  // Returns the bytes live after the change.
  int64_t add(void* ptr, size_t bytes, MemTag tag);
  // Raises fsdp::Error for a pointer that is not live (double free, foreign memory).
  Entry remove(void* ptr, const std::string& device_name);
  MemStats stats() const;
  std::vector<void*> live_pointers() const;
  int64_t current_bytes() const;
  void reset_peak();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<void*, Entry> live_;
  MemStats stats_;
};

}  // namespace fsdp::core
