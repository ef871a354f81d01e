// The CPU device's copies, kernels and optimizer steps: each call checks its arguments on the
// host (so a bad call fails where it was made, not later on a worker), copies whatever the
// caller may reuse once the call returns (descriptor arrays, host sources), and enqueues the
// kernel from cpu_kernels.h on the stream.
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "fsdp/synthetic.h"
#include "backend/cpu/cpu_kernels.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {

void check_buffer(const void* p, int64_t n, const char* what, const char* op) {
  FSDP_CHECK(n >= 0, op, ": negative element count ", n);
  FSDP_CHECK(n == 0 || p != nullptr, op, ": ", what, " is null for ", n, " elements");
}

void check_slices(const char* op, int64_t shard_numel, int world, const ShardSlice* slices,
                  int count) {
  FSDP_CHECK(world >= 1 && count >= 0 && shard_numel >= 0, op, ": world ", world, ", count ", count,
             ", shard_numel ", shard_numel);
  FSDP_CHECK(count == 0 || slices != nullptr, op, ": null slice array");
  for (int p = 0; p < count; ++p) {
    const ShardSlice& s = slices[p];
    FSDP_CHECK(s.rows >= 0 && s.cols >= 0 && s.offset >= 0 && s.rows_per_rank * world >= s.rows &&
                   s.offset + s.rows_per_rank * s.cols <= shard_numel,
               op, ": slice ", p, " (rows ", s.rows, ", cols ", s.cols, ", rows_per_rank ",
               s.rows_per_rank, ", offset ", s.offset, ") does not fit a shard of ", shard_numel,
               " elements over ", world, " ranks");
  }
}

std::vector<OptimTensor> copy_optim_tensors(const char* op, const OptimTensor* tensors, int count,
                                            bool needs_state0, bool needs_state1) {
  FSDP_CHECK(count >= 0 && (count == 0 || tensors != nullptr), op, ": bad tensor array");
  std::vector<OptimTensor> out(tensors, tensors + count);
  for (const OptimTensor& t : out) {
    check_buffer(t.param, t.numel, "param", op);
    check_buffer(t.grad, t.numel, "grad", op);
    if (needs_state0) check_buffer(t.state0, t.numel, "state0", op);
    if (needs_state1) check_buffer(t.state1, t.numel, "state1", op);
    FSDP_CHECK(!t.param_copy || t.param_copy_dtype == DType::F32 || t.param_copy_dtype == DType::BF16,
               op, ": param_copy must be fp32 or bf16");
  }
  return out;
}

}  // namespace

// ---- copies

void CpuDevice::copy(Stream s, void* dst, const void* src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (dst && src), "copy of ", bytes, " bytes with a null pointer");
  enqueue(s, OpKind::Copy, [=] { if (bytes) std::memmove(dst, src, bytes); });
}

void CpuDevice::copy_from_host(Stream s, void* dst, const void* host_src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (dst && host_src), "copy_from_host of ", bytes,
             " bytes with a null pointer");
  // The caller may reuse host_src as soon as we return, so the task carries its own copy.
  const auto* first = static_cast<const char*>(host_src);
  std::vector<char> staged(first, first + bytes);
  enqueue(s, OpKind::Copy, [dst, staged = std::move(staged)] {
    if (!staged.empty()) std::memcpy(dst, staged.data(), staged.size());  // no null memcpy
  });
}

void CpuDevice::copy_to_host(Stream s, void* host_dst, const void* src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (host_dst && src), "copy_to_host of ", bytes,
             " bytes with a null pointer");
  enqueue(s, OpKind::Copy, [=] { if (bytes) std::memcpy(host_dst, src, bytes); });
}

// Note [Host-side stream work]: the stream reads the host memory when it gets to the copy.
void CpuDevice::copy_from_host_async(Stream s, void* dst, const void* host_src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (dst && host_src), "copy_from_host_async of ", bytes,
             " bytes with a null pointer");
  enqueue(s, OpKind::Copy, [=] { if (bytes) std::memcpy(dst, host_src, bytes); });
}

void CpuDevice::run_host_task(Stream s, int64_t bytes, std::function<void()> task) {
  FSDP_CHECK(bytes >= 0 && task, "run_host_task: no task, or a negative byte count ", bytes);
  enqueue(s, OpKind::Optimizer, std::move(task));
}

