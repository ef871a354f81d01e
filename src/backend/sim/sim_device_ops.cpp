// The simulated device's ops: each enqueues its cost (Note [Op costs]) and nothing else. The
// bytes a memory-bound kernel moves are what it reads plus what it writes, at the op's dtypes.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/sim/sim_device.h"
#include "fsdp/error.h"

namespace fsdp::sim {

namespace {

constexpr size_t kShadowMaxBytes = size_t{1} << 20;  // as sim_device.cpp keeps

double sz(DType t) { return static_cast<double>(dtype_size(t)); }
double d(int64_t n) { return static_cast<double>(n); }
int layout_of(bool trans_a, bool trans_b) { return (trans_a ? 2 : 0) | (trans_b ? 1 : 0); }
// The cost log's class of a GEMM: its layout (Note [Calibration file]).
const char* gemm_class(int layout) {
  static const char* names[4] = {"gemm_nn", "gemm_nt", "gemm_tn", "gemm_tt"};
  return names[layout & 3];
}
// The cost log's class of an attention call: its shape, which a calibration fit keys by.
std::string attention_class(bool backward, int64_t batch, int64_t seq, int64_t heads,
                            int64_t kv_heads, int64_t head_dim) {
  return detail::concat(backward ? "attention_backward" : "attention_forward", " b", batch, " s",
                        seq, " h", heads, " kv", kv_heads, " d", head_dim);
}

void check_dims(const char* op, std::initializer_list<int64_t> dims) {
  for (int64_t v : dims) FSDP_CHECK(v >= 0, op, ": negative size ", v);
}

double optimizer_bytes(const OptimTensor* tensors, int count, bool two_states) {
  FSDP_CHECK(count >= 0 && (count == 0 || tensors), "optimizer step: bad tensor array");
  double bytes = 0;
  for (int i = 0; i < count; ++i) {
    const OptimTensor& t = tensors[i];
    // param read + written (fp32), grad read, states read + written, the param copy written
    double per = 8 + sz(t.grad_dtype) + (two_states ? 16 : 8);
    if (t.param_copy) per += sz(t.param_copy_dtype);
    bytes += per * d(t.numel);
  }
  return bytes;
}

}  // namespace

// ---- copies

void SimDevice::copy(Stream s, void* dst, const void* src, size_t bytes) {
  if (const std::vector<char>* v = shadow_at(src, bytes))
    set_shadow(dst, std::vector<char>(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(bytes)));
  memory_op(s, "copy", 2.0 * d(static_cast<int64_t>(bytes)), OpKind::Copy);
}

void SimDevice::copy_from_host(Stream s, void* dst, const void* host_src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (dst && host_src), "copy_from_host of ", bytes, " bytes with a null pointer");
  const auto* first = static_cast<const char*>(host_src);
  set_shadow(dst, bytes <= kShadowMaxBytes ? std::vector<char>(first, first + bytes)
                                           : std::vector<char>{});
  const Calibration& c = calibration();
  timed(s, OpKind::Copy, "copy_from_host",
        std::max(c.kernel_min_us, static_cast<double>(bytes) / (c.host_copy_gbps * 1e3)),
        c.kernel_launch_us, static_cast<double>(bytes));
}

void SimDevice::copy_to_host(Stream s, void* host_dst, const void* src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (host_dst && src), "copy_to_host of ", bytes, " bytes with a null pointer");
  // Note [Simulated values]: written now, read by the host after it synchronizes.
  // A large buffer holds no values here; its host copy is left untouched, so host memory that
  // only offloaded state would fill is never paged in (Note [Host-side stream work]).
  bool probabilities = false;
  if (bytes) {
    if (const std::vector<char>* v = shadow_at(src, bytes))
      std::memcpy(host_dst, v->data(), bytes);
    else if (!(probabilities = synthesize_probabilities(host_dst, src, bytes)) &&
             bytes <= (size_t{1} << 20))
      std::memset(host_dst, 0, bytes);
  }
  read_by_host(src, probabilities);  // Note [Simulated host routing]
  const Calibration& c = calibration();
  timed(s, OpKind::Copy, "copy_to_host",
        std::max(c.kernel_min_us, static_cast<double>(bytes) / (c.host_copy_gbps * 1e3)),
        c.kernel_launch_us, static_cast<double>(bytes));
}

