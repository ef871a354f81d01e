#include "backend/cuda/staging_ring.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nccl_watchdog.h"

namespace fsdp::cuda {

namespace {
constexpr size_t kMinSlotBytes = size_t{64} << 10;
}

StagingRing::~StagingRing() {
  // Destructors must not throw; the device is being torn down, so errors are moot here.
  for (Slot& slot : slots_) {
    if (slot.done) {
      if (!watchdog_aborted()) (void)cudaEventSynchronize(slot.done);
      (void)cudaEventDestroy(slot.done);
    }
    if (slot.host) (void)cudaFreeHost(slot.host);
    if (slot.device) (void)cudaFree(slot.device);
  }
}

StagingRing::Slot& StagingRing::take_slot(cudaStream_t stream, size_t bytes, bool need_device) {
  FSDP_CHECK(pending_ == nullptr, "a staged upload was never released");
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % kSlots;
  if (!slot.done) {
    FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  } else {
    // Only waits when the ring wrapped; polled, so a watchdog abort ends the wait.
    cudaEvent_t done = slot.done;
    FSDP_CUDA_CHECK(poll_until_ready([&] { return cudaEventQuery(done); }));
  }
  const size_t want = std::max(kMinSlotBytes, bytes);
  if (slot.host_bytes < bytes) {
    // Growth is rare (the first long descriptor list); the slot is idle after the wait above.
    if (slot.host) FSDP_CUDA_CHECK(cudaFreeHost(slot.host));
    slot.host = nullptr;
    slot.host_bytes = 0;
    FSDP_CUDA_CHECK(cudaMallocHost(&slot.host, want));
    slot.host_bytes = want;
  }
  if (need_device && slot.device_bytes < bytes) {
    if (slot.device) FSDP_CUDA_CHECK(cudaFreeAsync(slot.device, stream));
    slot.device = nullptr;
    slot.device_bytes = 0;
    FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&slot.device, want, pool_, stream));
    slot.device_bytes = want;
  }
  return slot;
}

const void* StagingRing::upload(cudaStream_t stream, const void* host_data, size_t bytes) {
  Slot& slot = take_slot(stream, bytes, /*need_device=*/true);
  std::memcpy(slot.host, host_data, bytes);
  FSDP_CUDA_CHECK(cudaMemcpyAsync(slot.device, slot.host, bytes, cudaMemcpyHostToDevice, stream));
  pending_ = &slot;
  return slot.device;
}

void StagingRing::release_pending(cudaStream_t stream) {
  if (!pending_) return;
  Slot* slot = pending_;
  pending_ = nullptr;
  FSDP_CUDA_CHECK(cudaEventRecord(slot->done, stream));
}

void StagingRing::copy_to_device(cudaStream_t stream, void* device_dst, const void* host_src,
                                 size_t bytes) {
  FSDP_CHECK(bytes <= kMaxStagedCopyBytes, "staged copy of ", bytes, " bytes");
  Slot& slot = take_slot(stream, bytes, /*need_device=*/false);
  std::memcpy(slot.host, host_src, bytes);
  // cudaMemcpyDefault: device_dst may be page-locked host memory (offloaded optimizer state).
  FSDP_CUDA_CHECK(cudaMemcpyAsync(device_dst, slot.host, bytes, cudaMemcpyDefault, stream));
  FSDP_CUDA_CHECK(cudaEventRecord(slot.done, stream));
}

}  // namespace fsdp::cuda