void CpuDevice::fill(Stream s, void* dst, DType t, int64_t n, float value) {
  check_buffer(dst, n, "dst", "fill");
  enqueue(s, OpKind::Kernel, [=] { kernels::fill(dst, t, n, value); });
}

void CpuDevice::cast(Stream s, void* dst, DType dst_t, const void* src, DType src_t, int64_t n) {
  check_buffer(dst, n, "dst", "cast");
  check_buffer(src, n, "src", "cast");
  enqueue(s, OpKind::Kernel, [=] { kernels::cast(dst, dst_t, src, src_t, n); });
}

void CpuDevice::all_gather_copy_out(Stream s, const void* gathered, DType t, int64_t shard_numel,
                                    int world, const ShardSlice* slices, void* const* dsts,
                                    int count) {
  check_slices("all_gather_copy_out", shard_numel, world, slices, count);
  check_buffer(gathered, world * shard_numel, "gathered", "all_gather_copy_out");
  std::vector<ShardSlice> slice_copy(slices, slices + count);
  std::vector<void*> dst_copy(dsts, dsts + count);
  for (int p = 0; p < count; ++p)
    check_buffer(dst_copy[p], slices[p].rows * slices[p].cols, "dst", "all_gather_copy_out");
  enqueue(s, OpKind::Copy, [=, slice_copy = std::move(slice_copy), dst_copy = std::move(dst_copy)] {
    kernels::all_gather_copy_out(gathered, t, shard_numel, world, slice_copy.data(),
                                 dst_copy.data(), count);
  });
}

void CpuDevice::reduce_scatter_copy_in(Stream s, void* rs_in, DType rs_t, int64_t shard_numel,
                                       int world, const ShardSlice* slices, const void* const* srcs,
                                       const DType* src_types, int count) {
  check_slices("reduce_scatter_copy_in", shard_numel, world, slices, count);
  check_buffer(rs_in, world * shard_numel, "rs_in", "reduce_scatter_copy_in");
  std::vector<ShardSlice> slice_copy(slices, slices + count);
  std::vector<const void*> src_copy(srcs, srcs + count);
  std::vector<DType> type_copy(src_types, src_types + count);
  for (int p = 0; p < count; ++p)
    check_buffer(src_copy[p], slices[p].rows * slices[p].cols, "src", "reduce_scatter_copy_in");
  enqueue(s, OpKind::Copy,
          [=, slice_copy = std::move(slice_copy), src_copy = std::move(src_copy),
           type_copy = std::move(type_copy)] {
            kernels::reduce_scatter_copy_in(rs_in, rs_t, shard_numel, world, slice_copy.data(),
                                            src_copy.data(), type_copy.data(), count);
          });
}

void CpuDevice::accumulate(Stream s, float* dst, const void* src, DType src_t, int64_t n,
                           float scale) {
  check_buffer(dst, n, "dst", "accumulate");
  check_buffer(src, n, "src", "accumulate");
  enqueue(s, OpKind::Kernel, [=] { kernels::accumulate(dst, src, src_t, n, scale); });
}

// ---- optimizers

void CpuDevice::adamw_step(Stream s, const OptimTensor* tensors, int count, const AdamWConfig& c,
                           int64_t step) {
  FSDP_CHECK(step >= 1, "adamw_step needs a 1-based step count, got ", step);
  auto copies = copy_optim_tensors("adamw_step", tensors, count, true, true);
  enqueue(s, OpKind::Optimizer, [copies = std::move(copies), c, step] {
    kernels::adamw_step(copies.data(), static_cast<int>(copies.size()), c, step);
  });
}

void CpuDevice::sgd_step(Stream s, const OptimTensor* tensors, int count, float lr, float momentum,
                         float weight_decay) {
  auto copies = copy_optim_tensors("sgd_step", tensors, count, momentum != 0.0f, false);
  enqueue(s, OpKind::Optimizer, [copies = std::move(copies), lr, momentum, weight_decay] {
    kernels::sgd_step(copies.data(), static_cast<int>(copies.size()), lr, momentum, weight_decay);
  });
}

void CpuDevice::adamw_step_scalars(Stream s, const OptimTensor* tensors, int count,
                                   const AdamWConfig& c, const StepScalars* scalars,
                                   GradSquares grad_sq) {
  FSDP_CHECK(scalars != nullptr, "adamw_step_scalars: null scalars");
  check_buffer(grad_sq.sums, grad_sq.count, "grad_sq", "adamw_step_scalars");
  auto copies = copy_optim_tensors("adamw_step_scalars", tensors, count, true, true);
  enqueue(s, OpKind::Optimizer, [copies = std::move(copies), c, scalars, grad_sq] {
    kernels::adamw_step_scalars(copies.data(), static_cast<int>(copies.size()), c, *scalars,
                                grad_sq);
  });
}