// Note [Host-side stream work]: a transfer over the host link, by its bytes; the host's
// bytes stay unread (large buffers keep no values here).
void SimDevice::copy_from_host_async(Stream s, void* dst, const void* host_src, size_t bytes) {
  FSDP_CHECK(bytes == 0 || (dst && host_src), "copy_from_host_async of ", bytes,
             " bytes with a null pointer");
  set_shadow(dst, {});
  const Calibration& c = calibration();
  timed(s, OpKind::Copy, "copy_from_host",
        std::max(c.kernel_min_us, static_cast<double>(bytes) / (c.host_copy_gbps * 1e3)),
        c.kernel_launch_us, static_cast<double>(bytes));
}

// A host task is not run (its memory holds nothing to compute on): it costs its bytes at the
// host's memory bandwidth, which a many-core host streams at about kHostMemoryGbps.
void SimDevice::run_host_task(Stream s, int64_t bytes, std::function<void()>) {
  FSDP_CHECK(bytes >= 0, "run_host_task: negative byte count ", bytes);
  constexpr double kHostMemoryGbps = 100;
  timed(s, OpKind::Optimizer, "host_task", static_cast<double>(bytes) / (kHostMemoryGbps * 1e3),
        0.0, static_cast<double>(bytes));
}

void SimDevice::fill(Stream s, void* dst, DType t, int64_t n, float value) {
  check_dims("fill", {n});
  // Zeros are a value the host may read back (a step's loss slot); anything else is not kept.
  const size_t bytes = static_cast<size_t>(n) * dtype_size(t);
  set_shadow(dst, value == 0.0f && bytes <= (size_t{1} << 20) ? std::vector<char>(bytes, 0)
                                                               : std::vector<char>{});
  memory_op(s, "fill", d(n) * sz(t));
}

void SimDevice::cast(Stream s, void*, DType dst_t, const void*, DType src_t, int64_t n) {
  check_dims("cast", {n});
  memory_op(s, "cast", d(n) * (sz(dst_t) + sz(src_t)));
}

void SimDevice::all_gather_copy_out(Stream s, const void*, DType t, int64_t shard_numel, int world,
                                    const ShardSlice* slices, void* const*, int count) {
  check_dims("all_gather_copy_out", {shard_numel, world, count});
  double elements = 0;
  for (int p = 0; p < count; ++p) elements += d(slices[p].rows) * d(slices[p].cols);
  memory_op(s, "all_gather_copy_out", 2.0 * elements * sz(t), OpKind::Copy);
}

void SimDevice::reduce_scatter_copy_in(Stream s, void*, DType rs_t, int64_t shard_numel, int world,
                                       const ShardSlice* slices, const void* const*,
                                       const DType* src_types, int count) {
  check_dims("reduce_scatter_copy_in", {shard_numel, world, count});
  double read = 0;
  for (int p = 0; p < count; ++p) read += d(slices[p].rows) * d(slices[p].cols) * sz(src_types[p]);
  memory_op(s, "reduce_scatter_copy_in", read + d(world) * d(shard_numel) * sz(rs_t), OpKind::Copy);
}

void SimDevice::accumulate(Stream s, float*, const void*, DType src_t, int64_t n, float) {
  check_dims("accumulate", {n});
  memory_op(s, "accumulate", d(n) * (8 + sz(src_t)));
}

// ---- optimizers

void SimDevice::adamw_step(Stream s, const OptimTensor* tensors, int count, const AdamWConfig&,
                           int64_t step) {
  FSDP_CHECK(step >= 1, "adamw_step needs a 1-based step count, got ", step);
  memory_op(s, "adamw_step", optimizer_bytes(tensors, count, true), OpKind::Optimizer);
}

void SimDevice::sgd_step(Stream s, const OptimTensor* tensors, int count, float, float momentum,
                         float) {
  memory_op(s, "sgd_step", optimizer_bytes(tensors, count, momentum != 0.0f), OpKind::Optimizer);
}

