// The CPU backend's allocator: exact per-tag accounting at call time, and in checked mode
// poisoned, quarantined frees so that use-after-free shows up as NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "core/allocation_ledger.h"
#include "fsdp/device.h"

namespace fsdp::cpu {

// Freed memory stays poisoned and out of circulation until this much is quarantined, so a
// late reader finds NaN rather than someone else's fresh data.
constexpr size_t kQuarantineBytes = size_t{256} << 20;
constexpr size_t kAllocAlignment = 64;
// 0xFF bytes are a NaN in fp32 (0xFFFFFFFF) and in bf16 (0xFFFF).
constexpr unsigned char kPoisonByte = 0xFF;

class CheckedAllocator {
 public:
  explicit CheckedAllocator(bool checked) : checked_(checked) {}
  ~CheckedAllocator();  // returns live and quarantined memory to the system
  CheckedAllocator(const CheckedAllocator&) = delete;
  CheckedAllocator& operator=(const CheckedAllocator&) = delete;

  // Allocates and counts at once. In checked mode the memory starts poisoned too, so a read
  // of memory nobody wrote is as visible as a read after free.
  void* allocate(size_t bytes, MemTag tag);
  // The call-time half of a free: uncounts the allocation and returns its size. Throws
  // fsdp::Error for a pointer that is not live (unknown, or freed already).
  size_t forget(void* ptr);
  // The stream-ordered half: runs once the free's stream reached the free.
  void release(void* ptr, size_t bytes);

  MemStats stats() const;
  void reset_peak();
  int64_t current_bytes() const;

 private:
  struct Quarantined {
    void* ptr;
    size_t bytes;
  };

  const bool checked_;
  mutable std::mutex mutex_;
  core::AllocationLedger ledger_;
  std::deque<Quarantined> quarantine_;
  size_t quarantine_bytes_ = 0;
};

}  // namespace fsdp::cpu