void CpuDevice::sgd_step_scalars(Stream s, const OptimTensor* tensors, int count, float momentum,
                                 float weight_decay, const StepScalars* scalars,
                                 GradSquares grad_sq) {
  FSDP_CHECK(scalars != nullptr, "sgd_step_scalars: null scalars");
  check_buffer(grad_sq.sums, grad_sq.count, "grad_sq", "sgd_step_scalars");
  auto copies = copy_optim_tensors("sgd_step_scalars", tensors, count, momentum != 0.0f, false);
  enqueue(s, OpKind::Optimizer,
          [copies = std::move(copies), momentum, weight_decay, scalars, grad_sq] {
            kernels::sgd_step_scalars(copies.data(), static_cast<int>(copies.size()), momentum,
                                      weight_decay, *scalars, grad_sq);
          });
}

void CpuDevice::sum_squares(Stream s, const float* const* tensors, const int64_t* numels,
                            int count, float* out) {
  FSDP_CHECK(count >= 0 && (count == 0 || (tensors && numels)), "sum_squares: bad tensor array");
  check_buffer(out, count, "out", "sum_squares");
  std::vector<const float*> ptrs(tensors, tensors + count);
  std::vector<int64_t> sizes(numels, numels + count);
  for (int i = 0; i < count; ++i) check_buffer(ptrs[i], sizes[i], "tensor", "sum_squares");
  enqueue(s, OpKind::Kernel, [ptrs = std::move(ptrs), sizes = std::move(sizes), out] {
    kernels::sum_squares(ptrs.data(), sizes.data(), static_cast<int>(ptrs.size()), out);
  });
}

// ---- compute

void CpuDevice::gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const void* a, const void* b, DType ab_t, float beta, void* c,
                     DType c_t) {
  FSDP_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm with negative dims ", m, "x", n, "x", k);
  check_buffer(a, m * k, "A", "gemm");
  check_buffer(b, k * n, "B", "gemm");
  check_buffer(c, m * n, "C", "gemm");
  enqueue(s, OpKind::Kernel,
          [=] { kernels::gemm(trans_a, trans_b, m, n, k, alpha, a, b, ab_t, beta, c, c_t); });
}

void CpuDevice::gemm_relu(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n,
                          int64_t k, const void* a, const void* b, DType ab_t, void* c, DType c_t) {
  FSDP_CHECK(m >= 0 && n >= 0 && k >= 0, "gemm with negative dims ", m, "x", n, "x", k);
  check_buffer(a, m * k, "A", "gemm_relu");
  check_buffer(b, k * n, "B", "gemm_relu");
  check_buffer(c, m * n, "C", "gemm_relu");
  enqueue(s, OpKind::Kernel, [=] {
    kernels::gemm(trans_a, trans_b, m, n, k, 1.0f, a, b, ab_t, 0.0f, c, c_t);
    kernels::activation_forward(Activation::ReLU, c, c, c_t, m * n);
  });
}

void CpuDevice::activation_forward(Stream s, Activation f, const void* x, void* y, DType t,
                                   int64_t n) {
  check_buffer(x, n, "x", "activation_forward");
  check_buffer(y, n, "y", "activation_forward");
  enqueue(s, OpKind::Kernel, [=] { kernels::activation_forward(f, x, y, t, n); });
}

void CpuDevice::activation_backward(Stream s, Activation f, const void* x, const void* dy, void* dx,
                                    DType t, int64_t n) {
  check_buffer(x, n, "x", "activation_backward");
  check_buffer(dy, n, "dy", "activation_backward");
  check_buffer(dx, n, "dx", "activation_backward");
  enqueue(s, OpKind::Kernel, [=] { kernels::activation_backward(f, x, dy, dx, t, n); });
}

void CpuDevice::add(Stream s, void* out, const void* a, const void* b, DType t, int64_t n) {
  check_buffer(out, n, "out", "add");
  check_buffer(a, n, "a", "add");
  check_buffer(b, n, "b", "add");
  enqueue(s, OpKind::Kernel, [=] { kernels::add(out, a, b, t, n); });
}

