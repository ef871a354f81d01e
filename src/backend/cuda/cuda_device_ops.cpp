// CudaDevice: the enqueued compute ops, FSDP's fused copies and the optimizer steps. Each op
// validates its arguments on the host (cheap, and a clear error beats a device fault), then
// hands the work to one launcher in cuda_kernels.h (or to cuBLASLt).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"

namespace fsdp::cuda {

namespace {

// The kernels' pack path moves 16-byte words: the base pointer must be 16-byte aligned (the
// element offsets of every pack are multiples of 8 elements, so of 16 bytes, by construction).
bool pack_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// One optimizer descriptor per tensor (AdamW: both states; SGD: the momentum buffer, if any),
// vectorized where every array it touches is 16-byte aligned.
void describe_optim_tensors(std::vector<kernels::OptimDesc>& descs, const OptimTensor* tensors,
                            int count, bool adamw, float momentum) {
  descs.assign(count, kernels::OptimDesc{});
  for (int i = 0; i < count; ++i) {
    const OptimTensor& t = tensors[i];
    FSDP_CHECK(adamw || momentum == 0.0f || t.state0 != nullptr || t.numel == 0,
               "SGD with momentum needs a momentum buffer (tensor ", i, ")");
    const bool uses_state0 = adamw || momentum != 0.0f;
    descs[i] = kernels::OptimDesc{t.param, t.grad, t.state0, adamw ? t.state1 : nullptr, t.numel,
                                  0, false, t.grad_dtype == DType::BF16};
    FSDP_CHECK(!t.param_copy || t.param_copy_dtype == DType::F32 || t.param_copy_dtype == DType::BF16,
               "optimizer tensor ", i, ": param_copy must be fp32 or bf16");
    descs[i].param_copy = t.param_copy;
    descs[i].copy_bf16 = t.param_copy_dtype == DType::BF16;
    descs[i].vectorized = pack_aligned(t.param) && pack_aligned(t.grad) &&
                          (!uses_state0 || pack_aligned(t.state0)) &&
                          (!adamw || pack_aligned(t.state1)) &&
                          (!t.param_copy || pack_aligned(t.param_copy));
  }
}

void check_slice(const ShardSlice& slice, int index, int world, int64_t shard_numel) {
  FSDP_CHECK(slice.rows >= 0 && slice.cols >= 0 && slice.rows_per_rank >= 0 && slice.offset >= 0,
             "param ", index, ": negative shape or offset");
  FSDP_CHECK(slice.rows_per_rank * world >= slice.rows, "param ", index, ": ", world, " ranks x ",
             slice.rows_per_rank, " rows per rank do not cover ", slice.rows, " rows");
  FSDP_CHECK(slice.offset + slice.rows_per_rank * slice.cols <= shard_numel, "param ", index,
             ": offset ", slice.offset, " + ", slice.rows_per_rank, "x", slice.cols,
             " runs past the shard of ", shard_numel, " elements");
}

// The parameter-independent half of "every access of this param is pack-aligned": chunks,
// offsets and the shard stride must all be whole packs.
bool shard_geometry_packs(const ShardSlice& slice, int64_t shard_numel) {
  return slice.rows_per_rank * slice.cols % 8 == 0 && slice.offset % 8 == 0 && shard_numel % 8 == 0;
}

// The descriptor of one parameter for the fused copy kernels. `unsharded` is the param (AG
// copy-out: written) or its grad (RS copy-in: read, of type `unsharded_t`); `flat` is the
// [world][shard_numel] buffer. The copy-in also covers the padding rows (written as zeros).
kernels::ShardCopyDesc describe_slice(const ShardSlice& slice, int index, int world,
                                      int64_t shard_numel, const void* unsharded,
                                      DType unsharded_t, const void* flat, bool copy_in) {
  check_slice(slice, index, world, shard_numel);
  kernels::ShardCopyDesc d;
  if (copy_in)
    d.unsharded_src = unsharded;
  else
    d.unsharded_dst = const_cast<void*>(unsharded);
  d.src_type = unsharded_t;
  d.chunk_numel = slice.rows_per_rank * slice.cols;
  d.valid_numel = slice.rows * slice.cols;
  d.work_numel = copy_in ? world * d.chunk_numel : d.valid_numel;
  d.offset = slice.offset;
  d.vectorized =
      shard_geometry_packs(slice, shard_numel) && pack_aligned(flat) && pack_aligned(unsharded);
  return d;
}

}  // namespace

const void* CudaDevice::upload(cudaStream_t stream, const void* host_data, size_t bytes) {
  if (!capture_.active) return staging_->upload(stream, host_data, bytes);
  // The staging ring's slots are reused, so a graph must own its copy: a pinned snapshot, and
  // graph memory freed by release_upload once the reader is enqueued.
  FSDP_CHECK(capture_upload_ == nullptr, "an upload under capture was never released");
  FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&capture_upload_, bytes, pool_, stream));
  FSDP_CUDA_CHECK(cudaMemcpyAsync(capture_upload_, snapshot(host_data, bytes), bytes,
                                  cudaMemcpyHostToDevice, stream));
  return capture_upload_;
}