void SimDevice::adamw_step_scalars(Stream s, const OptimTensor* tensors, int count,
                                   const AdamWConfig&, const StepScalars*, GradSquares) {
  memory_op(s, "adamw_step", optimizer_bytes(tensors, count, true), OpKind::Optimizer);
}

void SimDevice::sgd_step_scalars(Stream s, const OptimTensor* tensors, int count, float momentum,
                                 float, const StepScalars*, GradSquares) {
  memory_op(s, "sgd_step", optimizer_bytes(tensors, count, momentum != 0.0f), OpKind::Optimizer);
}

void SimDevice::sum_squares(Stream s, const float* const*, const int64_t* numels, int count,
                            float*) {
  FSDP_CHECK(count >= 0 && (count == 0 || numels), "sum_squares: bad tensor array");
  double elements = 0;
  for (int i = 0; i < count; ++i) elements += d(numels[i]);
  memory_op(s, "sum_squares", 4.0 * elements);
}

// ---- compute

void SimDevice::gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float,
                     const void*, const void*, DType ab_t, float, void*, DType) {
  check_dims("gemm", {m, n, k});
  const Calibration& c = calibration();
  const int layout = layout_of(trans_a, trans_b);
  timed(s, OpKind::Kernel, gemm_class(layout), gemm_us(c, ab_t, m, n, k, layout),
        c.gemm_launch_us, 0, 2.0 * d(m) * d(n) * d(k));
}

void SimDevice::grouped_gemm(Stream s, bool trans_a, bool trans_b, const GemmGroup* groups,
                             int count, DType ab_t, DType) {
  FSDP_CHECK(count >= 0 && (count == 0 || groups), "grouped_gemm: bad group array");
  const Calibration& c = calibration();
  std::vector<GemmShape> shapes(static_cast<size_t>(count));
  double flops = 0;
  for (int i = 0; i < count; ++i) {
    const GemmGroup& g = groups[i];
    check_dims("grouped_gemm", {g.m, g.n, g.k});
    shapes[static_cast<size_t>(i)] = {g.m, g.n, g.k};
    if (g.m > 0 && g.n > 0) flops += 2.0 * d(g.m) * d(g.n) * d(g.k);
  }
  // One launch (Note [Op costs]).
  timed(s, OpKind::Kernel, "grouped_gemm",
        grouped_gemm_us(c, ab_t, shapes.data(), count, layout_of(trans_a, trans_b)),
        c.gemm_launch_us, 0, flops);
}

void SimDevice::gemm_relu(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          const void*, const void*, DType ab_t, void*, DType) {
  check_dims("gemm_relu", {m, n, k});
  const Calibration& c = calibration();
  const int layout = layout_of(trans_a, trans_b);
  timed(s, OpKind::Kernel, gemm_class(layout), gemm_us(c, ab_t, m, n, k, layout),
        c.gemm_launch_us, 0, 2.0 * d(m) * d(n) * d(k));
}

void SimDevice::activation_forward(Stream s, Activation, const void*, void*, DType t, int64_t n) {
  memory_op(s, "activation_forward", 2.0 * d(n) * sz(t));
}

void SimDevice::activation_backward(Stream s, Activation, const void*, const void*, void*, DType t,
                                    int64_t n) {
  memory_op(s, "activation_backward", 3.0 * d(n) * sz(t));
}

void SimDevice::add(Stream s, void*, const void*, const void*, DType t, int64_t n) {
  memory_op(s, "add", 3.0 * d(n) * sz(t));
}

void SimDevice::softmax_rows(Stream s, const void*, DType t, float* probs, int64_t rows,
                             int64_t cols) {
  check_dims("softmax_rows", {rows, cols});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    probabilities_[reinterpret_cast<uintptr_t>(probs)] = {rows, cols, softmax_calls_++};
  }
  memory_op(s, "softmax_rows", d(rows) * d(cols) * (sz(t) + 4));
}

void SimDevice::softmax_rows_backward(Stream s, const float*, const float*, void*, DType t,
                                      int64_t rows, int64_t cols) {
  memory_op(s, "softmax_rows_backward", d(rows) * d(cols) * (8 + sz(t)));
}

