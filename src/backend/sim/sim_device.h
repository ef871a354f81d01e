// The simulated GPU: the CPU backend's streams, events and virtual clock (StreamDevice), an
// allocation ledger over addresses that hold nothing, and ops that only take time. See Note
// [Simulation backend] in sim_device.cpp.
#pragma once

#include <atomic>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_stream_device.h"
#include "backend/cpu/cpu_virtual_clock.h"
#include "backend/sim/sim_backend.h"
#include "core/allocation_ledger.h"

namespace fsdp::sim {

// What the world's device and communicators share.
struct SimShared {
  explicit SimShared(SimOptions o);
  const SimOptions options;
  const std::shared_ptr<cpu::WorldState> world;  // one host, on the virtual clock
  // Note [Shared channels]: every transfer over NVLink, or over the network, sleeps on one.
  cpu::SharedChannel nvlink, network;
  // Every kernel of the device (Note [Simulation backend]: streams slow each other down).
  cpu::SharedChannel kernels;
  std::mutex cost_mutex;
  CostLog costs;
  std::atomic<double> flops{0};
  bool device_made = false;
};

class SimDevice final : public cpu::StreamDevice {
 public:
  SimDevice(std::shared_ptr<SimShared> shared, int rank);
  ~SimDevice() override;

  bool computes_values() const override { return false; }
  SimShared& shared() { return *shared_; }
  const Calibration& calibration() const { return shared_->options.calibration; }
  // Enqueues an op that occupies stream s for `us` of device time, after the host's cost of
  // the call (`launch_us`); `op` names its cost class for the cost log.
  // A kernel shares the device with the kernels of the other streams while they overlap;
  // `alone` (Device::spin) takes exactly its time whatever runs beside it; a `memory_bound`
  // kernel shares at the calibration's memory_kernel_sharing, with the kernels of a stream of
  // a higher or a lower priority at its memory_kernel_yield and memory_kernel_lead (Note
  // [Shared channels]).
  void timed(Stream s, OpKind kind, const char* op, double us, double launch_us, double bytes = 0,
             double flops = 0, bool alone = false, bool memory_bound = false);
  // A memory-bound kernel of class `op` moving `bytes`.
  void memory_op(Stream s, const char* op, double bytes, OpKind kind = OpKind::Kernel);
  // The host's cost of one call, on the virtual clock.
  void host_cost(double us);
  // Note [Simulated host routing]: the host's work on the values it read, once it has waited.
  void synchronize_event(Event e) override;
  void synchronize_stream(Stream s) override;
  void synchronize() override;

  // ---- Note [Simulated values]: small buffers the host wrote, and probability rows.
  // Bytes last written at [p, p + n) from the host or a shadowed copy, or null.
  const std::vector<char>* shadow_at(const void* p, size_t n) const;
  void set_shadow(void* p, std::vector<char> bytes);

  // ---- memory
  void* alloc(size_t bytes, Stream s, MemTag tag) override;
  void free(void* ptr, Stream s) override;
  MemStats memory_stats() const override;
  void reset_peak_memory() override;
  void* alloc_host(size_t bytes) override;
  void free_host(void* ptr) override;