void CpuDevice::softmax_rows(Stream s, const void* x, DType t, float* probs, int64_t rows,
                             int64_t cols) {
  check_buffer(x, rows * cols, "x", "softmax_rows");
  check_buffer(probs, rows * cols, "probs", "softmax_rows");
  enqueue(s, OpKind::Kernel, [=] { kernels::softmax_rows(x, t, probs, rows, cols); });
}

void CpuDevice::softmax_rows_backward(Stream s, const float* probs, const float* dprobs, void* dx,
                                      DType t, int64_t rows, int64_t cols) {
  check_buffer(probs, rows * cols, "probs", "softmax_rows_backward");
  check_buffer(dprobs, rows * cols, "dprobs", "softmax_rows_backward");
  check_buffer(dx, rows * cols, "dx", "softmax_rows_backward");
  enqueue(s, OpKind::Kernel,
          [=] { kernels::softmax_rows_backward(probs, dprobs, dx, t, rows, cols); });
}

void CpuDevice::scale_rows(Stream s, void* out, const void* in, DType t, const float* w,
                           int64_t w_stride, int64_t rows, int64_t cols, bool accumulate) {
  check_buffer(out, rows * cols, "out", "scale_rows");
  check_buffer(in, rows * cols, "in", "scale_rows");
  check_buffer(w, rows, "w", "scale_rows");
  enqueue(s, OpKind::Kernel,
          [=] { kernels::scale_rows(out, in, t, w, w_stride, rows, cols, accumulate); });
}

void CpuDevice::row_dot(Stream s, const void* a, const void* b, DType t, float* out,
                        int64_t out_stride, int64_t rows, int64_t cols) {
  check_buffer(a, rows * cols, "a", "row_dot");
  check_buffer(b, rows * cols, "b", "row_dot");
  check_buffer(out, rows, "out", "row_dot");
  enqueue(s, OpKind::Kernel, [=] { kernels::row_dot(a, b, t, out, out_stride, rows, cols); });
}

void CpuDevice::mean_square_loss(Stream s, const void* y, DType t, int64_t n, float* loss,
                                 void* dy) {
  FSDP_CHECK(n > 0, "mean_square_loss over ", n, " elements");
  check_buffer(y, n, "y", "mean_square_loss");
  enqueue(s, OpKind::Kernel, [=] { kernels::mean_square_loss(y, t, n, loss, dy); });
}

void CpuDevice::cross_entropy_loss(Stream s, const void* logits, DType t, const int32_t* labels,
                                   int64_t rows, int64_t classes, float* loss, void* dlogits) {
  FSDP_CHECK(rows > 0 && classes > 0, "cross_entropy_loss over ", rows, "x", classes, " logits");
  check_buffer(logits, rows * classes, "logits", "cross_entropy_loss");
  check_buffer(labels, rows, "labels", "cross_entropy_loss");
  enqueue(s, OpKind::Kernel,
          [=] { kernels::cross_entropy_loss(logits, t, labels, rows, classes, loss, dlogits); });
}

void CpuDevice::synthetic_batch(Stream s, void* dst, DType t, int64_t rows, int64_t cols,
                                uint64_t seed, int64_t step, int64_t first_row, float bound) {
  enqueue(s, OpKind::Kernel, [=] {
    for (int64_t r = 0; r < rows; ++r) {
      const uint64_t row_seed = synthetic_row_seed(seed, step, first_row + r);
      for (int64_t c = 0; c < cols; ++c)
        store_from_float(dst, t, static_cast<size_t>(r * cols + c),
                         synthetic_uniform(row_seed, static_cast<uint64_t>(c), bound));
    }
  });
}

void CpuDevice::synthetic_labels(Stream s, int32_t* labels, int64_t rows, int64_t width,
                                 uint64_t seed, int64_t step, int64_t first_row, float bound) {
  enqueue(s, OpKind::Kernel, [=] {
    for (int64_t r = 0; r < rows; ++r)
      labels[r] = synthetic_label(synthetic_row_seed(seed, step, first_row + r), width, bound);
  });
}

void CpuDevice::spin(Stream s, double microseconds) {
  if (world()->clock) {
    // Simulated: the stream is occupied for exactly that long on the virtual clock.
    enqueue(s, OpKind::Kernel,
            [this, microseconds] { world()->pass_time(microseconds, &cancellation()); });
    return;
  }
  enqueue(s, OpKind::Kernel, [microseconds] { kernels::spin(microseconds); });
}

}  // namespace fsdp::cpu
