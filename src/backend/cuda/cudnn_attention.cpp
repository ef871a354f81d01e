// See Note [cuDNN attention] in cudnn_attention.h.
#include "backend/cuda/cudnn_attention.h"

#include <cudnn.h>

#include <cmath>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "fsdp/error.h"

namespace fsdp::cuda {

namespace {

using cudnn::Dims;
using kernels::AttentionArgs;

// uids of the tensors bound at execution.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  kScale, kNegInf, kOne, kDelta, kDqAccum,
};

constexpr const char* kRemedy = "FSDP_ATTENTION=simt runs attention on the CUDA-core kernel instead";

constexpr size_t kAlign = 256;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// The [batch, heads, seq, head_dim] view of rows of width >= heads * head_dim, row stride ld.
Dims bhsd_strides(const AttentionArgs& a, int64_t ld) {
  return {a.seq * ld, a.head_dim, ld, 1};
}
// The same rows seen as [batch, heads, head_dim, seq] (K^T, V^T).
Dims bhds_strides(const AttentionArgs& a, int64_t ld) {
  return {a.seq * ld, a.head_dim, 1, ld};
}

std::string describe(const AttentionArgs& a, const char* pass) {
  return ::fsdp::detail::concat("causal attention ", pass, " (bf16, batch ", a.batch, ", seq ", a.seq,
                        ", heads ", a.heads, ", kv_heads ", a.kv_heads, ", head_dim ", a.head_dim,
                        ", row strides q ", a.ldq, " k ", a.ldk, " v ", a.ldv, " o ", a.ldo, ")");
}

struct Shapes {
  Dims q, kv, kt, scores, scores_t, rows;
  Dims score_strides, score_t_strides, row_strides, dense_q_strides;
};

Shapes shapes_of(const AttentionArgs& a) {
  const int64_t b = a.batch, hq = a.heads, hk = a.kv_heads, s = a.seq, d = a.head_dim;
  Shapes sh;
  sh.q = {b, hq, s, d};
  sh.kv = {b, hk, s, d};
  sh.kt = {b, hk, d, s};
  sh.scores = {b, hq, s, s};
  sh.scores_t = {b, hq, s, s};
  sh.rows = {b, hq, s, 1};
  sh.score_strides = {hq * s * s, s * s, s, 1};
  sh.score_t_strides = {hq * s * s, s * s, 1, s};
  sh.row_strides = {hq * s, s, 1, 1};
  sh.dense_q_strides = {hq * s * d, s * d, d, 1};
  return sh;
}

// Keeps scores where row >= col (causal, top-left aligned), -inf elsewhere.
cudnnBackendDescriptor_t causal_mask(cudnn::GraphBuilder& g, const Shapes& sh,
                                     cudnnBackendDescriptor_t scores,
                                     cudnnBackendDescriptor_t neg_inf) {
  auto row = g.virt(CUDNN_DATA_INT32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, row, nullptr, nullptr, CUDNN_DATA_FLOAT, 2);
  auto col = g.virt(CUDNN_DATA_INT32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, col, nullptr, nullptr, CUDNN_DATA_FLOAT, 3);
  auto keep = g.virt(CUDNN_DATA_BOOLEAN, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, nullptr, CUDNN_DATA_BOOLEAN);
  auto masked = g.virt(CUDNN_DATA_FLOAT, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, masked, neg_inf, keep);
  return masked;
}

std::unique_ptr<cudnn::Plan> build_forward(cudnnHandle_t handle, const AttentionArgs& a,
                                           cudnnBackendDescriptor_t device_prop = nullptr) {
  const Shapes sh = shapes_of(a);
  const auto bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  cudnn::GraphBuilder g;
  auto q = g.tensor(kQ, bf16, sh.q, bhsd_strides(a, a.ldq));
  auto kt = g.tensor(kK, bf16, sh.kt, bhds_strides(a, a.ldk));
  auto v = g.tensor(kV, bf16, sh.kv, bhsd_strides(a, a.ldv));
  auto o = g.tensor(kO, bf16, sh.q, bhsd_strides(a, a.ldo));
  auto stats = g.tensor(kStats, f32, sh.rows, sh.row_strides);
  auto scale = g.scalar(kScale, 1.0f / std::sqrt(static_cast<float>(a.head_dim)));
  auto neg_inf = g.scalar(kNegInf, -INFINITY);

  auto s = g.virt(f32, sh.scores, sh.score_strides);
  g.matmul(q, kt, s);
  auto scaled = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scaled, scale);
  auto masked = causal_mask(g, sh, scaled, neg_inf);
  auto row_max = g.virt(f32, sh.rows, sh.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  auto shifted = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, shifted, row_max);
  auto e = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, e);
  auto row_sum = g.virt(f32, sh.rows, sh.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  auto log_sum = g.virt(f32, sh.rows, sh.row_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, row_sum, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, row_max, stats, log_sum);
  auto p = g.virt(bf16, sh.scores, sh.score_strides);  // the second matmul reads P in bf16
  g.pointwise(CUDNN_POINTWISE_DIV, e, p, row_sum);
  g.matmul(p, v, o);
  return g.build(handle, describe(a, "forward"), kRemedy, device_prop);
}