void SimDevice::scale_rows(Stream s, void*, const void*, DType t, const float*, int64_t,
                           int64_t rows, int64_t cols, bool accumulate) {
  memory_op(s, "scale_rows", d(rows) * d(cols) * sz(t) * (accumulate ? 3 : 2) + 4 * d(rows));
}

void SimDevice::row_dot(Stream s, const void*, const void*, DType t, float* out, int64_t,
                        int64_t rows, int64_t cols) {
  {  // Note [Simulated host routing]: the host may read these back and work on them.
    std::lock_guard<std::mutex> lock(mutex_);
    routing_grads_.insert(reinterpret_cast<uintptr_t>(out));
  }
  memory_op(s, "row_dot", 2.0 * d(rows) * d(cols) * sz(t) + 4 * d(rows));
}

void SimDevice::moe_route(Stream s, const MoeRouting& r) {
  check_dims("moe_route", {r.tokens, r.experts, r.top_k});
  memory_op(s, "moe_route", d(r.tokens) * d(r.experts) * 4 + d(r.tokens) * d(r.top_k) * 12 +
                                d(r.experts) * d(r.slots()) * 12);
}

void SimDevice::moe_route_backward(Stream s, const MoeRouting& r, const float*, float*) {
  memory_op(s, "moe_route_backward", 2.0 * d(r.tokens) * d(r.experts) * 4 + d(r.experts) * d(r.slots()) * 4);
}

void SimDevice::mean_square_loss(Stream s, const void*, DType t, int64_t n, float*, void*) {
  FSDP_CHECK(n > 0, "mean_square_loss over ", n, " elements");
  memory_op(s, "mean_square_loss", 2.0 * d(n) * sz(t));
}

void SimDevice::cross_entropy_loss(Stream s, const void*, DType t, const int32_t*, int64_t rows,
                                   int64_t classes, float*, void*) {
  FSDP_CHECK(rows > 0 && classes > 0, "cross_entropy_loss over ", rows, "x", classes, " logits");
  memory_op(s, "cross_entropy_loss", 2.0 * d(rows) * d(classes) * sz(t) + 4 * d(rows));
}

void SimDevice::synthetic_batch(Stream s, void*, DType t, int64_t rows, int64_t cols, uint64_t,
                                int64_t, int64_t, float) {
  memory_op(s, "synthetic_batch", d(rows) * d(cols) * sz(t));
}

void SimDevice::synthetic_labels(Stream s, int32_t*, int64_t rows, int64_t, uint64_t, int64_t,
                                 int64_t, float) {
  memory_op(s, "synthetic_labels", 4.0 * d(rows));
}

// ---- transformer ops

void SimDevice::embedding_forward(Stream s, const void*, DType t, const int32_t*, int64_t rows,
                                  int64_t dim, void*) {
  memory_op(s, "embedding_forward", 2.0 * d(rows) * d(dim) * sz(t) + 4 * d(rows));
}

void SimDevice::embedding_backward(Stream s, const void*, DType t, const int32_t*, int64_t rows,
                                   int64_t dim, int64_t vocab, void*) {
  memory_op(s, "embedding_backward", (d(rows) + d(vocab)) * d(dim) * sz(t) + 4 * d(rows));
}

void SimDevice::rms_norm_forward(Stream s, const void*, const void*, DType t, int64_t rows,
                                 int64_t cols, float, void*, float*, float*) {
  memory_op(s, "rms_norm_forward", 2.0 * d(rows) * d(cols) * sz(t) + 4 * d(rows));
}

void SimDevice::rms_norm_backward(Stream s, const void*, const void*, const float*, const void*,
                                  DType t, int64_t rows, int64_t cols, void*, void*, float*) {
  memory_op(s, "rms_norm_backward", 3.0 * d(rows) * d(cols) * sz(t) + 4 * d(rows));
}

void SimDevice::add_rms_norm_forward(Stream s, const void*, const void*, const void*, DType t,
                                     int64_t rows, int64_t cols, float, void*, void*, float*,
                                     float*) {
  memory_op(s, "add_rms_norm_forward", 4.0 * d(rows) * d(cols) * sz(t) + 4 * d(rows));
}

