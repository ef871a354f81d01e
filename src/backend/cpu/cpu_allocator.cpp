#include "backend/cpu/cpu_allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "fsdp/error.h"
#include "fsdp/out_of_memory.h"

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
  if (capacity_ > 0) {
    const int64_t live = ledger_.current_bytes();
    if (bytes > capacity_ || static_cast<size_t>(live) > capacity_ - bytes)
      throw OutOfMemoryError(device_, bytes, tag, live, static_cast<int64_t>(capacity_));
  }
  void* ptr = std::aligned_alloc(kAllocAlignment, rounded_size(bytes));
  if (ptr == nullptr)
    throw OutOfMemoryError(device_ + "'s host memory", bytes, tag, ledger_.current_bytes(), 0);
  if (checked_) std::memset(ptr, kPoisonByte, bytes);
  ledger_.add(ptr, bytes, tag);
  return ptr;
}

core::AllocationLedger::Entry CheckedAllocator::forget(void* ptr) {
  return ledger_.remove(ptr, "this device");
}

std::string CheckedAllocator::written_after_free(const Quarantined& q) {
  const auto* bytes = static_cast<const unsigned char*>(q.ptr);
  const size_t n = q.entry.bytes;
  size_t first = n;
  // Word by word (the block is 64-byte aligned), then the tail.
  size_t i = 0;
  for (; i + sizeof(uint64_t) <= n; i += sizeof(uint64_t)) {
    uint64_t word;
    std::memcpy(&word, bytes + i, sizeof word);
    if (word != ~uint64_t{0}) break;
  }
  for (; i < n; ++i)
    if (bytes[i] != kPoisonByte) {
      first = i;
      break;
    }
  if (first == n) return {};
  size_t last = n - 1;
  while (bytes[last] == kPoisonByte) --last;
  return detail::concat("memory was written after it was freed: the ", mem_tag_name(q.entry.tag),
                        " allocation of ", n, " bytes, changed in bytes ", first, "..", last,
                        " (a stream wrote into it after the free, with no event ordering the "
                        "write before the free's stream)");
}

void CheckedAllocator::release(void* ptr, core::AllocationLedger::Entry entry) {
  if (!checked_) {
    std::free(ptr);
    return;
  }
  std::memset(ptr, kPoisonByte, entry.bytes);
  std::deque<Quarantined> expired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quarantine_.push_back({ptr, entry});
    quarantine_bytes_ += entry.bytes;
    while (quarantine_bytes_ > quarantine_limit_ && !quarantine_.empty()) {
      quarantine_bytes_ -= quarantine_.front().entry.bytes;
      expired.push_back(quarantine_.front());
      quarantine_.pop_front();
    }
  }
  std::string failure;
  for (auto& q : expired) {
    if (failure.empty()) failure = written_after_free(q);
    std::free(q.ptr);
  }
  if (!failure.empty()) FSDP_FAIL(failure);
}

std::string CheckedAllocator::check_quarantine() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& q : quarantine_) {
    std::string failure = written_after_free(q);
    if (failure.empty()) continue;
    std::memset(q.ptr, kPoisonByte, q.entry.bytes);
    return failure;
  }
  return {};
}

MemStats CheckedAllocator::stats() const { return ledger_.stats(); }

void CheckedAllocator::reset_peak() { ledger_.reset_peak(); }

int64_t CheckedAllocator::current_bytes() const { return ledger_.current_bytes(); }

}  // namespace fsdp::cpu
