// A CUDA-graph emulator over any Device and its Comms, so the trainer's captured steps (Note
// [Captured steps]) run in CPU tests with the capture rules of the CUDA backend (Note [CUDA
// graph capture]): work issued while capturing is recorded, not run, and replay() issues the
// recording again, in order, on the same streams. As on CUDA:
// - a stream joins the capture by waiting on an event recorded inside it; work on a stream
//   that has not joined raises a UserError;
// - a wait on an event last recorded before the capture is dropped;
// - after the capture, an eager wait on an event whose last record was captured fails
//   (CUDA: cudaStreamWaitEvent returns cudaErrorInvalidValue), until it is recorded again;
// - memory allocated inside must be freed inside (it stays reserved for the graph, as graph
//   memory does), and memory from before may not be freed inside;
// - copy_from_host snapshots the host bytes; host waits raise a UserError.
// It also plans the graph's memory the way a graph must (Note [Graph memory plan]): a block
// freed inside the capture may be reused by a later allocation only when the free happens
// before it (same stream, or through recorded events), since a replay runs streams
// concurrently; graph_memory_bytes() is the memory that plan needs.
#pragma once

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/error.h"

namespace fsdp::testing {

class GraphEmulatorDevice final : public Device {
 public:
  explicit GraphEmulatorDevice(Device& inner) : d_(inner) {}
  ~GraphEmulatorDevice() override {
    synchronize_in_destructor(d_);
    for (const Graph& g : graphs_)
      for (const auto& [ptr, s] : g.memory) d_.free(ptr, s);
  }

  int replays() const { return replays_; }
  // Bytes the last captured graph needs for its own allocations (Note [Graph memory plan]).
  int64_t graph_memory_bytes() const { return plan_bytes_; }
  // The inner device's live bytes when the last capture began: the state kept across steps.
  int64_t bytes_before_capture() const { return bytes_before_capture_; }
  // Records `work` (which issues on `s`) while capturing, else runs it now.
  void issue(Stream s, std::function<void()> work) {
    if (!active_) return work();
    FSDP_USER_CHECK(joined_.count(s.id), "cannot capture the training step in a CUDA graph: "
                    "work on stream '", names_.at(s.id), "' was issued before that stream "
                    "waited on the captured step");
    if (std::find(streams_.begin(), streams_.end(), s.id) == streams_.end())
      streams_.push_back(s.id);
    ++clock_[s.id][s.id];
    ops_.push_back(std::move(work));
  }

  // ---- capture
  void begin_capture(Stream s) override {
    FSDP_CHECK(!active_, "nested capture");
    d_.synchronize();
    active_ = true;
    ++epoch_;
    ops_.clear();
    streams_ = {s.id};
    joined_ = {s.id};
    live_.clear();
    freed_.clear();
    error_.clear();
    clock_.clear();
    event_clock_.clear();
    plan_free_.clear();
    plan_block_.clear();
    plan_bytes_ = 0;
    bytes_before_capture_ = d_.memory_stats().current_bytes;
  }
  int end_capture(Stream) override {
    active_ = false;
    if (error_.empty() && !live_.empty())
      error_ = std::to_string(live_.size()) + " allocations made inside the step outlive it";
    if (!error_.empty()) {
      for (auto& [ptr, s] : freed_) d_.free(ptr, s);
      FSDP_USER_FAIL("cannot capture the training step in a CUDA graph: ", error_);
    }
    graphs_.push_back(Graph{std::move(ops_), streams_, std::move(freed_)});
    return static_cast<int>(graphs_.size()) - 1;
  }
  void abort_capture(Stream) noexcept override {
    active_ = false;
    ops_.clear();
  }
  void replay(int graph, Stream) override {
    for (const auto& op : graphs_.at(graph).ops) op();
    ++replays_;
  }
  void destroy_graph(int graph) override {
    d_.synchronize();
    Graph& g = graphs_.at(graph);
    for (const auto& [ptr, s] : g.memory) d_.free(ptr, s);
    g = Graph{};
  }
  bool capturing() const override { return active_; }
  std::vector<std::string> graph_streams(int graph) const override {
    std::vector<std::string> out;
    for (int id : graphs_.at(graph).streams) out.push_back(names_.at(id));
    return out;
  }

