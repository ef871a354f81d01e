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
  for (void* ptr : ledger_.live_pointers()) std::free(ptr);
  for (auto& q : quarantine_) std::free(q.ptr);
}

void* CheckedAllocator::allocate(size_t bytes, MemTag tag) {
  const int t = static_cast<int>(tag);
  FSDP_CHECK(t >= 0 && t < kMemTagCount, "bad memory tag ", t);
  void* ptr = std::aligned_alloc(kAllocAlignment, rounded_size(bytes));
  FSDP_CHECK(ptr != nullptr, "out of host memory allocating ", bytes, " bytes (tag ",
             mem_tag_name(tag), ")");
  if (checked_) std::memset(ptr, kPoisonByte, bytes);
  ledger_.add(ptr, bytes, tag);
  return ptr;
}

size_t CheckedAllocator::forget(void* ptr) {
  return ledger_.remove(ptr, "this device").bytes;
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

MemStats CheckedAllocator::stats() const { return ledger_.stats(); }

void CheckedAllocator::reset_peak() { ledger_.reset_peak(); }

int64_t CheckedAllocator::current_bytes() const { return ledger_.current_bytes(); }

}  // namespace fsdp::cpu