std::unique_ptr<cudnn::Plan> build_backward(cudnnHandle_t handle, const AttentionArgs& a,
                                            cudnnBackendDescriptor_t device_prop = nullptr) {
  const Shapes sh = shapes_of(a);
  const auto bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const bool grouped = a.heads != a.kv_heads;
  cudnn::GraphBuilder g;
  auto q = g.tensor(kQ, bf16, sh.q, bhsd_strides(a, a.ldq));
  auto kt = g.tensor(kK, bf16, sh.kt, bhds_strides(a, a.ldk));
  auto vt = g.tensor(kV, bf16, sh.kt, bhds_strides(a, a.ldv));
  auto o = g.tensor(kO, bf16, sh.q, bhsd_strides(a, a.ldo));
  auto dout = g.tensor(kDO, bf16, sh.q, bhsd_strides(a, a.lddo));
  auto stats = g.tensor(kStats, f32, sh.rows, sh.row_strides);
  auto dq = g.tensor(kDQ, bf16, sh.q, bhsd_strides(a, a.ldq));
  auto dk = g.tensor(kDK, bf16, sh.kv, bhsd_strides(a, a.ldk));
  auto dv = g.tensor(kDV, bf16, sh.kv, bhsd_strides(a, a.ldv));
  auto delta = g.tensor(kDelta, f32, sh.rows, sh.row_strides);
  auto dq_accum = g.tensor(kDqAccum, f32, sh.q, sh.dense_q_strides);
  const float scale_value = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  auto scale = g.scalar(kScale, scale_value);
  auto neg_inf = g.scalar(kNegInf, -INFINITY);
  auto one = g.scalar(kOne, 1.0f);

  // delta = rowsum(dO * O)
  auto d_o = g.virt(f32, sh.q, {a.heads * a.seq * a.head_dim, a.seq * a.head_dim,
                                a.heads * a.head_dim, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, dout, d_o, o);
  auto d_o_sum = g.virt(f32, sh.rows, sh.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o, d_o_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, d_o_sum, delta, one);

  // P = exp(mask(Q K^T * scale - stats)); dV = P^T dO
  auto s = g.virt(f32, sh.scores, sh.score_strides);
  g.matmul(q, kt, s);
  auto scaled = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scaled, scale);
  auto shifted = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, shifted, stats);
  auto masked = causal_mask(g, sh, shifted, neg_inf);
  auto p = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, p);
  auto p_t = g.virt(bf16, sh.scores_t, sh.score_t_strides);
  g.reshape(p, p_t);
  if (grouped) {
    auto dv_heads = g.virt(bf16, sh.q, sh.dense_q_strides);
    g.matmul(p_t, dout, dv_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dv_heads, dv);
  } else {
    g.matmul(p_t, dout, dv);
  }

  // dS = P (dO V^T - delta) * scale; dK = dS^T Q; dQ = dS K
  auto dp = g.virt(f32, sh.scores, sh.score_strides);
  g.matmul(dout, vt, dp);
  auto dp_centered = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, dp_centered, delta);
  auto ds_unscaled = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centered, ds_unscaled, p);
  auto ds = g.virt(f32, sh.scores, sh.score_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, ds, scale);
  auto ds_t = g.virt(bf16, sh.scores_t, sh.score_t_strides);
  g.reshape(ds, ds_t);
  if (grouped) {
    auto dk_heads = g.virt(bf16, sh.q, sh.dense_q_strides);
    g.matmul(ds_t, q, dk_heads);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, dk_heads, dk);
  } else {
    g.matmul(ds_t, q, dk);
  }
  auto k = g.virt(bf16, sh.kv, bhsd_strides(a, a.ldk));
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  return g.build(handle, describe(a, "backward"), kRemedy, device_prop);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

CudnnAttention::CudnnAttention(cudaMemPool_t pool) : pool_(pool) {
  FSDP_CUDNN_CHECK(cudnnCreate(&handle_));
}