  // ---- streams, events, host waits
  std::string name() const override { return d_.name(); }
  Stream create_stream(const std::string& name, StreamPriority p) override {
    const Stream s = d_.create_stream(name, p);
    names_[s.id] = name;
    return s;
  }
  Event create_event() override { return d_.create_event(); }
  void destroy_event(Event e) override { d_.destroy_event(e); }
  void record_event(Event e, Stream s) override {
    if (active_) epochs_[e.id] = epoch_;
    if (active_)
      captured_last_.insert(e.id);
    else
      captured_last_.erase(e.id);
    issue(s, [=, this] { d_.record_event(e, s); });
    if (active_) event_clock_[e.id] = clock_[s.id];
  }
  void wait_event(Stream s, Event e) override {
    FSDP_CHECK(active_ || !captured_last_.count(e.id),
               "an eager wait on an event last recorded inside a capture (CUDA refuses it)");
    if (!active_) return d_.wait_event(s, e);
    if (epochs_[e.id] != epoch_) return;  // recorded before the capture: nothing to order
    joined_.insert(s.id);
    issue(s, [=, this] { d_.wait_event(s, e); });
    for (const auto& [stream, tick] : event_clock_[e.id])
      clock_[s.id][stream] = std::max(clock_[s.id][stream], tick);
  }
  bool query_event(Event e) override { no_host_wait("query_event"); return d_.query_event(e); }
  void synchronize_event(Event e) override { no_host_wait("synchronize_event"); d_.synchronize_event(e); }
  void synchronize_stream(Stream s) override { no_host_wait("synchronize_stream"); d_.synchronize_stream(s); }
  void synchronize() override { no_host_wait("synchronize"); d_.synchronize(); }

  // ---- memory
  void* alloc(size_t bytes, Stream s, MemTag tag) override {
    if (active_) issue(s, [] {});  // the stream must have joined
    void* p = d_.alloc(bytes, s, tag);
    if (active_) {
      live_[p] = s;
      plan_alloc(bytes, s);
      plan_block_[p] = bytes;
    }
    return p;
  }
  void free(void* ptr, Stream s) override {
    if (!active_ || !ptr) return d_.free(ptr, s);
    if (live_.erase(ptr)) {
      freed_.push_back({ptr, s});  // graph memory: reserved until the graph goes
      issue(s, [] {});
      plan_free_.push_back({plan_block_.at(ptr), s.id, clock_[s.id][s.id]});
      plan_block_.erase(ptr);
      return;
    }
    if (error_.empty()) error_ = "the step frees memory allocated before it";
  }
  MemStats memory_stats() const override { return d_.memory_stats(); }
  void reset_peak_memory() override { d_.reset_peak_memory(); }
  void* alloc_host(size_t bytes) override { return d_.alloc_host(bytes); }
  void free_host(void* ptr) override { d_.free_host(ptr); }

  // ---- copies
  void copy(Stream s, void* dst, const void* src, size_t bytes) override {
    issue(s, [=, this] { d_.copy(s, dst, src, bytes); });
  }
  void copy_from_host(Stream s, void* dst, const void* host_src, size_t bytes) override {
    auto bytes_now = std::make_shared<std::vector<char>>(
        static_cast<const char*>(host_src), static_cast<const char*>(host_src) + bytes);
    issue(s, [=, this] { d_.copy_from_host(s, dst, bytes_now->data(), bytes); });
  }
  void copy_to_host(Stream s, void* host_dst, const void* src, size_t bytes) override {
    issue(s, [=, this] { d_.copy_to_host(s, host_dst, src, bytes); });
  }
  void fill(Stream s, void* dst, DType t, int64_t n, float value) override {
    issue(s, [=, this] { d_.fill(s, dst, t, n, value); });
  }
  void cast(Stream s, void* dst, DType dt, const void* src, DType st, int64_t n) override {
    issue(s, [=, this] { d_.cast(s, dst, dt, src, st, n); });
  }

