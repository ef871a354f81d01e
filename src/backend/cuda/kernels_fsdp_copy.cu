// FSDP's fused copies around the collectives (Note [Shard layout]): the all-gather copy-out
// (gathered flat shards -> unsharded params) and the reduce-scatter copy-in (unsharded grads
// -> padded, rank-interleaved, cast RS input). One launch per group (Note [Multi-tensor
// launches]); the caller decides per parameter whether the 16-byte path applies.
#include "backend/cuda/multi_tensor.cuh"

namespace fsdp::cuda::kernels {
namespace {

// Where work element e of a parameter lives in the [world][shard_numel] buffer.
__device__ __forceinline__ int64_t shard_position(const ShardCopyDesc& d, int64_t shard_numel,
                                                  int64_t e) {
  const int64_t rank = e / d.chunk_numel;
  return rank * shard_numel + d.offset + (e - rank * d.chunk_numel);
}

template <typename T>
struct AllGatherCopyOut {
  const T* gathered;
  int64_t shard_numel;

  // A pack never straddles two ranks' chunks: vectorized params have chunk % kVec == 0.
  template <int W>
  __device__ void run(const ShardCopyDesc& d, int64_t e) const {
    const T* from = gathered + shard_position(d, shard_numel, e);
    T* to = static_cast<T*>(d.unsharded_dst) + e;
    copy_pack<W>(to, from);
  }
};

template <typename OutT>
struct ReduceScatterCopyIn {
  OutT* rs_in;
  int64_t shard_numel;

  template <int W, typename SrcT>
  __device__ void load_grad(const ShardCopyDesc& d, int64_t e, float (&v)[W]) const {
    const SrcT* src = static_cast<const SrcT*>(d.unsharded_src);
    if (e + W <= d.valid_numel) {
      load_pack<W>(src + e, v);
    } else {  // the padding rows of the last rank: zeros
#pragma unroll
      for (int i = 0; i < W; ++i) v[i] = e + i < d.valid_numel ? to_float(src[e + i]) : 0.0f;
    }
  }

  template <int W>
  __device__ void run(const ShardCopyDesc& d, int64_t e) const {
    float v[W];
    if (d.src_type == DType::F32)  // uniform across the tile: no divergence
      load_grad<W, float>(d, e, v);
    else
      load_grad<W, bf16>(d, e, v);
    store_pack<W>(rs_in + shard_position(d, shard_numel, e), v);
  }
};

}  // namespace

void all_gather_copy_out(cudaStream_t stream, const void* gathered, DType t, int64_t shard_numel,
                         const ShardCopyDesc* host_descs, const ShardCopyDesc* device_descs,
                         int count, int64_t total_tiles) {
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const AllGatherCopyOut<T> body{static_cast<const T*>(gathered), shard_numel};
    launch_multi_tensor(stream, host_descs, device_descs, count, total_tiles, body);
  });
}

void reduce_scatter_copy_in(cudaStream_t stream, void* rs_in, DType rs_t, int64_t shard_numel,
                            const ShardCopyDesc* host_descs, const ShardCopyDesc* device_descs,
                            int count, int64_t total_tiles) {
  dispatch_dtype(rs_t, [&](auto tag) {
    using T = decltype(tag);
    const ReduceScatterCopyIn<T> body{static_cast<T*>(rs_in), shard_numel};
    launch_multi_tensor(stream, host_descs, device_descs, count, total_tiles, body);
  });
}

}  // namespace fsdp::cuda::kernels