void CudaDevice::release_upload(cudaStream_t stream) {
  if (!capture_upload_) return staging_->release_pending(stream);
  void* p = capture_upload_;
  capture_upload_ = nullptr;
  FSDP_CUDA_CHECK(cudaFreeAsync(p, stream));
}

template <typename Desc, typename Launch>
void CudaDevice::with_device_descs(cudaStream_t stream, const std::vector<Desc>& descs,
                                   Launch&& launch) {
  if (static_cast<int>(descs.size()) <= kernels::kInlineDescs) {
    launch(static_cast<const Desc*>(nullptr));
    return;
  }
  const auto* device_descs =
      static_cast<const Desc*>(upload(stream, descs.data(), descs.size() * sizeof(Desc)));
  try {
    launch(device_descs);
  } catch (...) {
    release_upload(stream);
    throw;
  }
  release_upload(stream);  // reusable (or freed) once the kernel has read it
}

void CudaDevice::fill(Stream s, void* dst, DType t, int64_t n, float value) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::fill(op.stream(), dst, t, n, value);
}

void CudaDevice::cast(Stream s, void* dst, DType dst_t, const void* src, DType src_t, int64_t n) {
  OpScope op(*this, s, OpKind::Kernel);
  if (n <= 0) return;
  if (dst_t == src_t) {
    FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * dtype_size(dst_t),
                                    cudaMemcpyDeviceToDevice, op.stream()));
    return;
  }
  kernels::cast(op.stream(), dst, dst_t, src, src_t, n);
}

void CudaDevice::all_gather_copy_out(Stream s, const void* gathered, DType t, int64_t shard_numel,
                                     int world, const ShardSlice* slices, void* const* dsts,
                                     int count) {
  OpScope op(*this, s, OpKind::Copy);
  FSDP_CHECK(world >= 1 && count >= 0 && shard_numel >= 0, "world ", world, " count ", count,
             " shard_numel ", shard_numel);
  shard_descs_.resize(count);
  for (int i = 0; i < count; ++i)
    shard_descs_[i] = describe_slice(slices[i], i, world, shard_numel, dsts[i], t, gathered, false);
  const int64_t tiles = kernels::assign_tiles(shard_descs_.data(), count);
  with_device_descs(op.stream(), shard_descs_, [&](const kernels::ShardCopyDesc* device_descs) {
    kernels::all_gather_copy_out(op.stream(), gathered, t, shard_numel, shard_descs_.data(),
                                 device_descs, count, tiles);
  });
}

void CudaDevice::reduce_scatter_copy_in(Stream s, void* rs_in, DType rs_t, int64_t shard_numel,
                                        int world, const ShardSlice* slices,
                                        const void* const* srcs, const DType* src_types,
                                        int count) {
  OpScope op(*this, s, OpKind::Copy);
  FSDP_CHECK(world >= 1 && count >= 0 && shard_numel >= 0, "world ", world, " count ", count,
             " shard_numel ", shard_numel);
  shard_descs_.resize(count);
  for (int i = 0; i < count; ++i)
    shard_descs_[i] =
        describe_slice(slices[i], i, world, shard_numel, srcs[i], src_types[i], rs_in, true);
  const int64_t tiles = kernels::assign_tiles(shard_descs_.data(), count);
  with_device_descs(op.stream(), shard_descs_, [&](const kernels::ShardCopyDesc* device_descs) {
    kernels::reduce_scatter_copy_in(op.stream(), rs_in, rs_t, shard_numel, shard_descs_.data(),
                                    device_descs, count, tiles);
  });
}

void CudaDevice::accumulate(Stream s, float* dst, const void* src, DType src_t, int64_t n,
                            float scale) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::accumulate(op.stream(), dst, src, src_t, n, scale);
}