  // ---- FSDP copies and optimizers (host arrays copied for the recording)
  void all_gather_copy_out(Stream s, const void* gathered, DType t, int64_t shard_numel, int world,
                           const ShardSlice* slices, void* const* dsts, int count) override {
    std::vector<ShardSlice> sl(slices, slices + count);
    std::vector<void*> ds(dsts, dsts + count);
    issue(s, [=, this] {
      d_.all_gather_copy_out(s, gathered, t, shard_numel, world, sl.data(), ds.data(), count);
    });
  }
  void reduce_scatter_copy_in(Stream s, void* rs_in, DType rs_t, int64_t shard_numel, int world,
                              const ShardSlice* slices, const void* const* srcs,
                              const DType* src_types, int count) override {
    std::vector<ShardSlice> sl(slices, slices + count);
    std::vector<const void*> sr(srcs, srcs + count);
    std::vector<DType> ty(src_types, src_types + count);
    issue(s, [=, this] {
      d_.reduce_scatter_copy_in(s, rs_in, rs_t, shard_numel, world, sl.data(), sr.data(),
                                ty.data(), count);
    });
  }
  void accumulate(Stream s, float* dst, const void* src, DType st, int64_t n, float scale) override {
    issue(s, [=, this] { d_.accumulate(s, dst, src, st, n, scale); });
  }
  void adamw_step(Stream s, const OptimTensor* t, int count, const AdamWConfig& c,
                  int64_t step) override {
    std::vector<OptimTensor> ts(t, t + count);
    issue(s, [=, this] { d_.adamw_step(s, ts.data(), count, c, step); });
  }
  void sgd_step(Stream s, const OptimTensor* t, int count, float lr, float momentum,
                float wd) override {
    std::vector<OptimTensor> ts(t, t + count);
    issue(s, [=, this] { d_.sgd_step(s, ts.data(), count, lr, momentum, wd); });
  }
  void adamw_step_scalars(Stream s, const OptimTensor* t, int count, const AdamWConfig& c,
                          const StepScalars* scalars, GradSquares sq) override {
    std::vector<OptimTensor> ts(t, t + count);
    issue(s, [=, this] { d_.adamw_step_scalars(s, ts.data(), count, c, scalars, sq); });
  }
  void sgd_step_scalars(Stream s, const OptimTensor* t, int count, float momentum, float wd,
                        const StepScalars* scalars, GradSquares sq) override {
    std::vector<OptimTensor> ts(t, t + count);
    issue(s, [=, this] { d_.sgd_step_scalars(s, ts.data(), count, momentum, wd, scalars, sq); });
  }
  void sum_squares(Stream s, const float* const* tensors, const int64_t* numels, int count,
                   float* out) override {
    std::vector<const float*> ts(tensors, tensors + count);
    std::vector<int64_t> ns(numels, numels + count);
    issue(s, [=, this] { d_.sum_squares(s, ts.data(), ns.data(), count, out); });
  }

