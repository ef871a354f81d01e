// The Device interface: everything the engine asks of one accelerator (or of one CPU rank
// pretending to be one). Two backends implement it: src/backend/cpu and src/backend/cuda.
//
// Note [Stream semantics]
// Every operation that takes a Stream is *enqueued*: the call returns at once and the work
// runs later, in issue order with the other work of that stream. Streams run concurrently
// with each other. The only cross-stream ordering is record_event + wait_event, with CUDA's
// meaning: wait_event(s, e) makes s wait for the most recent record_event(e, ...) issued
// before the wait_event call (a wait on a never-recorded event is a no-op).
//
// Note [Stream-ordered memory]
// alloc(bytes, s) returns memory usable by work enqueued on s after the call; free(p, s)
// returns it once the work enqueued on s before the call has run. Freeing on a stream other
// than the one that last used the memory is only safe after that stream waited on an event
// recorded after the last use; the engine's schedule guarantees this (docs/design.md,
// invariant 2). Byte counts (current/peak, per tag) change when alloc/free are *called*,
// so they are exact and independent of timing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/dtype.h"
#include "fsdp/fp8.h"

namespace fsdp {

struct Stream {
  int id = -1;
  bool valid() const { return id >= 0; }
  friend bool operator==(Stream a, Stream b) { return a.id == b.id; }
};

struct Event {
  int id = -1;
  bool valid() const { return id >= 0; }
};

enum class StreamPriority : uint8_t { Normal, High };

// What an allocation is for; the allocator keeps per-tag counts so tests and the summary can
// state exactly how many RS input buffers were alive at once.
enum class MemTag : uint8_t {
  Other,
  ShardedState,  // fp32 shards, grad shards, optimizer state
  AllGather,     // all-gather outputs (unsharded params in param dtype, or staging)
  Unsharded,     // copied-out unsharded params (when a view of the AG output cannot serve)
  Grad,          // unsharded grads produced by backward
  GradAccum,     // unsharded fp32 grads kept across no-sync micro-batches
  RsInput,       // reduce-scatter inputs: the ring's buffers
  RsOutput,      // reduce-scatter outputs, before accumulation into the grad shard
  Activation,    // activations and their grads
  PostForward,   // reshard_after_forward=int: the post-forward shards kept for backward
  Count
};
constexpr int kMemTagCount = static_cast<int>(MemTag::Count);
const char* mem_tag_name(MemTag tag);

struct MemStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t tag_bytes[kMemTagCount] = {};
  int64_t tag_peak_bytes[kMemTagCount] = {};
  int64_t tag_live[kMemTagCount] = {};       // live allocations with that tag
  int64_t tag_peak_live[kMemTagCount] = {};  // most live allocations with that tag at once
};

enum class Activation : uint8_t { ReLU, GELU };

// One parameter's place in its param group's flat shard. See Note [Shard layout] in
// src/core/shard_layout.h.
struct ShardSlice {
  int64_t rows = 0;           // dim-0 size of the unsharded parameter
  int64_t cols = 0;           // product of the other dims (1 for vectors)
  int64_t rows_per_rank = 0;  // ceil(rows / world)
  int64_t offset = 0;         // element offset of this parameter in the group's flat shard
};

// One tensor for the multi-tensor optimizers (all fp32, same numel for the four arrays).
struct OptimTensor {
  float* param = nullptr;
  const void* grad = nullptr;  // grad_dtype elements: fp32, or bf16 straight from a reduce-scatter
  float* state0 = nullptr;  // AdamW: exp_avg; SGD: momentum buffer
  float* state1 = nullptr;  // AdamW: exp_avg_sq; SGD: unused
  int64_t numel = 0;
  DType grad_dtype = DType::F32;
  // Optional: the updated param is also written here, rounded to param_copy_dtype (Note
  // [Optimizer in forward] in fsdp/fsdp.h: straight into an all-gather's input, so the step
  // replaces the all-gather's copy-in instead of adding a pass over the shard).
  void* param_copy = nullptr;
  DType param_copy_dtype = DType::F32;
};

struct AdamWConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
};

