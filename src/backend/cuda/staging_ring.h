// Pinned host buffers reused round-robin, for small host data that must reach the device
// without a host-device sync and without the caller keeping its buffer alive: descriptor
// lists too long for kernel parameters, and small copy_from_host transfers.
//
// Each slot has a pinned host buffer, an optional device mirror (from the device's pool) and
// an event recorded after the last work that reads the slot. Taking a slot waits on that
// event, which only blocks when the ring has wrapped around work still queued on the GPU
// (kSlots uploads in flight), so the steady state never waits.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>

namespace fsdp::cuda {

class StagingRing {
 public:
  // Bigger copies do not go through the ring (copy_from_host syncs instead: they are rare,
  // initialization-time transfers, and pinning large buffers would waste host memory).
  static constexpr size_t kMaxStagedCopyBytes = size_t{1} << 20;

  explicit StagingRing(cudaMemPool_t device_pool) : pool_(device_pool) {}
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Copies `bytes` of host data into a slot and enqueues the upload to the slot's device
  // mirror on `stream`; returns the mirror. The caller enqueues the kernel that reads it on
  // the same stream, then calls release_pending(stream).
  const void* upload(cudaStream_t stream, const void* host_data, size_t bytes);
  void release_pending(cudaStream_t stream);

  // Host -> device copy through a slot (bytes <= kMaxStagedCopyBytes): the host buffer is free
  // once this returns; the copy runs in stream order.
  void copy_to_device(cudaStream_t stream, void* device_dst, const void* host_src, size_t bytes);

 private:
  static constexpr int kSlots = 16;
  struct Slot {
    void* host = nullptr;
    size_t host_bytes = 0;
    void* device = nullptr;
    size_t device_bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the last reader of this slot
  };
  Slot& take_slot(cudaStream_t stream, size_t bytes, bool need_device);

  cudaMemPool_t pool_;
  std::array<Slot, kSlots> slots_{};
  int next_ = 0;
  Slot* pending_ = nullptr;  // taken by upload(), waiting for release_pending()
};

}  // namespace fsdp::cuda