void CudaDevice::adamw_step(Stream s, const OptimTensor* tensors, int count, const AdamWConfig& c,
                            int64_t step) {
  OpScope op(*this, s, OpKind::Optimizer);
  FSDP_CHECK(step >= 1, "AdamW step counts from 1, got ", step);
  describe_optim_tensors(optim_descs_, tensors, count, /*adamw=*/true, 0.0f);
  // Bias corrections in double on the host, as PyTorch computes them in Python floats.
  const double steps = static_cast<double>(step);
  kernels::AdamWParams params{};
  params.lr = c.lr;
  params.beta1 = c.beta1;
  params.beta2 = c.beta2;
  params.eps = c.eps;
  params.weight_decay = c.weight_decay;
  params.bias_correction1 = static_cast<float>(1.0 - std::pow(double{c.beta1}, steps));
  params.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(double{c.beta2}, steps)));
  const int64_t tiles = kernels::assign_tiles(optim_descs_.data(), count);
  with_device_descs(op.stream(), optim_descs_, [&](const kernels::OptimDesc* device_descs) {
    kernels::adamw(op.stream(), optim_descs_.data(), device_descs, count, tiles, params);
  });
}

void CudaDevice::sgd_step(Stream s, const OptimTensor* tensors, int count, float lr, float momentum,
                          float weight_decay) {
  OpScope op(*this, s, OpKind::Optimizer);
  describe_optim_tensors(optim_descs_, tensors, count, /*adamw=*/false, momentum);
  const int64_t tiles = kernels::assign_tiles(optim_descs_.data(), count);
  with_device_descs(op.stream(), optim_descs_, [&](const kernels::OptimDesc* device_descs) {
    kernels::sgd(op.stream(), optim_descs_.data(), device_descs, count, tiles, lr, momentum,
                 weight_decay);
  });
}

void CudaDevice::adamw_step_scalars(Stream s, const OptimTensor* tensors, int count,
                                    const AdamWConfig& c, const StepScalars* scalars,
                                    GradSquares grad_sq) {
  OpScope op(*this, s, OpKind::Optimizer);
  FSDP_CHECK(scalars != nullptr, "adamw_step_scalars: null scalars");
  describe_optim_tensors(optim_descs_, tensors, count, /*adamw=*/true, 0.0f);
  kernels::AdamWParams params{};  // lr and the bias corrections come from `scalars`
  params.beta1 = c.beta1;
  params.beta2 = c.beta2;
  params.eps = c.eps;
  params.weight_decay = c.weight_decay;
  const int64_t tiles = kernels::assign_tiles(optim_descs_.data(), count);
  with_device_descs(op.stream(), optim_descs_, [&](const kernels::OptimDesc* device_descs) {
    kernels::adamw_scalars(op.stream(), optim_descs_.data(), device_descs, count, tiles, params,
                           scalars, grad_sq);
  });
}

void CudaDevice::sgd_step_scalars(Stream s, const OptimTensor* tensors, int count, float momentum,
                                  float weight_decay, const StepScalars* scalars,
                                  GradSquares grad_sq) {
  OpScope op(*this, s, OpKind::Optimizer);
  FSDP_CHECK(scalars != nullptr, "sgd_step_scalars: null scalars");
  describe_optim_tensors(optim_descs_, tensors, count, /*adamw=*/false, momentum);
  const int64_t tiles = kernels::assign_tiles(optim_descs_.data(), count);
  with_device_descs(op.stream(), optim_descs_, [&](const kernels::OptimDesc* device_descs) {
    kernels::sgd_scalars(op.stream(), optim_descs_.data(), device_descs, count, tiles, momentum,
                         weight_decay, scalars, grad_sq);
  });
}

void CudaDevice::sum_squares(Stream s, const float* const* tensors, const int64_t* numels,
                             int count, float* out) {
  FSDP_CHECK(count >= 0 && (count == 0 || (tensors && numels && out)),
             "sum_squares: bad tensor array");
  if (count == 0) return;
  optim_descs_.assign(count, kernels::OptimDesc{});
  for (int i = 0; i < count; ++i) {
    FSDP_CHECK(numels[i] >= 0 && (numels[i] == 0 || tensors[i]), "sum_squares: tensor ", i,
               " is null for ", numels[i], " elements");
    optim_descs_[i] = kernels::OptimDesc{nullptr, tensors[i], nullptr, nullptr, numels[i], 0, false};
  }
  const int64_t tiles = kernels::assign_tiles(optim_descs_.data(), count);
  // Scratch for the per-tile partial sums, stream-ordered like every other buffer.
  auto* partial = static_cast<float*>(
      alloc(static_cast<size_t>(std::max<int64_t>(tiles, 1)) * sizeof(float), s, MemTag::Other));
  {
    OpScope op(*this, s, OpKind::Kernel);
    with_device_descs(op.stream(), optim_descs_, [&](const kernels::OptimDesc* device_descs) {
      kernels::sum_squares(op.stream(), optim_descs_.data(), device_descs, count, tiles, partial,
                           out);
    });
  }
  free(partial, s);
}