// Note [Step scalars]
// What an optimizer step needs that changes from step to step lives in device memory: the host
// writes a StepScalars with copy_from_host (no synchronization) before the step, and the
// kernels read it when they run. A captured step can then be replayed without re-recording.
// Clipping by the global gradient norm happens inside the same kernels: every grad is scaled
// by clip_coef = min(1, max_grad_norm / (norm + 1e-6)) (PyTorch's clip_grad_norm_), where
// norm = sqrt(sum of grad_sq[0..grad_sq_count)): the per-group sums of squares that
// Device::sum_squares wrote and each mesh all-reduced.
struct StepScalars {
  float lr = 0;
  float bias_correction1 = 1;       // AdamW: 1 - beta1^step
  float bias_correction2_sqrt = 1;  // AdamW: sqrt(1 - beta2^step)
  float max_grad_norm = 0;          // <= 0: no clipping
};
struct GradSquares {
  const float* sums = nullptr;  // device memory, fp32
  int count = 0;
};

// ---- Timeline (Note [Timeline] in src/runtime/trace_metrics.h) -------------------------------
enum class OpKind : uint8_t { Kernel, Copy, Collective, Wait, Optimizer, Host };
struct TimelineOp {
  std::string label;         // e.g. "AG layers.3", "fwd layers.3 gemm"
  int stream = -1;           // Stream::id, or -1 for the host track
  OpKind kind = OpKind::Kernel;
  double start_us = 0, end_us = 0;
  std::string waited_for;    // Wait ops: label of the op the waited-on event followed
};
struct MemSample {
  double time_us = 0;
  int64_t bytes = 0;
};
struct Timeline {
  std::vector<std::string> stream_names;  // indexed by Stream::id
  std::vector<TimelineOp> ops;
  std::vector<MemSample> memory;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;  // "cpu:3", "cuda:0"
  // False on the simulation backend, whose memory holds nothing and whose ops compute
  // nothing (Note [Simulation backend] in src/backend/sim/sim_device.cpp): the engine then
  // makes no host values for it (initial weights), since none would reach the device.
  virtual bool computes_values() const { return true; }

  // ---- streams and events
  virtual Stream create_stream(const std::string& name, StreamPriority priority) = 0;
  virtual Event create_event() = 0;
  virtual void destroy_event(Event e) = 0;
  virtual void record_event(Event e, Stream s) = 0;
  virtual void wait_event(Stream s, Event e) = 0;
  virtual bool query_event(Event e) = 0;
  virtual void synchronize_event(Event e) = 0;
  virtual void synchronize_stream(Stream s) = 0;
  virtual void synchronize() = 0;  // every stream; rethrows an error raised by enqueued work
  // Waits until every stream has run, or skipped after an error, all the work queued on it.
  // For destructors (Note [Draining before freeing host memory]): an abort ends synchronize()'s
  // wait, not the queued work, which may still write host memory the destructor frees next.
  // Errors are left to synchronize() to report.
  virtual void wait_until_drained() noexcept;

  // ---- memory (Note [Stream-ordered memory])
  virtual void* alloc(size_t bytes, Stream s, MemTag tag) = 0;
  virtual void free(void* ptr, Stream s) = 0;
  virtual MemStats memory_stats() const = 0;
  virtual void reset_peak_memory() = 0;
  // Host memory that copy_to_host fills without blocking the host (page-locked on CUDA, where
  // a copy into pageable memory returns only once it is done). Not counted in MemStats.
  virtual void* alloc_host(size_t bytes) = 0;
  virtual void free_host(void* ptr) = 0;