  // ---- compute
  void gemm(Stream s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
            const void* a, const void* b, DType ab_t, float beta, void* c, DType c_t) override {
    issue(s, [=, this] { d_.gemm(s, ta, tb, m, n, k, alpha, a, b, ab_t, beta, c, c_t); });
  }
  void grouped_gemm(Stream s, bool ta, bool tb, const GemmGroup* groups, int count, DType ab_t,
                    DType c_t) override {
    std::vector<GemmGroup> gs(groups, groups + count);
    issue(s, [=, this] { d_.grouped_gemm(s, ta, tb, gs.data(), count, ab_t, c_t); });
  }
  void gemm_relu(Stream s, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a,
                 const void* b, DType ab_t, void* c, DType c_t) override {
    issue(s, [=, this] { d_.gemm_relu(s, ta, tb, m, n, k, a, b, ab_t, c, c_t); });
  }
  void activation_forward(Stream s, Activation f, const void* x, void* y, DType t,
                          int64_t n) override {
    issue(s, [=, this] { d_.activation_forward(s, f, x, y, t, n); });
  }
  void activation_backward(Stream s, Activation f, const void* x, const void* dy, void* dx,
                           DType t, int64_t n) override {
    issue(s, [=, this] { d_.activation_backward(s, f, x, dy, dx, t, n); });
  }
  void add(Stream s, void* out, const void* a, const void* b, DType t, int64_t n) override {
    issue(s, [=, this] { d_.add(s, out, a, b, t, n); });
  }
  void softmax_rows(Stream s, const void* x, DType t, float* probs, int64_t rows,
                    int64_t cols) override {
    issue(s, [=, this] { d_.softmax_rows(s, x, t, probs, rows, cols); });
  }
  void softmax_rows_backward(Stream s, const float* probs, const float* dprobs, void* dx, DType t,
                             int64_t rows, int64_t cols) override {
    issue(s, [=, this] { d_.softmax_rows_backward(s, probs, dprobs, dx, t, rows, cols); });
  }
  void scale_rows(Stream s, void* out, const void* in, DType t, const float* w, int64_t ws,
                  int64_t rows, int64_t cols, bool acc) override {
    issue(s, [=, this] { d_.scale_rows(s, out, in, t, w, ws, rows, cols, acc); });
  }
  void row_dot(Stream s, const void* a, const void* b, DType t, float* out, int64_t os,
               int64_t rows, int64_t cols) override {
    issue(s, [=, this] { d_.row_dot(s, a, b, t, out, os, rows, cols); });
  }
  void moe_route(Stream s, const MoeRouting& r) override {
    issue(s, [=, this] { d_.moe_route(s, r); });
  }
  void moe_route_backward(Stream s, const MoeRouting& r, const float* dsend_weight,
                          float* dprobs) override {
    issue(s, [=, this] { d_.moe_route_backward(s, r, dsend_weight, dprobs); });
  }
  void mean_square_loss(Stream s, const void* y, DType t, int64_t n, float* loss,
                        void* dy) override {
    issue(s, [=, this] { d_.mean_square_loss(s, y, t, n, loss, dy); });
  }
  void cross_entropy_loss(Stream s, const void* logits, DType t, const int32_t* labels,
                          int64_t rows, int64_t classes, float* loss, void* dl) override {
    issue(s, [=, this] { d_.cross_entropy_loss(s, logits, t, labels, rows, classes, loss, dl); });
  }
  void synthetic_labels(Stream s, int32_t* labels, int64_t rows, int64_t width, uint64_t seed,
                        int64_t step, int64_t first_row, float bound) override {
    issue(s, [=, this] { d_.synthetic_labels(s, labels, rows, width, seed, step, first_row, bound); });
  }
  void synthetic_batch(Stream s, void* dst, DType t, int64_t rows, int64_t cols, uint64_t seed,
                       int64_t step, int64_t first_row, float bound) override {
    issue(s, [=, this] { d_.synthetic_batch(s, dst, t, rows, cols, seed, step, first_row, bound); });
  }
  void embedding_forward(Stream s, const void* table, DType t, const int32_t* ids, int64_t rows,
                         int64_t dim, void* out) override {
    issue(s, [=, this] { d_.embedding_forward(s, table, t, ids, rows, dim, out); });
  }
  void embedding_backward(Stream s, const void* dy, DType t, const int32_t* ids, int64_t rows,
                          int64_t dim, int64_t vocab, void* dtable) override {
    issue(s, [=, this] { d_.embedding_backward(s, dy, t, ids, rows, dim, vocab, dtable); });
  }
  void rms_norm_forward(Stream s, const void* x, const void* w, DType t, int64_t rows,
                        int64_t cols, float eps, void* y, float* rstd, float* amax) override {
    issue(s, [=, this] { d_.rms_norm_forward(s, x, w, t, rows, cols, eps, y, rstd, amax); });
  }
  void rms_norm_backward(Stream s, const void* x, const void* w, const float* rstd, const void* dy,
                         DType t, int64_t rows, int64_t cols, void* dx, void* dw,
                         float* amax) override {
    issue(s, [=, this] { d_.rms_norm_backward(s, x, w, rstd, dy, t, rows, cols, dx, dw, amax); });
  }
  void add_rms_norm_forward(Stream s, const void* x, const void* r, const void* w, DType t,
                            int64_t rows, int64_t cols, float eps, void* h, void* y,
                            float* rstd, float* amax) override {
    issue(s, [=, this] {
      d_.add_rms_norm_forward(s, x, r, w, t, rows, cols, eps, h, y, rstd, amax);
    });
  }
  void rms_norm_backward_add(Stream s, const void* x, const void* w, const float* rstd,
                             const void* dy, const void* dr, DType t, int64_t rows, int64_t cols,
                             void* dx, void* dw, float* amax) override {
    issue(s, [=, this] {
      d_.rms_norm_backward_add(s, x, w, rstd, dy, dr, t, rows, cols, dx, dw, amax);
    });
  }
  void rope(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads, int64_t hd,
            int64_t seq, const float* inv_freq, bool inverse) override {
    // The frequencies are read before the call returns (Device::rope): a copy for the replay.
    std::vector<float> freqs(inv_freq, inv_freq + hd / 2);
    issue(s, [=, this] { d_.rope(s, x, ld, t, rows, heads, hd, seq, freqs.data(), inverse); });
  }
  void attention_forward(Stream s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                         const void* v, int64_t ldv, DType t, int64_t batch, int64_t seq,
                         int64_t heads, int64_t kvh, int64_t hd, void* out, int64_t ldo,
                         float* lse) override {
    issue(s, [=, this] {
      d_.attention_forward(s, q, ldq, k, ldk, v, ldv, t, batch, seq, heads, kvh, hd, out, ldo, lse);
    });
  }
  void attention_backward(Stream s, const void* q, int64_t ldq, const void* k, int64_t ldk,
                          const void* v, int64_t ldv, const void* out, int64_t ldo,
                          const void* dout, int64_t lddo, const float* lse, DType t,
                          int64_t batch, int64_t seq, int64_t heads, int64_t kvh, int64_t hd,
                          void* dq, void* dk, void* dv) override {
    issue(s, [=, this] {
      d_.attention_backward(s, q, ldq, k, ldk, v, ldv, out, ldo, dout, lddo, lse, t, batch, seq,
                            heads, kvh, hd, dq, dk, dv);
    });
  }
  void swiglu_forward(Stream s, const void* h, DType t, int64_t rows, int64_t ffn,
                      void* out, float* amax) override {
    issue(s, [=, this] { d_.swiglu_forward(s, h, t, rows, ffn, out, amax); });
  }
  void swiglu_backward(Stream s, const void* h, const void* dout, DType t, int64_t rows,
                       int64_t ffn, void* dh, float* amax) override {
    issue(s, [=, this] { d_.swiglu_backward(s, h, dout, t, rows, ffn, dh, amax); });
  }
  void spin(Stream s, double us) override { issue(s, [=, this] { d_.spin(s, us); }); }

