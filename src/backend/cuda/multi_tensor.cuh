// Note [Multi-tensor launches]
// FSDP's copy-out/copy-in and the optimizers touch every tensor of a group; one launch per
// tensor would cost more in launch latency than the copies themselves for small tensors. So
// one launch covers a list of descriptors (cuda_kernels.h): each descriptor's work is cut into
// tiles of kTileElems elements, tiles are numbered across the whole list (assign_tiles), and
// blocks walk the tiles grid-stride, finding a tile's descriptor by binary search over the
// tile_begin column. Tiles keep the load balanced whatever the size mix.
//
// The descriptors are a kernel parameter (passed by value, so the launch copies them and no
// host buffer has to live on) when there are at most kInlineDescs; the parameter is
// __grid_constant__ so indexing it does not spill a per-thread copy. Longer lists are read
// from a device buffer the caller uploaded on the same stream (StagingRing).
#pragma once

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"

namespace fsdp::cuda::kernels {

template <typename Desc>
struct DescBatch {
  Desc inline_descs[kInlineDescs];
  const Desc* device_descs = nullptr;  // set when count > kInlineDescs
  int count = 0;
  int64_t total_tiles = 0;
};

// The last descriptor whose first tile is <= tile (descriptors with no tiles share their
// successor's tile_begin and are skipped by taking the last match).
template <typename Desc>
__device__ __forceinline__ int find_desc(const Desc* descs, int count, int64_t tile) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (descs[mid].tile_begin <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Body::run<W>(desc, e) handles work elements [e, e + W); W = kVec only where desc.vectorized.
template <typename Desc, typename Body>
__global__ void __launch_bounds__(kThreads)
    multi_tensor_kernel(const __grid_constant__ DescBatch<Desc> batch, const Body body) {
  const Desc* descs = batch.device_descs ? batch.device_descs : batch.inline_descs;
  for (int64_t tile = blockIdx.x; tile < batch.total_tiles; tile += gridDim.x) {
    const Desc& d = descs[find_desc(descs, batch.count, tile)];
    const int64_t begin = (tile - d.tile_begin) * kTileElems;
    const int64_t end = min(begin + kTileElems, d.work_numel);
    int64_t scalar_begin = begin;
    if (d.vectorized) {
      scalar_begin = begin + (end - begin) / kVec * kVec;  // begin is a multiple of kVec
      for (int64_t e = begin + threadIdx.x * kVec; e < scalar_begin; e += blockDim.x * kVec)
        body.template run<kVec>(d, e);
    }
    for (int64_t e = scalar_begin + threadIdx.x; e < end; e += blockDim.x)
      body.template run<1>(d, e);
  }
}

template <typename Desc, typename Body>
void launch_multi_tensor(cudaStream_t stream, const Desc* host_descs, const Desc* device_descs,
                         int count, int64_t total_tiles, const Body& body) {
  if (count <= 0 || total_tiles <= 0) return;
  DescBatch<Desc> batch;
  batch.count = count;
  batch.total_tiles = total_tiles;
  if (count <= kInlineDescs) {
    for (int i = 0; i < count; ++i) batch.inline_descs[i] = host_descs[i];
  } else {
    FSDP_CHECK(device_descs != nullptr, count, " descriptors need an uploaded device copy");
    batch.device_descs = device_descs;
  }
  const int blocks = static_cast<int>(std::min<int64_t>(total_tiles, kMaxBlocks));
  multi_tensor_kernel<Desc, Body><<<blocks, kThreads, 0, stream>>>(batch, body);
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