CudnnAttention::~CudnnAttention() {
  plans_.clear();  // the plans' descriptors before the handle they were built with
  if (handle_) (void)cudnnDestroy(handle_);
}

void CudnnAttention::check_supported(const AttentionArgs& a, const void* const* pointers,
                                     int count) {
  FSDP_CHECK(a.head_dim % 8 == 0 && a.head_dim <= 128,
             "cuDNN fused attention needs head_dim a multiple of 8 and at most 128, got ",
             a.head_dim, " (FSDP_ATTENTION=simt runs the CUDA-core kernel instead)");
  FSDP_CHECK(a.ldq % 8 == 0 && a.ldk % 8 == 0 && a.ldv % 8 == 0 && a.ldo % 8 == 0 &&
                 a.lddo % 8 == 0,
             "cuDNN fused attention needs row strides that are multiples of 8 elements, got q ",
             a.ldq, " k ", a.ldk, " v ", a.ldv, " o ", a.ldo, " dout ", a.lddo,
             " (FSDP_ATTENTION=simt runs the CUDA-core kernel instead)");
  for (int i = 0; i < count; ++i)
    FSDP_CHECK(aligned16(pointers[i]),
               "cuDNN fused attention needs 16-byte aligned tensors; argument ", i, " is not");
}

const cudnn::Plan& CudnnAttention::plan_for(bool backward, const AttentionArgs& a) {
  const Key key{backward, a.batch, a.seq, a.heads, a.kv_heads, a.head_dim,
                a.ldq,    a.ldk,   a.ldv, a.ldo,   backward ? a.lddo : 0};
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    auto plan = backward ? build_backward(handle_, a) : build_forward(handle_, a);
    it = plans_.emplace(key, std::move(plan)).first;
  }
  return *it->second;
}

void* CudnnAttention::scratch(cudaStream_t stream, size_t bytes) {
  void* p = nullptr;
  FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, pool_, stream));
  return p;
}

void CudnnAttention::forward(cudaStream_t stream, const AttentionArgs& a, const void* q,
                             const void* k, const void* v, void* out, float* lse) {
  const void* pointers[] = {q, k, v, out, lse};
  check_supported(a, pointers, 5);
  const cudnn::Plan& plan = plan_for(false, a);
  void* workspace = scratch(stream, static_cast<size_t>(plan.workspace_bytes));
  try {
    cudnn::execute(handle_, stream, plan,
                   {{kQ, const_cast<void*>(q)},
                    {kK, const_cast<void*>(k)},
                    {kV, const_cast<void*>(v)},
                    {kO, out},
                    {kStats, lse}},
                   workspace);
  } catch (...) {
    (void)cudaFreeAsync(workspace, stream);
    throw;
  }
  FSDP_CUDA_CHECK(cudaFreeAsync(workspace, stream));
}

void CudnnAttention::backward(cudaStream_t stream, const AttentionArgs& a, const void* q,
                              const void* k, const void* v, const void* out, const void* dout,
                              const float* lse, void* dq, void* dk, void* dv) {
  const void* pointers[] = {q, k, v, out, dout, lse, dq, dk, dv};
  check_supported(a, pointers, 9);
  const cudnn::Plan& plan = plan_for(true, a);
  const size_t delta_bytes = align_up(static_cast<size_t>(a.batch * a.heads * a.seq) * 4);
  const size_t accum_bytes =
      align_up(static_cast<size_t>(a.batch * a.heads * a.seq * a.head_dim) * 4);
  const size_t workspace_bytes = align_up(static_cast<size_t>(plan.workspace_bytes));
  auto* block = static_cast<char*>(scratch(stream, workspace_bytes + delta_bytes + accum_bytes));
  try {
    cudnn::execute(handle_, stream, plan,
                   {{kQ, const_cast<void*>(q)},
                    {kK, const_cast<void*>(k)},
                    {kV, const_cast<void*>(v)},
                    {kO, const_cast<void*>(out)},
                    {kDO, const_cast<void*>(dout)},
                    {kStats, const_cast<float*>(lse)},
                    {kDQ, dq},
                    {kDK, dk},
                    {kDV, dv},
                    {kDelta, block + workspace_bytes},
                    {kDqAccum, block + workspace_bytes + delta_bytes}},
                   block);
  } catch (...) {
    (void)cudaFreeAsync(block, stream);
    throw;
  }
  FSDP_CUDA_CHECK(cudaFreeAsync(block, stream));
}

}  // namespace fsdp::cuda