  // ---- labels and timeline: host-side, never recorded
  void set_label(const char* label) override { d_.set_label(label); }
  void enable_timeline(bool on) override { d_.enable_timeline(on); }
  Timeline take_timeline() override { return d_.take_timeline(); }
  double now_us() const override { return d_.now_us(); }
  void record_host_span(const char* l, double a, double b) override { d_.record_host_span(l, a, b); }

 private:
  struct Graph {
    std::vector<std::function<void()>> ops;
    std::vector<int> streams;
    std::vector<std::pair<void*, Stream>> memory;
  };
  // Note [Graph memory plan]: an allocation on `s` takes freed bytes whose free happens before
  // it (those freed on `s` first, the oldest first), and the graph needs new bytes for the rest.
  // Freed bytes are pooled without regard to addresses: the plan measures what the ordering
  // allows, not an allocator's fragmentation.
  struct FreeBlock {
    size_t bytes;
    int stream;
    uint64_t tick;  // the free's position on its stream
  };
  void plan_alloc(size_t bytes, Stream s) {
    size_t need = bytes;
    for (const bool same_stream : {true, false})
      for (FreeBlock& f : plan_free_) {
        if (need == 0) break;
        if ((f.stream == s.id) != same_stream || clock_[s.id][f.stream] < f.tick) continue;
        const size_t take = std::min(need, f.bytes);
        f.bytes -= take;
        need -= take;
      }
    std::erase_if(plan_free_, [](const FreeBlock& f) { return f.bytes == 0; });
    plan_bytes_ += static_cast<int64_t>(need);
  }
  void no_host_wait(const char* what) const {
    FSDP_USER_CHECK(!active_, "cannot capture the training step in a CUDA graph: the host waits "
                    "for the device inside the step (", what, ")");
  }

