// The CPU backend's compute kernels: plain host functions that run on a stream's worker
// thread. Inputs are read as fp32 (load_as_float), arithmetic and sums are fp32, and outputs
// are rounded to the output dtype once, so bf16 results match a "compute in fp32, store in
// bf16" reference. The semantics are the ones documented on fsdp::Device.
#pragma once

#include <cstdint>

#include "fsdp/device.h"
#include "fsdp/dtype.h"

namespace fsdp::cpu::kernels {

// One BLAS thread per caller: every rank and stream already is a thread.
void configure_blas_once();

void fill(void* dst, DType t, int64_t n, float value);
void cast(void* dst, DType dst_t, const void* src, DType src_t, int64_t n);
// max |x[i]| over n values, NaN when any is (fp8_amax's per-tensor amax; Note [Fused amax]).
float abs_max(const void* x, DType t, int64_t n);

void all_gather_copy_out(const void* gathered, DType t, int64_t shard_numel, int world,
                         const ShardSlice* slices, void* const* dsts, int count);
void reduce_scatter_copy_in(void* rs_in, DType rs_t, int64_t shard_numel, int world,
                            const ShardSlice* slices, const void* const* srcs,
                            const DType* src_types, int count);
void accumulate(float* dst, const void* src, DType src_t, int64_t n, float scale);

void adamw_step(const OptimTensor* tensors, int count, const AdamWConfig& c, int64_t step);
void sgd_step(const OptimTensor* tensors, int count, float lr, float momentum, float weight_decay);
// Note [Step scalars]: s and grad_sq are read when the kernel runs.
float clip_coefficient(const StepScalars& s, GradSquares grad_sq);
void adamw_step_scalars(const OptimTensor* tensors, int count, const AdamWConfig& c,
                        const StepScalars& s, GradSquares grad_sq);
void sgd_step_scalars(const OptimTensor* tensors, int count, float momentum, float weight_decay,
                      const StepScalars& s, GradSquares grad_sq);
void sum_squares(const float* const* tensors, const int64_t* numels, int count, float* out);

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          const void* b, DType ab_t, float beta, void* c, DType c_t);

void activation_forward(Activation f, const void* x, void* y, DType t, int64_t n);
void activation_backward(Activation f, const void* x, const void* dy, void* dx, DType t, int64_t n);
void add(void* out, const void* a, const void* b, DType t, int64_t n);

void softmax_rows(const void* x, DType t, float* probs, int64_t rows, int64_t cols);
void softmax_rows_backward(const float* probs, const float* dprobs, void* dx, DType t, int64_t rows,
                           int64_t cols);
void scale_rows(void* out, const void* in, DType t, const float* w, int64_t w_stride, int64_t rows,
                int64_t cols, bool accumulate);
void row_dot(const void* a, const void* b, DType t, float* out, int64_t out_stride, int64_t rows,
             int64_t cols);

// loss and dy may be null (only the other one is wanted).
void mean_square_loss(const void* y, DType t, int64_t n, float* loss, void* dy);
void cross_entropy_loss(const void* logits, DType t, const int32_t* labels, int64_t rows,
                        int64_t classes, float* loss, void* dlogits);

void spin(double microseconds);

// GELU, tanh approximation, and its exact derivative (shared with the tests' references).
float gelu(float x);
float gelu_grad(float x);

}  // namespace fsdp::cpu::kernels