void SimDevice::rms_norm_backward_add(Stream s, const void*, const void*, const float*,
                                      const void*, const void*, DType t, int64_t rows,
                                      int64_t cols, void*, void*, float*) {
  memory_op(s, "rms_norm_backward_add", 4.0 * d(rows) * d(cols) * sz(t) + 4 * d(rows));
}

void SimDevice::rope(Stream s, void*, int64_t, DType t, int64_t rows, int64_t heads,
                     int64_t head_dim, int64_t, const float*, bool) {
  memory_op(s, "rope", 2.0 * d(rows) * d(heads) * d(head_dim) * sz(t));
}

void SimDevice::rope_at(Stream s, void*, int64_t, DType t, int64_t rows, int64_t heads,
                        int64_t head_dim, int64_t, const float*) {
  memory_op(s, "rope_at", 2.0 * d(rows) * d(heads) * d(head_dim) * sz(t));
}

// Note [KV cache]: a decode step is bound by reading the cache, so it is costed as the memory
// it moves: the new rows written, every cached key and value read once per kv head's group,
// the queries read and the output written.
void SimDevice::attention_kv_cache(Stream s, const void*, int64_t, const void*, int64_t,
                                   const void*, int64_t, DType t, int64_t rows, int64_t position,
                                   int64_t, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                   void*, void*, void*, int64_t) {
  check_dims("attention_kv_cache", {rows, heads, kv_heads, head_dim});
  const double kv_width = d(kv_heads) * d(head_dim);
  memory_op(s, "attention_kv_cache",
            (4.0 * d(rows) * kv_width + 2.0 * d(position + rows) * kv_width +
             2.0 * d(rows) * d(heads) * d(head_dim)) * sz(t));
}

void SimDevice::attention_forward(Stream s, const void*, int64_t, const void*, int64_t,
                                  const void*, int64_t, DType, int64_t batch, int64_t seq,
                                  int64_t heads, int64_t kv_heads, int64_t head_dim, void*,
                                  int64_t, float*) {
  check_dims("attention_forward", {batch, seq, heads, kv_heads, head_dim});
  const Calibration& c = calibration();
  timed(s, OpKind::Kernel,
        attention_class(false, batch, seq, heads, kv_heads, head_dim).c_str(),
        attention_us(c, false, batch, seq, heads, kv_heads, head_dim), c.kernel_launch_us, 0,
        attention_flops(false, batch, seq, heads, head_dim));
}

void SimDevice::attention_backward(Stream s, const void*, int64_t, const void*, int64_t,
                                   const void*, int64_t, const void*, int64_t, const void*,
                                   int64_t, const float*, DType, int64_t batch, int64_t seq,
                                   int64_t heads, int64_t kv_heads, int64_t head_dim, void*, void*,
                                   void*) {
  check_dims("attention_backward", {batch, seq, heads, kv_heads, head_dim});
  const Calibration& c = calibration();
  timed(s, OpKind::Kernel,
        attention_class(true, batch, seq, heads, kv_heads, head_dim).c_str(),
        attention_us(c, true, batch, seq, heads, kv_heads, head_dim), c.kernel_launch_us, 0,
        attention_flops(true, batch, seq, heads, head_dim));
}

// Note [Fused amax]: the amax is taken from the values in registers, no bytes more.
void SimDevice::swiglu_forward(Stream s, const void*, DType t, int64_t rows, int64_t ffn, void*,
                               float*) {
  memory_op(s, "swiglu_forward", 3.0 * d(rows) * d(ffn) * sz(t));
}

void SimDevice::swiglu_backward(Stream s, const void*, const void*, DType t, int64_t rows,
                                int64_t ffn, void*, float*) {
  memory_op(s, "swiglu_backward", 5.0 * d(rows) * d(ffn) * sz(t));
}

void SimDevice::spin(Stream s, double microseconds) {
  // Tests force op durations with it: exactly that long, no launch cost.
  timed(s, OpKind::Kernel, "spin", microseconds, 0, 0, 0, /*alone=*/true);
}

}  // namespace fsdp::sim