  Device& d_;
  bool active_ = false;
  uint64_t epoch_ = 0;
  std::map<int, uint64_t> epochs_;  // event id: epoch of its last record
  std::set<int> captured_last_;     // events whose last record was captured
  std::map<int, std::string> names_;
  std::vector<std::function<void()>> ops_;
  std::vector<int> streams_;
  std::set<int> joined_;
  std::map<void*, Stream> live_;
  std::vector<std::pair<void*, Stream>> freed_;
  std::string error_;
  std::vector<Graph> graphs_;
  int replays_ = 0;
  std::map<int, std::map<int, uint64_t>> clock_;        // stream: what it has waited for
  std::map<int, std::map<int, uint64_t>> event_clock_;  // event: its stream's clock at record
  std::vector<FreeBlock> plan_free_;
  std::map<void*, size_t> plan_block_;  // live allocation: the planned block serving it
  int64_t plan_bytes_ = 0;
  int64_t bytes_before_capture_ = 0;
};

// Collectives issued while the device captures are recorded with the device's other work.
class GraphEmulatorComm final : public Comm {
 public:
  GraphEmulatorComm(std::shared_ptr<Comm> inner, GraphEmulatorDevice& device)
      : Comm(inner->rank(), inner->world_ranks(), inner->name()),
        inner_(std::move(inner)),
        device_(device) {}

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) override {
    device_.issue(s, [=, this] { inner_->all_gather(send, recv, count, t, s); });
  }
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                         Stream s) override {
    device_.issue(s, [=, this] { inner_->reduce_scatter(send, recv, count, t, op, s); });
  }
  void do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                     Stream s) override {
    device_.issue(s, [=, this] { inner_->all_reduce(send, recv, count, t, op, s); });
  }
  void do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) override {
    device_.issue(s, [=, this] { inner_->broadcast(buf, count, t, root, s); });
  }
  void do_all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, DType t, Stream s) override {
    device_.issue(s, [=, this] { inner_->all_to_all(send, send_counts, recv, recv_counts, t, s); });
  }
  std::unique_ptr<Comm> do_split(int color, int key, const std::string& name) override {
    std::unique_ptr<Comm> child = inner_->split(color, key, name);
    if (!child) return nullptr;
    return std::make_unique<GraphEmulatorComm>(std::shared_ptr<Comm>(std::move(child)), device_);
  }

 private:
  std::shared_ptr<Comm> inner_;
  GraphEmulatorDevice& device_;
};

}  // namespace fsdp::testing