  // ---- ops (sim_device_ops.cpp)
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
  void gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const void* a, const void* b, DType ab_t, float beta, void* c, DType c_t) override;
  void grouped_gemm(Stream s, bool trans_a, bool trans_b, const GemmGroup* groups, int count,
                    DType ab_t, DType c_t) override;
  void gemm_relu(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 const void* a, const void* b, DType ab_t, void* c, DType c_t) override;
  void activation_forward(Stream s, Activation f, const void* x, void* y, DType t,
                          int64_t n) override;
  void activation_backward(Stream s, Activation f, const void* x, const void* dy, void* dx,
                           DType t, int64_t n) override;
  void add(Stream s, void* out, const void* a, const void* b, DType t, int64_t n) override;
  void softmax_rows(Stream s, const void* x, DType t, float* probs, int64_t rows,
                    int64_t cols) override;
  void softmax_rows_backward(Stream s, const float* probs, const float* dprobs, void* dx, DType t,
                             int64_t rows, int64_t cols) override;
  void scale_rows(Stream s, void* out, const void* in, DType t, const float* w, int64_t w_stride,
                  int64_t rows, int64_t cols, bool accumulate) override;
  void row_dot(Stream s, const void* a, const void* b, DType t, float* out, int64_t out_stride,
               int64_t rows, int64_t cols) override;
  void moe_route(Stream s, const MoeRouting& r) override;
  void moe_route_backward(Stream s, const MoeRouting& r, const float* dsend_weight,
                          float* dprobs) override;
  void mean_square_loss(Stream s, const void* y, DType t, int64_t n, float* loss,
                        void* dy) override;
  void cross_entropy_loss(Stream s, const void* logits, DType t, const int32_t* labels,
                          int64_t rows, int64_t classes, float* loss, void* dlogits) override;
  void synthetic_batch(Stream s, void* dst, DType t, int64_t rows, int64_t cols, uint64_t seed,
                       int64_t step, int64_t first_row, float bound) override;
  void synthetic_labels(Stream s, int32_t* labels, int64_t rows, int64_t width, uint64_t seed,
                        int64_t step, int64_t first_row, float bound) override;
  void embedding_forward(Stream s, const void* table, DType t, const int32_t* ids, int64_t rows,
                         int64_t dim, void* out) override;
  void embedding_backward(Stream s, const void* dy, DType t, const int32_t* ids, int64_t rows,
                          int64_t dim, int64_t vocab, void* dtable) override;
  void rms_norm_forward(Stream s, const void* x, const void* w, DType t, int64_t rows,
                        int64_t cols, float eps, void* y, float* rstd, float* amax) override;
  void rms_norm_backward(Stream s, const void* x, const void* w, const float* rstd, const void* dy,
                         DType t, int64_t rows, int64_t cols, void* dx, void* dw,
                         float* amax) override;
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
                         int64_t heads, int64_t kv_heads, int64_t head_dim, void* out, int64_t ldo,
                         float* lse) override;
  void attention_backward(Stream s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                          const void* v, int64_t ldv, const void* out, int64_t ldo,
                          const void* dout, int64_t lddo, const float* lse, DType t, int64_t batch,
                          int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim, void* dq,
                          void* dk, void* dv) override;
  void swiglu_forward(Stream s, const void* h, DType t, int64_t rows, int64_t ffn,
                      void* out, float* amax) override;
  void swiglu_backward(Stream s, const void* h, const void* dout, DType t, int64_t rows,
                       int64_t ffn, void* dh, float* amax) override;
  // ---- fp8 (sim_fp8_ops.cpp, Note [Simulated fp8])
  void fp8_amax(Stream s, const void* x, DType t, int64_t rows, int64_t cols, Fp8Axis axis,
                float* amax) override;
  void fp8_cast(Stream s, const void* x, DType t, DType value_t, int64_t rows, int64_t cols,
                Fp8Axis axis, const float* amax, Fp8Format f, uint8_t* q, uint8_t* q_t,
                float* scale_inv) override;
  void fp8_gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                Fp8Operand a, Fp8Operand b, bool rowwise, void* c, DType c_t) override;
  void spin(Stream s, double microseconds) override;

 private:
  struct Probabilities {
    int64_t rows = 0, cols = 0;
    uint64_t draw = 0;  // which softmax call made them (the load model's stream)
  };
  // Fills a host buffer that reads the device's probabilities at `src` (Note [Simulated
  // values]); false when `src` holds none.
  bool synthesize_probabilities(void* host_dst, const void* src, size_t bytes) const;
  void drop_values(uintptr_t first, size_t bytes);  // mutex_ held
  // Note [Simulated host routing]: what the host owes for reading `src` back.
  void read_by_host(const void* src, bool probabilities);
  void pay_host_work();
  void log_cost(const char* op, double bytes, double flops, double us);

  const std::shared_ptr<SimShared> shared_;
  core::AllocationLedger ledger_;
  mutable std::mutex mutex_;
  uintptr_t next_address_;
  std::map<uintptr_t, std::vector<char>> shadows_;  // by first address
  std::map<uintptr_t, Probabilities> probabilities_;
  std::set<uintptr_t> routing_grads_;  // row_dot outputs (Note [Simulated host routing])
  double route_due_us_ = 0, route_backward_due_us_ = 0;  // the host's, at its next wait
  uint64_t softmax_calls_ = 0;
  size_t shadow_bytes_ = 0;
};

}  // namespace fsdp::sim
