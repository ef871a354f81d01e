// The CPU backend's allocator: exact per-tag accounting at call time, and in checked mode
// poisoned, quarantined frees so that a read after free shows up as NaN and a write after
// free as an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/allocation_ledger.h"
#include "fsdp/device.h"

namespace fsdp::cpu {

constexpr size_t kAllocAlignment = 64;
// 0xFF bytes are a NaN in fp32 (0xFFFFFFFF) and in bf16 (0xFFFF).
constexpr unsigned char kPoisonByte = 0xFF;

class CheckedAllocator {
 public:
  // Freed memory stays poisoned and out of circulation until more than `quarantine_bytes` is
  // quarantined, so a late reader finds NaN rather than someone else's fresh data.
  // `capacity`: the device's memory (0: no limit); an allocation past it raises
  // OutOfMemoryError, as a full GPU would (Note [Out of memory]).
  CheckedAllocator(bool checked, size_t quarantine_bytes, size_t capacity, std::string device)
      : checked_(checked), quarantine_limit_(quarantine_bytes), capacity_(capacity),
        device_(std::move(device)) {}
  ~CheckedAllocator();  // returns live and quarantined memory to the system
  CheckedAllocator(const CheckedAllocator&) = delete;
  CheckedAllocator& operator=(const CheckedAllocator&) = delete;

  // Allocates and counts at once. In checked mode the memory starts poisoned too, so a read
  // of memory nobody wrote is as visible as a read after free.
  void* allocate(size_t bytes, MemTag tag);
  // The call-time half of a free: uncounts the allocation and returns its size and tag.
  // Throws fsdp::Error for a pointer that is not live (unknown, or freed already).
  core::AllocationLedger::Entry forget(void* ptr);
  // The stream-ordered half: runs once the free's stream reached the free. In checked mode it
  // poisons and quarantines the block; blocks leaving quarantine are checked for writes after
  // their free, which raise fsdp::Error naming the allocation.
  void release(void* ptr, core::AllocationLedger::Entry entry);
  // Checks every quarantined block for writes after its free; the message of the first one
  // found, or "" (such a block is poisoned again, so it is reported once).
  std::string check_quarantine();

  MemStats stats() const;
  void reset_peak();
  int64_t current_bytes() const;

 private:
  struct Quarantined {
    void* ptr;
    core::AllocationLedger::Entry entry;
  };
  static std::string written_after_free(const Quarantined& q);  // "" when the poison is intact

  const bool checked_;
  const size_t quarantine_limit_;
  const size_t capacity_;
  const std::string device_;
  mutable std::mutex mutex_;
  core::AllocationLedger ledger_;
  std::deque<Quarantined> quarantine_;
  size_t quarantine_bytes_ = 0;
};

}  // namespace fsdp::cpu
