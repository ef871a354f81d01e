// CudaDevice: the Device interface on one NVIDIA GPU (private to src/backend/cuda).
//
// Note [CUDA device]
// - Streams are non-blocking CUDA streams (High priority = the device's greatest priority).
//   Engine events are cudaEventDisableTiming events in an id table.
// - Memory comes from a CUDA memory pool created for this device, with its release threshold
//   at UINT64_MAX so freed memory stays cached in the pool instead of going back to the driver
//   at every synchronization. alloc/free are cudaMallocFromPoolAsync/cudaFreeAsync on the given
//   stream, which is exactly Note [Stream-ordered memory]. MemStats are host-side counters
//   updated at call time (so they are exact and timing-independent); the pool's own view
//   (which also holds GEMM workspaces, loss scratch and staging mirrors) is
//   pool_used_bytes()/pool_peak_bytes().
// - Every public op makes this device current first, so a thread may drive several devices.
// - A device is driven from one host thread (its rank's). Only the memory bookkeeping is
//   locked, because a Storage may be released from another thread.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/cuda/cublaslt_gemm.h"
#include "core/allocation_ledger.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_timeline.h"
#include "backend/cuda/staging_ring.h"
#include "fsdp/device.h"

namespace fsdp::cuda {

class CublasHandle;

class CudnnAttention;

struct HostTaskErrors;  // cuda_host_tasks.cpp

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;

  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }

  Stream create_stream(const std::string& name, StreamPriority priority) override;
  Event create_event() override;
  void destroy_event(Event e) override;
  void record_event(Event e, Stream s) override;
  void wait_event(Stream s, Event e) override;
  bool query_event(Event e) override;
  void synchronize_event(Event e) override;
  void synchronize_stream(Stream s) override;
  void synchronize() override;

  void* alloc(size_t bytes, Stream s, MemTag tag) override;
  void free(void* ptr, Stream s) override;
  MemStats memory_stats() const override;
  void* alloc_host(size_t bytes) override;
  void free_host(void* ptr) override;
  void reset_peak_memory() override;

  void copy(Stream s, void* dst, const void* src, size_t bytes) override;
  void copy_from_host(Stream s, void* dst, const void* host_src, size_t bytes) override;
  void copy_to_host(Stream s, void* host_dst, const void* src, size_t bytes) override;
  void copy_from_host_async(Stream s, void* dst, const void* host_src, size_t bytes) override;
  void run_host_task(Stream s, int64_t bytes, std::function<void()> task) override;
  void fill(Stream s, void* dst, DType t, int64_t n, float value) override;
  void cast(Stream s, void* dst, DType dst_t, const void* src, DType src_t, int64_t n) override;

  void all_gather_copy_out(Stream s, const void* gathered, DType t, int64_t shard_numel, int world,
                           const ShardSlice* slices, void* const* dsts, int count) override;
  void reduce_scatter_copy_in(Stream s, void* rs_in, DType rs_t, int64_t shard_numel, int world,
                              const ShardSlice* slices, const void* const* srcs,
                              const DType* src_types, int count) override;
  void accumulate(Stream s, float* dst, const void* src, DType src_t, int64_t n,
                  float scale) override;

  void adamw_step(Stream s, const OptimTensor* tensors, int count, const AdamWConfig& c,
                  int64_t step) override;
  void sgd_step(Stream s, const OptimTensor* tensors, int count, float lr, float momentum,
                float weight_decay) override;
  void adamw_step_scalars(Stream s, const OptimTensor* tensors, int count, const AdamWConfig& c,
                          const StepScalars* scalars, GradSquares grad_sq) override;
  void sgd_step_scalars(Stream s, const OptimTensor* tensors, int count, float momentum,
                        float weight_decay, const StepScalars* scalars,
                        GradSquares grad_sq) override;
  void sum_squares(Stream s, const float* const* tensors, const int64_t* numels, int count,
                   float* out) override;

  void gemm_relu(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 const void* a, const void* b, DType ab_t, void* c, DType c_t) override;
  void gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const void* a, const void* b, DType ab_t, float beta, void* c, DType c_t) override;
  // Note [Grouped GEMM]: one cuBLAS grouped-batched call (cuda_moe_ops.cpp).
  void grouped_gemm(Stream s, bool trans_a, bool trans_b, const GemmGroup* groups, int count,
                    DType ab_t, DType c_t) override;
  void activation_forward(Stream s, Activation f, const void* x, void* y, DType t,
                          int64_t n) override;
  void activation_backward(Stream s, Activation f, const void* x, const void* dy, void* dx, DType t,
                           int64_t n) override;
  void add(Stream s, void* out, const void* a, const void* b, DType t, int64_t n) override;
  void softmax_rows(Stream s, const void* x, DType t, float* probs, int64_t rows,
                    int64_t cols) override;
  void softmax_rows_backward(Stream s, const float* probs, const float* dprobs, void* dx, DType t,
                             int64_t rows, int64_t cols) override;
  void scale_rows(Stream s, void* out, const void* in, DType t, const float* w, int64_t w_stride,
                  int64_t rows, int64_t cols, bool accumulate) override;
  void row_dot(Stream s, const void* a, const void* b, DType t, float* out, int64_t out_stride,
               int64_t rows, int64_t cols) override;
  // Note [Device MoE routing] (cuda_moe_ops.cpp)
  void moe_route(Stream s, const MoeRouting& r) override;
  void moe_route_backward(Stream s, const MoeRouting& r, const float* dsend_weight,
                          float* dprobs) override;
  void mean_square_loss(Stream s, const void* y, DType t, int64_t n, float* loss,
                        void* dy) override;
  void cross_entropy_loss(Stream s, const void* logits, DType t, const int32_t* labels,
                          int64_t rows, int64_t classes, float* loss, void* dlogits) override;
  void synthetic_labels(Stream s, int32_t* labels, int64_t rows, int64_t width, uint64_t seed,
                        int64_t step, int64_t first_row, float bound) override;
  void synthetic_batch(Stream s, void* dst, DType t, int64_t rows, int64_t cols, uint64_t seed,
                       int64_t step, int64_t first_row, float bound) override;
  void spin(Stream s, double microseconds) override;

  // ---- transformer ops (Note [Transformer ops]; cuda_transformer_ops.cpp). Attention in bf16
  // runs on cuDNN's fused engines (Note [cuDNN attention]), in fp32 on the CUDA-core kernel of
  // attention_simt.cu; FSDP_ATTENTION=simt sends bf16 there too.
  void embedding_forward(Stream s, const void* table, DType t, const int32_t* ids, int64_t rows,
                         int64_t dim, void* out) override;
  void embedding_backward(Stream s, const void* dy, DType t, const int32_t* ids, int64_t rows,
                          int64_t dim, int64_t vocab, void* dtable) override;
  void rms_norm_forward(Stream s, const void* x, const void* w, DType t, int64_t rows,
                        int64_t cols, float eps, void* y, float* rstd, float* amax) override;
  void rms_norm_backward(Stream s, const void* x, const void* w, const float* rstd,
                         const void* dy, DType t, int64_t rows, int64_t cols, void* dx,
                         void* dw, float* amax) override;
  void add_rms_norm_forward(Stream s, const void* x, const void* residual, const void* w, DType t,
                            int64_t rows, int64_t cols, float eps, void* h, void* y,
                            float* rstd, float* amax) override;
  void rms_norm_backward_add(Stream s, const void* x, const void* w, const float* rstd,
                             const void* dy, const void* dresidual, DType t, int64_t rows,
                             int64_t cols, void* dx, void* dw, float* amax) override;
  void rope(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads, int64_t head_dim,
            int64_t seq_len, const float* inv_freq, bool inverse) override;
  void rope_at(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
               int64_t head_dim, int64_t first_position, const float* inv_freq) override;
  void attention_kv_cache(Stream s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                          const void* v, int64_t ldv, DType t, int64_t rows, int64_t position,
                          int64_t capacity, int64_t heads, int64_t kv_heads, int64_t head_dim,
                          void* k_cache, void* v_cache, void* out, int64_t ldo) override;
  void attention_forward(Stream s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                         const void* v, int64_t ldv, DType t, int64_t batch, int64_t seq,
                         int64_t heads, int64_t kv_heads, int64_t head_dim, void* out,
                         int64_t ldo, float* lse) override;
  void attention_backward(Stream s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                          const void* v, int64_t ldv, const void* out, int64_t ldo,
                          const void* dout, int64_t lddo, const float* lse, DType t,
                          int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                          int64_t head_dim, void* dq, void* dk, void* dv) override;
  void swiglu_forward(Stream s, const void* h, DType t, int64_t rows, int64_t ffn,
                      void* out, float* amax) override;
  void swiglu_backward(Stream s, const void* h, const void* dout, DType t, int64_t rows,
                       int64_t ffn, void* dh, float* amax) override;
  // ---- fp8 (cuda_fp8_ops.cpp; docs/fp8.md)
  void fp8_amax(Stream s, const void* x, DType t, int64_t rows, int64_t cols, Fp8Axis axis,
                float* amax) override;
  void fp8_cast(Stream s, const void* x, DType t, DType value_t, int64_t rows, int64_t cols,
                Fp8Axis axis, const float* amax, Fp8Format f, uint8_t* q, uint8_t* q_t,
                float* scale_inv) override;
  void fp8_gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                Fp8Operand a, Fp8Operand b, bool rowwise, void* c, DType c_t) override;

  // ---- CUDA graphs (cuda_graphs.cpp; Note [CUDA graph capture] there).
  void begin_capture(Stream s) override;
  int end_capture(Stream s) override;
  void abort_capture(Stream s) noexcept override;
  void replay(int graph, Stream s) override;
  void destroy_graph(int graph) override;
  bool capturing() const override { return capture_.active; }
  bool graph_has_op_times(int graph) const override;
  std::vector<std::string> graph_streams(int graph) const override;
  int64_t backend_peak_bytes() const override;
  int64_t backend_reserved_peak_bytes() const override;
  double host_wait_us() const override;

  void set_label(const char* label) override { label_ = label ? label : ""; }
  void enable_timeline(bool on) override;
  Timeline take_timeline() override;
  double now_us() const override { return TimelineRecorder::host_now_us(); }
  void record_host_span(const char* label, double start_us, double end_us) override;

  // ---- beyond the Device interface
  int ordinal() const { return ordinal_; }
  // Whether bf16 attention runs on cuDNN (the default) or on the CUDA-core kernel
  // (FSDP_ATTENTION=simt), and how many cuDNN attention plans are cached.
  bool attention_on_cudnn() const { return !attention_simt_; }
  size_t cudnn_attention_plans() const;
  void make_current() const;
  cudaStream_t native(Stream s) const;
  // The pool's own counters (cudaMemPoolAttrUsedMemCurrent / UsedMemHigh): every live pool
  // allocation, the backend's internal ones included. reset_peak_memory resets both views.
  int64_t pool_used_bytes() const;
  int64_t pool_peak_bytes() const;

  // Brackets one op for the timeline (a branch when the timeline is off) and makes the device
  // current. NcclComm uses it for collectives.
  class OpScope {
   public:
    // `timed`: the op goes on the timeline (when it is on).
    OpScope(CudaDevice& device, Stream s, OpKind kind, bool timed = true);
    ~OpScope();
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;
    cudaStream_t stream() const { return stream_; }

   private:
    CudaDevice& device_;
    cudaStream_t stream_;
    int token_ = -1;
  };

 private:
  struct StreamEntry {
    cudaStream_t native = nullptr;
    std::string name;
  };
  // What a capture in progress has seen (cuda_graphs.cpp).
  struct Capture {
    bool active = false;
    int origin = -1;     // the stream begin_capture was called on
    uint64_t epoch = 0;  // counts captures; events remember the epoch of their last record
    std::vector<int> streams;                       // streams with captured work, first use first
    std::unordered_map<void*, MemTag> live;         // allocated inside, not yet freed
    std::vector<void*> pinned;                      // host snapshots the graph's copies read
    std::string error;  // the first thing that cannot be captured (raised by end_capture)
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    std::vector<int> streams;
    std::vector<void*> pinned;
  };
  // Under capture: notes that `s` holds captured work; raises a UserError if it is not
  // capturing (work on a stream that never joined the capture would run now, outside it).
  void note_captured(int stream_id, cudaStream_t stream);
  void fail_if_capturing(const char* what) const;
  // Under capture: a pinned copy of `bytes` of host data that lives as long as the graph.
  void* snapshot(const void* host_data, size_t bytes);
  void release_graphs() noexcept;
  void reset_capture();  // to no capture, keeping the epoch
  void orphan_live_allocations();  // after a failed capture
  cudaEvent_t native_event(Event e) const;
  // Host data a launch reads from device memory: through the staging ring, or under capture a
  // copy the graph owns (Note [CUDA graph capture]). release_upload once the reader is enqueued.
  const void* upload(cudaStream_t stream, const void* host_data, size_t bytes);
  void release_upload(cudaStream_t stream);
  // Runs launch(device_descs): nullptr when the descriptors fit in the kernel parameters,
  // else a device copy staged on `stream` for the launch.
  template <typename Desc, typename Launch>
  void with_device_descs(cudaStream_t stream, const std::vector<Desc>& descs, Launch&& launch);

  // Note [Host-side stream work] (cuda_host_tasks.cpp): the first error a host task raised,
  // which synchronize() then rethrows; set from CUDA's host-function thread.
  std::shared_ptr<HostTaskErrors> host_task_errors_;
  void rethrow_host_task_error() const;

  int ordinal_;
  cudaMemPool_t pool_ = nullptr;
  std::vector<StreamEntry> streams_;
  std::vector<cudaEvent_t> events_;  // null: a destroyed id, reusable
  std::vector<int> free_event_ids_;
  // Whether each event id was recorded since it was created: a wait on a never-recorded
  // event is a no-op and, as on the CPU backend, no Wait on the timeline.
  std::vector<uint8_t> event_recorded_;

  core::AllocationLedger ledger_;

  std::unique_ptr<LtGemm> gemm_;
  std::shared_ptr<CublasHandle> cublas_;  // made at the first grouped_gemm
  std::unique_ptr<CudnnAttention> cudnn_attention_;  // made at the first bf16 attention
  bool attention_simt_ = false;                       // FSDP_ATTENTION=simt
  std::unique_ptr<StagingRing> staging_;
  TimelineRecorder timeline_;
  Capture capture_;
  std::vector<Graph> graphs_;
  std::vector<uint64_t> event_epoch_;  // per event id: Capture::epoch of its last record
  void* capture_upload_ = nullptr;     // upload() under capture, until release_upload()
  cudaEvent_t graph_join_ = nullptr;   // orders a replay after (and before) the other streams
  // Allocations made inside a capture that failed: no memory behind them, freed as no-ops.
  std::unordered_set<void*> orphaned_;
  const char* label_ = "";

  // Reused descriptor buffers for the multi-tensor launches (no allocation per step).
  std::vector<kernels::ShardCopyDesc> shard_descs_;
  std::vector<kernels::OptimDesc> optim_descs_;
};

// The CUDA stream behind a Stream of a CudaDevice (NcclComm enqueues collectives on it).
cudaStream_t native_stream(Device& device, Stream s);
// The CudaDevice behind a Device; raises an Error if it is another backend's device.
CudaDevice& as_cuda_device(Device& device);

}  // namespace fsdp::cuda