  // ---- copies. The host source of copy_from_host may be reused once the call returns; the
  // host destination of copy_to_host is valid after the stream is synchronized.
  virtual void copy(Stream s, void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(Stream s, void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy_to_host(Stream s, void* host_dst, const void* src, size_t bytes) = 0;
  // Note [Host-side stream work]
  // For the optimizer offload (fsdp/optim_offload.h), whose host memory the device copies from
  // and the host computes on, ordered by events like any stream work:
  // copy_from_host_async reads host_src when the stream reaches the copy, not when it is
  // called (unlike copy_from_host): host_src must be alloc_host memory that stays alive and
  // unwritten by anyone else until then. run_host_task runs `task` on the host when the
  // stream reaches it; the stream's later work follows its end; an exception it throws is the
  // device's error (synchronize rethrows it). `bytes` is the memory the task reads and
  // writes: what a device that computes nothing times it by (the simulation backend, which
  // does not run it). Neither may be captured in a graph. The defaults raise "not
  // implemented on this backend".
  virtual void copy_from_host_async(Stream s, void* dst, const void* host_src, size_t bytes);
  virtual void run_host_task(Stream s, int64_t bytes, std::function<void()> task);
  virtual void fill(Stream s, void* dst, DType t, int64_t n, float value) = 0;
  virtual void cast(Stream s, void* dst, DType dst_t, const void* src, DType src_t, int64_t n) = 0;

  // ---- FSDP's fused copies (Note [Shard layout])
  // Unsharded param p, row i < rows, comes from rank i / rows_per_rank of `gathered`.
  virtual void all_gather_copy_out(Stream s, const void* gathered, DType t, int64_t shard_numel,
                                   int world, const ShardSlice* slices, void* const* dsts,
                                   int count) = 0;
  // Pads every grad to world * rows_per_rank rows, interleaves the per-rank chunks, casts to
  // rs_t: rs_in is [world][shard_numel]. One launch for the whole group.
  virtual void reduce_scatter_copy_in(Stream s, void* rs_in, DType rs_t, int64_t shard_numel,
                                      int world, const ShardSlice* slices,
                                      const void* const* srcs, const DType* src_types,
                                      int count) = 0;
  // dst (fp32) += scale * src
  virtual void accumulate(Stream s, float* dst, const void* src, DType src_t, int64_t n,
                          float scale) = 0;

  // ---- optimizers over many shards in one launch
  virtual void adamw_step(Stream s, const OptimTensor* tensors, int count, const AdamWConfig& c,
                          int64_t step) = 0;
  virtual void sgd_step(Stream s, const OptimTensor* tensors, int count, float lr, float momentum,
                        float weight_decay) = 0;
  // The same steps with lr, bias corrections and clipping read from device memory when the
  // kernel runs (Note [Step scalars]); c.lr is not used.
  virtual void adamw_step_scalars(Stream s, const OptimTensor* tensors, int count,
                                  const AdamWConfig& c, const StepScalars* scalars,
                                  GradSquares grad_sq) = 0;
  virtual void sgd_step_scalars(Stream s, const OptimTensor* tensors, int count, float momentum,
                                float weight_decay, const StepScalars* scalars,
                                GradSquares grad_sq) = 0;
  // out[i] = sum of x[j]^2 over tensor i (fp32 in, fp32 out, accumulated in fp32 or wider):
  // every tensor in one launch. For the global gradient norm.
  virtual void sum_squares(Stream s, const float* const* tensors, const int64_t* numels,
                           int count, float* out) = 0;

  // ---- compute. Row-major. C[m,n] = alpha * op(A) op(B) + beta * C, where op(A) is [m,k]
  // (A stored [k,m] when trans_a) and op(B) is [k,n] (B stored [n,k] when trans_b).
  // A and B share ab_t; accumulation is fp32; C is c_t.
  virtual void gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const void* a, const void* b, DType ab_t, float beta, void* c,
                    DType c_t) = 0;
  // Note [Grouped GEMM]
  // `count` independent GEMMs in one call, each C_i = op(A_i) op(B_i) (alpha 1, beta 0) with
  // the gemm contract above and its own m, n, k; trans flags and dtypes are shared. A group
  // with m or n 0 does nothing; one with k 0 writes zeros. The MoE layer runs all its local
  // experts with it (one launch on CUDA: cuBLAS grouped-batched GEMM); the default loops
  // over gemm(), which is what the CPU backend uses.
  struct GemmGroup {
    int64_t m = 0, n = 0, k = 0;
    const void* a = nullptr;
    const void* b = nullptr;
    void* c = nullptr;
  };
  virtual void grouped_gemm(Stream s, bool trans_a, bool trans_b, const GemmGroup* groups,
                            int count, DType ab_t, DType c_t);
  // C = relu(op(A) op(B)), fused into the GEMM's epilogue where the backend can.
  virtual void gemm_relu(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         const void* a, const void* b, DType ab_t, void* c, DType c_t) = 0;
  virtual void activation_forward(Stream s, Activation f, const void* x, void* y, DType t,
                                  int64_t n) = 0;
  virtual void activation_backward(Stream s, Activation f, const void* x, const void* dy,
                                   void* dx, DType t, int64_t n) = 0;
  virtual void add(Stream s, void* out, const void* a, const void* b, DType t, int64_t n) = 0;
  // Router helpers for the MoE block (probabilities are fp32).
  virtual void softmax_rows(Stream s, const void* x, DType t, float* probs, int64_t rows,
                            int64_t cols) = 0;
  // dx = p * (dp - sum_j p_j dp_j), row by row
  virtual void softmax_rows_backward(Stream s, const float* probs, const float* dprobs, void* dx,
                                     DType t, int64_t rows, int64_t cols) = 0;
  // out[r,:] (+)= w[r * w_stride] * in[r,:]
  virtual void scale_rows(Stream s, void* out, const void* in, DType t, const float* w,
                          int64_t w_stride, int64_t rows, int64_t cols, bool accumulate) = 0;
  // out[r * out_stride] = sum_c a[r,c] * b[r,c]
  virtual void row_dot(Stream s, const void* a, const void* b, DType t, float* out,
                       int64_t out_stride, int64_t rows, int64_t cols) = 0;
  // Note [Device MoE routing]
  // The capacity-factor routing of an MoE layer (Note [MoE routing] in include/fsdp/nn/moe.h)
  // on the device, so that a step needs no host read and can be captured in a graph. It gives
  // exactly what the host's route_tokens + ExpertDispatcher::plan give with a capacity: per
  // assignment a = t * K + k the top-k expert (higher probability first, the lower expert on
  // ties), its renormalized weight (p / the sum of the token's top-k p, summed in k order)
  // and its row in send order (-1: over capacity); the send order itself, expert-major
  // [experts][slots] with slots = capacity * groups, each expert's kept assignments in
  // assignment order, then padding; each group's aux-loss gradient and the layer's aux loss
  // and max load (double sums in token order, as the host's). All buffers are on the device.
  // The defaults raise "not implemented on this backend".
  struct MoeRouting {
    const float* probs = nullptr;  // [tokens, experts], rows sum to 1
    int64_t tokens = 0;
    int experts = 0, top_k = 0;
    int64_t group_tokens = 0;  // tokens route in groups of this many (tokens % group == 0)
    int64_t capacity = 0;      // assignments kept per expert per group (>= 1)
    float aux_loss_weight = 0;
    int32_t* chosen = nullptr;           // [tokens * top_k]: the top-k expert, kept or not
    float* weight = nullptr;             // [tokens * top_k]
    int32_t* slot = nullptr;             // [tokens * top_k]: row in send order; -1: dropped
    int32_t* send_assignment = nullptr;  // [experts * slots]: the row's assignment; -1: padding
    int32_t* send_token = nullptr;       // [experts * slots]: its token; padding: `tokens`
    float* send_weight = nullptr;        // [experts * slots]: its weight; padding: 0
    float* aux_grad = nullptr;           // [groups * experts]: d(aux loss)/d(probs[t, e])
                                         // for the tokens t of group g (row g)
    float* stats = nullptr;              // [2]: aux loss (weight included), max load
    constexpr int64_t groups() const { return group_tokens > 0 ? tokens / group_tokens : 0; }
    constexpr int64_t slots() const { return capacity * groups(); }
  };
  virtual void moe_route(Stream s, const MoeRouting& r);
  // The router's gradient through the weights and the aux loss, for the routing `r` (its
  // outputs as moe_route wrote them): with dw_a = dsend_weight[slot[a]] (0 when dropped),
  // dprobs[t, e] = aux_grad[t / group, e], plus, for each of the token's top-k e = chosen[a],
  // (dw_a - sum_k dw_k w_k) / (sum_k probs[t, chosen_k]). Sums in k order, no fused multiply-add.
  virtual void moe_route_backward(Stream s, const MoeRouting& r, const float* dsend_weight,
                                  float* dprobs);
  // Losses write the scalar loss (fp32, device memory) and the gradient of the loss.
  // mean of squares: loss = sum(y^2) / n, dy = 2 y / n
  virtual void mean_square_loss(Stream s, const void* y, DType t, int64_t n, float* loss,
                                void* dy) = 0;
  // cross-entropy averaged over rows; dlogits = (softmax - onehot) / rows
  virtual void cross_entropy_loss(Stream s, const void* logits, DType t, const int32_t* labels,
                                  int64_t rows, int64_t classes, float* loss, void* dlogits) = 0;
  // Training data made on the device (include/fsdp/synthetic.h): row r of dst is row
  // first_row + r of the global batch of `step`, Uniform(-bound, bound), in dtype t.
  virtual void synthetic_batch(Stream s, void* dst, DType t, int64_t rows, int64_t cols,
                               uint64_t seed, int64_t step, int64_t first_row, float bound) = 0;
  // The labels of those rows: labels[r] = synthetic_label(row seed, width, bound), int32. Made
  // on the device so that a step's batch costs the host nothing per row.
  virtual void synthetic_labels(Stream s, int32_t* labels, int64_t rows, int64_t width,
                                uint64_t seed, int64_t step, int64_t first_row, float bound) = 0;
  // ---- transformer ops (Note [Transformer ops]). Row-major; activations are [tokens, width]
  // in dtype t with a row stride `ld` in elements (so q, k and v can be column slices of one
  // fused QKV GEMM output); math in fp32. The defaults raise "not implemented on this backend".
  //
  // out[r,:] = table[ids[r], :]; table is [vocab, dim].
  virtual void embedding_forward(Stream s, const void* table, DType t, const int32_t* ids,
                                 int64_t rows, int64_t dim, void* out);
  // dtable[v,:] = sum of dy[r,:] over the rows r with ids[r] == v (overwrites all of dtable,
  // rows never seen become 0); summed in fp32 in row order, so the result is deterministic.
  virtual void embedding_backward(Stream s, const void* dy, DType t, const int32_t* ids,
                                  int64_t rows, int64_t dim, int64_t vocab, void* dtable);
  // y = x * rstd * w, rstd[r] = 1 / sqrt(mean_c x[r,c]^2 + eps); w is [cols]; rstd is kept
  // (fp32, [rows]) for the backward. amax, when not null: max |y| as stored (Note [Fused
  // amax], as swiglu_forward's).
  virtual void rms_norm_forward(Stream s, const void* x, const void* w, DType t, int64_t rows,
                                int64_t cols, float eps, void* y, float* rstd, float* amax);
  // Overwrites dx [rows, cols] and dw [cols] (dtype t; dw summed over rows in fp32); amax, when
  // not null, max |dx| as stored.
  virtual void rms_norm_backward(Stream s, const void* x, const void* w, const float* rstd,
                                 const void* dy, DType t, int64_t rows, int64_t cols, void* dx,
                                 void* dw, float* amax);
  // The residual add fused with the RMSNorm that reads its result: h = x + residual (rounded to
  // t, as add() would), then rms_norm_forward of h (amax: of y). h may be x or residual.
  virtual void add_rms_norm_forward(Stream s, const void* x, const void* residual, const void* w,
                                    DType t, int64_t rows, int64_t cols, float eps, void* h,
                                    void* y, float* rstd, float* amax);
  // rms_norm_backward whose input gradient also takes the residual path's: dx = dresidual +
  // d(norm)/dx, summed in fp32 and rounded once (amax: of dx). dx may be dy or dresidual.
  virtual void rms_norm_backward_add(Stream s, const void* x, const void* w, const float* rstd,
                                     const void* dy, const void* dresidual, DType t, int64_t rows,
                                     int64_t cols, void* dx, void* dw, float* amax);
  // Rotary position embedding in place on x [rows, heads * head_dim] (row stride ld), with
  // Hugging Face Llama's "rotate half" pairing: element i < head_dim/2 pairs with
  // i + head_dim/2, angle = pos * inv_freq[i] (fp32), pos = r % seq_len. inv_freq is host
  // memory of head_dim/2 floats, read before the call returns (nn::rope_inv_freq makes it
  // from theta and a scaling). inverse rotates by -angle (the backward).
  virtual void rope(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
                    int64_t head_dim, int64_t seq_len, const float* inv_freq, bool inverse);
  // Causal scaled-dot-product attention, scale 1/sqrt(head_dim), grouped-query: query head h
  // reads kv head h / (heads / kv_heads). Token r = b * seq + i. q and out are
  // [batch*seq, heads*head_dim], k and v [batch*seq, kv_heads*head_dim], each with its row
  // stride. lse [batch, heads, seq] (fp32) = log-sum-exp of the scaled scores, for backward.
  virtual void attention_forward(Stream s, const void* q, int64_t ldq, const void* k,
                                 int64_t ldk, const void* v, int64_t ldv, DType t, int64_t batch,
                                 int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                 void* out, int64_t ldo, float* lse);
  // Overwrites dq, dk, dv (strides as q, k, v); dk and dv sum over the query heads sharing them.
  virtual void attention_backward(Stream s, const void* q, int64_t ldq, const void* k,
                                  int64_t ldk, const void* v, int64_t ldv, const void* out,
                                  int64_t ldo, const void* dout, int64_t lddo, const float* lse,
                                  DType t, int64_t batch, int64_t seq, int64_t heads,
                                  int64_t kv_heads, int64_t head_dim, void* dq, void* dk,
                                  void* dv);
  // Note [KV cache]
  // Text generation runs one sequence a few tokens at a time: each call's new rows are at
  // positions [position, position + rows) of the sequence, and their keys and values join a
  // cache of the earlier ones, so a new token costs one row's work, not the whole sequence's.
  // Two ops serve it, forward only:
  // rope_at: rope() of consecutive positions first_position + r (r < rows): the same angle,
  // in the same fp32 operations, as rope() gives the token at that position.
  virtual void rope_at(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
                       int64_t head_dim, int64_t first_position, const float* inv_freq);
  // attention_kv_cache: writes the new rows' keys k and values v (each [rows, kv_heads *
  // head_dim], with its row stride) into rows [position, position + rows) of the dense caches
  // k_cache and v_cache ([capacity, kv_heads * head_dim], dtype t), then computes
  // attention_forward's causal grouped-query attention for the new queries q: query row i, at
  // position position + i, attends to the cached keys and values [0, position + i]. No lse
  // (there is no backward). position + rows <= capacity.
  virtual void attention_kv_cache(Stream s, const void* q, int64_t ldq, const void* k,
                                  int64_t ldk, const void* v, int64_t ldv, DType t, int64_t rows,
                                  int64_t position, int64_t capacity, int64_t heads,
                                  int64_t kv_heads, int64_t head_dim, void* k_cache,
                                  void* v_cache, void* out, int64_t ldo);
  // SwiGLU on h = [rows, 2*ffn] (gate columns, then up columns): out = silu(gate) * up.
  // Note [Fused amax]: amax, when not null, receives max |out| over the whole output as stored
  // (rounded to t): what fp8_amax(out, Fp8Axis::Tensor) would give, NaN included, without a
  // second pass over it. The fp8 GEMM that reads out takes its scale from it.
  virtual void swiglu_forward(Stream s, const void* h, DType t, int64_t rows, int64_t ffn,
                              void* out, float* amax);
  // Overwrites dh [rows, 2*ffn] from h and dout [rows, ffn]; amax as swiglu_forward's, of dh.
  virtual void swiglu_backward(Stream s, const void* h, const void* dout, DType t, int64_t rows,
                               int64_t ffn, void* dh, float* amax);

  // ---- fp8 (docs/fp8.md). x is [rows, cols] in dtype t; amaxes and inverse scales are fp32
  // device memory, one per tensor, per row or per column (Fp8Axis), so a step reads none of
  // them on the host. The defaults raise "not implemented on this backend".
  enum class Fp8Axis : uint8_t { Tensor, Rows, Cols };
  // amax[i] = max |x| over the whole tensor (i = 0), row i or column i. NaN propagates.
  virtual void fp8_amax(Stream s, const void* x, DType t, int64_t rows, int64_t cols,
                        Fp8Axis axis, float* amax);
  // q = float_to_fp8(v * scale, f) with v = x rounded to value_t (the values x has in that
  // dtype: bf16 for a weight cast from its fp32 master shard) and, per amax entry,
  // scale = fp8_scale_of(amax rounded to value_t) (Note [Fp8 scale] in fsdp/fp8.h);
  // scale_inv[i] = 1 / scale (null: not written). q_t, when not null, receives the same codes
  // transposed ([cols, rows]), in the same pass: the layout in which a GEMM that reads x
  // transposed takes it (the weight gradient's dY^T and X). q may be null when q_t is not.
  virtual void fp8_cast(Stream s, const void* x, DType t, DType value_t, int64_t rows,
                        int64_t cols, Fp8Axis axis, const float* amax, Fp8Format f, uint8_t* q,
                        uint8_t* q_t, float* scale_inv);
  // C[m,n] = (sum_k op(A)[m,k] op(B)[k,n]) * a_scale_inv[i] * b_scale_inv[j], the products
  // of the fp8 codes' values accumulated in fp32 (the gemm contract's layouts), rounded to c_t.
  // Tensorwise: i = j = 0. rowwise: i = m's row of op(A), j = n's column of op(B) (outer
  // vector scales). A and B may not both be E5M2 (cuBLASLt has no such kernel). Each
  // operand's inverse scales start at a multiple of 16 bytes (Note [Fp8 scales 16-byte
  // aligned] in fsdp/fp8.h: cuBLASLt refuses others).
  struct Fp8Operand {
    const uint8_t* data = nullptr;
    Fp8Format format = Fp8Format::E4M3;
    const float* scale_inv = nullptr;
  };
  virtual void fp8_gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                        Fp8Operand a, Fp8Operand b, bool rowwise, void* c, DType c_t);
  // fp8_gemm's checks, one line each, for every backend to make first.
  static void check_fp8_gemm(int64_t m, int64_t n, int64_t k, const Fp8Operand& a,
                             const Fp8Operand& b, const void* c);