void CudaDevice::gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const void* a, const void* b, DType ab_t, float beta, void* c,
                      DType c_t) {
  OpScope op(*this, s, OpKind::Kernel);
  FSDP_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm shape ", m, "x", n, "x", k);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // op(A) op(B) is all zeros: C = beta C, without reading C when beta is 0
    if (beta == 0.0f)
      kernels::fill(op.stream(), c, c_t, m * n, 0.0f);
    else if (beta != 1.0f)
      kernels::scale_in_place(op.stream(), c, c_t, m * n, beta);
    return;
  }
  gemm_->run(op.stream(), trans_a, trans_b, m, n, k, alpha, a, b, ab_t, beta, c, c_t);
}

void CudaDevice::gemm_relu(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                           const void* a, const void* b, DType ab_t, void* c, DType c_t) {
  OpScope op(*this, s, OpKind::Kernel);
  FSDP_CHECK(m > 0 && n > 0 && k > 0, "gemm_relu shape ", m, "x", n, "x", k);
  gemm_->run(op.stream(), trans_a, trans_b, m, n, k, 1.0f, a, b, ab_t, 0.0f, c, c_t,
             /*relu=*/true);
}

void CudaDevice::activation_forward(Stream s, Activation f, const void* x, void* y, DType t,
                                    int64_t n) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::activation_forward(op.stream(), f, x, y, t, n);
}

void CudaDevice::activation_backward(Stream s, Activation f, const void* x, const void* dy,
                                     void* dx, DType t, int64_t n) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::activation_backward(op.stream(), f, x, dy, dx, t, n);
}

void CudaDevice::add(Stream s, void* out, const void* a, const void* b, DType t, int64_t n) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::add(op.stream(), out, a, b, t, n);
}

void CudaDevice::softmax_rows(Stream s, const void* x, DType t, float* probs, int64_t rows,
                              int64_t cols) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::softmax_rows(op.stream(), x, t, probs, rows, cols);
}

void CudaDevice::softmax_rows_backward(Stream s, const float* probs, const float* dprobs, void* dx,
                                       DType t, int64_t rows, int64_t cols) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::softmax_rows_backward(op.stream(), probs, dprobs, dx, t, rows, cols);
}

void CudaDevice::scale_rows(Stream s, void* out, const void* in, DType t, const float* w,
                            int64_t w_stride, int64_t rows, int64_t cols, bool accumulate) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::scale_rows(op.stream(), out, in, t, w, w_stride, rows, cols, accumulate);
}

void CudaDevice::row_dot(Stream s, const void* a, const void* b, DType t, float* out,
                         int64_t out_stride, int64_t rows, int64_t cols) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::row_dot(op.stream(), a, b, t, out, out_stride, rows, cols);
}

void CudaDevice::mean_square_loss(Stream s, const void* y, DType t, int64_t n, float* loss,
                                  void* dy) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::mean_square_loss(op.stream(), pool_, y, t, n, loss, dy);
}

void CudaDevice::cross_entropy_loss(Stream s, const void* logits, DType t, const int32_t* labels,
                                    int64_t rows, int64_t classes, float* loss, void* dlogits) {
  OpScope op(*this, s, OpKind::Kernel);
  FSDP_CHECK(classes > 0 || rows == 0, "cross-entropy over ", classes, " classes");
  kernels::cross_entropy_loss(op.stream(), pool_, logits, t, labels, rows, classes, loss, dlogits);
}

void CudaDevice::synthetic_batch(Stream s, void* dst, DType t, int64_t rows, int64_t cols,
                                 uint64_t seed, int64_t step, int64_t first_row, float bound) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::synthetic_batch(op.stream(), dst, t, rows, cols, seed, step, first_row, bound);
}

void CudaDevice::synthetic_labels(Stream s, int32_t* labels, int64_t rows, int64_t width,
                                  uint64_t seed, int64_t step, int64_t first_row, float bound) {
  OpScope op(*this, s, OpKind::Kernel);
  kernels::synthetic_labels(op.stream(), labels, rows, width, seed, step, first_row, bound);
}

void CudaDevice::spin(Stream s, double microseconds) {
  OpScope op(*this, s, OpKind::Kernel);
  const double ns = microseconds > 0 ? microseconds * 1000.0 : 0.0;
  kernels::spin(op.stream(), static_cast<uint64_t>(ns));
}

}  // namespace fsdp::cuda