  // Busy work of a known length; tests use it to force op durations.
  virtual void spin(Stream s, double microseconds) = 0;

  // ---- CUDA graphs (Note [Captured steps] in src/runtime/captured_step.h; docs/cuda_graphs.md).
  // begin_capture waits for every stream, then records (instead of running) the work enqueued
  // on `s` and on every stream that waits on an event recorded after it; end_capture turns the
  // record into a graph and returns its id; replay enqueues one run of it on `s`. Under
  // capture, memory allocated and freed inside the capture comes from the graph's own memory,
  // copy_from_host snapshots the host bytes at capture time, and anything that makes the host
  // wait for the device raises a UserError. The defaults raise a UserError: the backend has no
  // graphs.
  virtual void begin_capture(Stream s);
  virtual int end_capture(Stream s);
  // Ends a capture that failed half-way, dropping what it recorded; never throws.
  virtual void abort_capture(Stream s) noexcept;
  virtual void replay(int graph, Stream s);
  // Releases a graph (after its last replay has run). Before the communicators whose
  // collectives it holds go: their resources are tied to it.
  virtual void destroy_graph(int graph);
  virtual bool capturing() const { return false; }
  // The names of the streams whose work a graph holds, in first-use order.
  virtual std::vector<std::string> graph_streams(int graph) const;
  // Whether replays of a graph put each of its ops on the timeline (it was captured with the
  // timeline on, and the backend can time ops inside a graph); else a replay is one op.
  virtual bool graph_has_op_times(int) const { return false; }
  // The backend's own view of its peak device memory since reset_peak_memory: its allocator's
  // high-water mark plus, on CUDA, the memory graphs hold. Without graphs, MemStats' peak.
  virtual int64_t backend_peak_bytes() const { return memory_stats().peak_bytes; }
  // The same for the memory the backend holds from the driver (its pools' reservations, which
  // come in chunks): what the process takes from the device.
  virtual int64_t backend_reserved_peak_bytes() const { return backend_peak_bytes(); }
  // Microseconds the calling thread has spent waiting for the device in host waits, so far;
  // the trainer's host time per step leaves it out. 0 where the backend does not count it.
  virtual double host_wait_us() const { return 0.0; }

  // ---- labels and timeline. The label applies to the ops enqueued after the call; it must
  // outlive the timeline (the engine passes strings it owns for the run).
  virtual void set_label(const char* label) = 0;
  virtual void enable_timeline(bool on) = 0;
  virtual Timeline take_timeline() = 0;  // synchronizes, returns and clears what was recorded
  virtual double now_us() const = 0;     // the timeline's clock, on the host
  // Host spans (scheduling work) go on the host track of the same timeline.
  virtual void record_host_span(const char* label, double start_us, double end_us) = 0;
};

// For destructors: while an error unwinds the stack (a failed rank, an aborted world),
// synchronize() rethrows it, and a destructor must not turn that into std::terminate; nor may
// it free what queued work still touches, so it waits for the work itself.
inline void synchronize_in_destructor(Device& device) noexcept { device.wait_until_drained(); }

}  // namespace fsdp
