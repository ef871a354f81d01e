// A training loop over the public API for the engine tests, and its unsharded reference.
//
// The loop runs forward, loss, backward and the optimizer step after step with no host
// synchronization in between (each step's loss stays on the device until the end), so races
// between one step's tail and the next step's head can happen here, as they do in a real
// training loop. The reference runs every rank's micro-batch one after the other on a single
// unsharded model and averages their grads, so per-rank behaviour (a branch one rank skips)
// has an exact reference too.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/fsdp_state.h"
#include "fsdp/fsdp.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/model.h"
#include "fsdp/optim.h"
#include "runtime/launch.h"

namespace fsdp::testing {

// A model the loop can shard: its FSDP units (fully_shard'ed bottom-up before the root) and
// what each rank does in each micro-batch.
class LoopModel : public Module {
 public:
  using Module::Module;
  virtual std::vector<Module*> units() = 0;
  virtual int64_t dim() const = 0;
  // Before each forward, on every rank (and for every rank, in the reference).
  virtual void configure(int /*rank*/, int /*step*/, int /*micro_batch*/) {}
};
using ModelFactory = std::function<std::unique_ptr<LoopModel>()>;

struct LoopOptions {
  int world = 2;
  int steps = 3;
  int micro_batches = 1;
  bool sync_every_micro_batch = false;  // else gradient sync on the last micro-batch only
  int64_t tokens = 4;                   // rows per rank per micro-batch
  MixedPrecisionPolicy mp;
  std::optional<bool> reshard_after_forward;  // for the units; nullopt: FSDP2's default
  std::optional<bool> root_reshard_after_forward;  // for the root; nullopt: FSDP2's default
  int hsdp_replicas = 0;  // > 0: an HSDP mesh of hsdp_replicas x (world / hsdp_replicas)
  int rs_max_input_buffers = 1;
  bool host_sync_every_step = false;
  std::string optimizer = "adamw";
  cpu::CpuOptions cpu;
  // On every rank after fully_shard: prefetch lists, settings.
  std::function<void(LoopModel&, FsdpModule& root)> customize;
  // On every rank before micro-batch `mb` of `step` (its forward), after configure().
  std::function<void(LoopModel&, FsdpModule& root, int step, int mb)> before_forward;
  std::vector<ScheduleEvent>* event_log = nullptr;  // rank 0's
};

struct LoopResult {
  std::vector<float> losses;               // per step: mean over ranks and micro-batches
  std::vector<std::vector<float>> params;  // full fp32 params after the last step
  // Per rank: collectives issued on the mesh (HSDP: the shard and replicate groups) and on
  // the separate RS communicators.
  std::vector<std::vector<int64_t>> issued;
  std::vector<MemStats> memory;            // per rank, peaks since the first step began
};

inline std::vector<float> host_copy(Device& d, Stream s, const void* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  d.copy_to_host(s, out.data(), p, out.size() * sizeof(float));
  d.synchronize_stream(s);
  return out;
}

inline LoopResult run_sharded_loop(const ModelFactory& make, const LoopOptions& o) {
  LoopResult result;
  result.issued.resize(o.world);
  result.memory.resize(o.world);
  const int per_step = o.micro_batches;
  runtime::run_cpu_ranks(o.world, o.cpu, [&](int rank, Device& d, std::shared_ptr<Comm> comm) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, o.mp.param_dtype};
    // Declared before the model: it outlives the FSDP states.
    Mesh mesh = o.hsdp_replicas > 0
                    ? make_hsdp_mesh("dp", d, *comm, o.hsdp_replicas, o.world / o.hsdp_replicas)
                    : Mesh("dp", d, comm);
    std::unique_ptr<LoopModel> model = make();
    FullyShardOptions unit_options;
    unit_options.mp_policy = o.mp;
    unit_options.reshard_after_forward = o.reshard_after_forward;
    for (Module* u : model->units()) fully_shard(*u, mesh, unit_options);
    FullyShardOptions root_options;
    root_options.mp_policy = o.mp;
    root_options.reshard_after_forward = o.root_reshard_after_forward;
    FsdpModule& root = fully_shard(*model, mesh, root_options);
    root.set_reduce_scatter_max_input_buffers(o.rs_max_input_buffers);
    if (rank == 0 && o.event_log) root.set_event_log(o.event_log);
    if (o.customize) o.customize(*model, root);
    std::vector<optim::ParamSpan> spans;
    for (const ShardedGroupView& g : sharded_groups(root)) spans.push_back({g.param, g.grad, g.numel});
    optim::OptimizerConfig oc;
    oc.kind = o.optimizer;
    optim::Optimizer optimizer(d, s, spans, oc);
    const int64_t n_losses = static_cast<int64_t>(o.steps) * per_step;
    float* losses = static_cast<float*>(d.alloc(n_losses * sizeof(float), s, MemTag::Other));
    d.synchronize();
    d.reset_peak_memory();
    for (int step = 0; step < o.steps; ++step) {
      for (int mb = 0; mb < per_step; ++mb) {
        root.set_requires_gradient_sync(o.sync_every_micro_batch || mb == per_step - 1);
        model->configure(rank, step, mb);
        if (o.before_forward) o.before_forward(*model, root, step, mb);
        const int64_t rows = o.tokens, dim = model->dim();
        Tensor x = empty_tensor(d, s, o.mp.param_dtype, rows, dim, MemTag::Activation);
        d.synthetic_batch(s, x.data, x.dtype, rows, dim, 7, step * per_step + mb, rank * rows,
                          nn::kDataBound);
        Tensor y = model->forward(ctx, x);
        Tensor dy = empty_tensor(d, s, y.dtype, y.rows, y.cols, MemTag::Activation);
        d.mean_square_loss(s, y.data, y.dtype, y.numel(), losses + step * per_step + mb, dy.data);
        y = Tensor{};
        model->backward(ctx, dy, /*input_grad=*/false);
      }
      optimizer.step(s);
      zero_sharded_grads(root);
      if (o.host_sync_every_step) d.synchronize();
    }
    result.memory[rank] = d.memory_stats();
    float* averaged = static_cast<float*>(d.alloc(n_losses * sizeof(float), s, MemTag::Other));
    comm->all_reduce(losses, averaged, n_losses, DType::F32, ReduceOp::Avg, s);
    const std::vector<float> all = host_copy(d, s, averaged, n_losses);
    d.free(losses, s);
    d.free(averaged, s);
    for (int k = 0; k < kCollectiveKindCount; ++k) {
      const auto kind = static_cast<CollectiveKind>(k);
      int64_t n = comm->issued(kind) + root.state().ctx->separate_comm_issued(kind);
      if (o.hsdp_replicas > 0) n += mesh.comm().issued(kind) + mesh.replicate_comm()->issued(kind);
      result.issued[rank].push_back(n);
    }
    std::vector<std::vector<float>> params = gather_full_params(root, s);  // collective
    d.synchronize();
    if (rank != 0) return;
    result.params = std::move(params);
    for (int step = 0; step < o.steps; ++step) {
      float sum = 0;
      for (int mb = 0; mb < per_step; ++mb) sum += all[step * per_step + mb];
      result.losses.push_back(sum / per_step);
    }
  });
  return result;
}

// One rank, no FSDP, fp32: each micro-batch runs every rank's rows through the model in turn
// (with that rank's configure()) and adds 1/world of each one's grads.
inline LoopResult run_reference_loop(const ModelFactory& make, const LoopOptions& o) {
  LoopResult result;
  runtime::run_cpu_ranks(1, {}, [&](int, Device& d, std::shared_ptr<Comm>) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, DType::F32};
    std::unique_ptr<LoopModel> model = make();
    std::vector<optim::ParamSpan> spans;
    std::vector<Tensor> grads;
    const float scale = 1.0f / static_cast<float>(o.world);
    for (Param* p : model->all_params()) {
      p->value = empty_tensor(d, s, DType::F32, p->rows(), p->cols(), MemTag::ShardedState);
      d.copy_from_host(s, p->value.data, p->init_values().data(), p->numel() * sizeof(float));
      grads.push_back(empty_tensor(d, s, DType::F32, p->rows(), p->cols(), MemTag::ShardedState));
      d.fill(s, grads.back().data, DType::F32, p->numel(), 0.0f);
      float* g = grads.back().as<float>();
      p->grad_sink = [g, scale](RunContext& c, Param& q, Tensor t) {
        c.device->accumulate(c.compute, g, t.data, t.dtype, q.numel(), scale);
      };
      spans.push_back({p->value.as<float>(), g, p->numel()});
    }
    optim::OptimizerConfig oc;
    oc.kind = o.optimizer;
    optim::Optimizer optimizer(d, s, spans, oc);
    float* loss = static_cast<float*>(d.alloc(sizeof(float), s, MemTag::Other));
    for (int step = 0; step < o.steps; ++step) {
      double sum = 0;
      for (int mb = 0; mb < o.micro_batches; ++mb)
        for (int r = 0; r < o.world; ++r) {
          model->configure(r, step, mb);
          const int64_t rows = o.tokens, dim = model->dim();
          Tensor x = empty_tensor(d, s, DType::F32, rows, dim, MemTag::Activation);
          d.synthetic_batch(s, x.data, DType::F32, rows, dim, 7, step * o.micro_batches + mb,
                            r * rows, nn::kDataBound);
          Tensor y = model->forward(ctx, x);
          Tensor dy = empty_tensor(d, s, DType::F32, y.rows, y.cols, MemTag::Activation);
          d.mean_square_loss(s, y.data, DType::F32, y.numel(), loss, dy.data);
          model->backward(ctx, dy, /*input_grad=*/false);
          sum += host_copy(d, s, loss, 1)[0];
        }
      optimizer.step(s);
      optimizer.zero_grad(s);
      result.losses.push_back(static_cast<float>(sum / (o.world * o.micro_batches)));
    }
    for (Param* p : model->all_params()) result.params.push_back(host_copy(d, s, p->value.data, p->numel()));
    d.free(loss, s);
    d.synchronize();
    for (Param* p : model->all_params()) p->value = Tensor{};
  });
  return result;
}

// ---- small models

// y = relu(x W^T) per unit, units "layers.i" in a chain.
class ChainModel : public LoopModel {
 public:
  ChainModel(int layers, int64_t dim) : LoopModel("Chain"), dim_(dim) {
    for (int i = 0; i < layers; ++i) {
      auto block = std::make_unique<nn::Sequential>();
      block->append(std::make_unique<nn::Linear>(dim, dim, false, 100 + i));
      block->append(std::make_unique<nn::Act>(Activation::ReLU));
      blocks_.push_back(&add_child("layers." + std::to_string(i), std::move(block)));
    }
  }
  std::vector<Module*> units() override { return blocks_; }
  int64_t dim() const override { return dim_; }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override {
    Tensor h = x;
    for (Module* b : blocks_) h = b->forward(ctx, h);
    return h;
  }
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override {
    Tensor g = dy;
    for (size_t i = blocks_.size(); i-- > 0;) g = blocks_[i]->backward(ctx, g, input_grad || i > 0);
    return g;
  }

 private:
  int64_t dim_;
  std::vector<Module*> blocks_;
};

// A root with a head and two branch units: y = head(a(x) + b(x)). Forward is the same on
// every rank; backward may leave b out on one rank (skip_rank) or on all (b_in_backward), as
// a branch taken by some ranks only does. b may also sit out whole steps (odd steps when
// b_every_step is false), forward included, on every rank.
class BranchModel : public LoopModel {
 public:
  explicit BranchModel(int64_t dim) : LoopModel("Branches"), dim_(dim) {
    a_ = &add_child("a", std::make_unique<nn::Linear>(dim, dim, false, 201));
    b_ = &add_child("b", std::make_unique<nn::Linear>(dim, dim, false, 202));
    head_ = &add_child("head", std::make_unique<nn::Linear>(dim, dim, false, 203));
  }
  int skip_rank = -1;
  bool b_in_backward = true;
  bool b_every_step = true;

  std::vector<Module*> units() override { return {a_, b_}; }
  int64_t dim() const override { return dim_; }
  void configure(int rank, int step, int) override {
    run_b_ = b_every_step || step % 2 == 0;
    backward_b_ = run_b_ && b_in_backward && rank != skip_rank;
  }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override {
    Tensor h = a_->forward(ctx, x);
    if (run_b_) {
      Tensor z = b_->forward(ctx, x);
      ctx.device->add(ctx.compute, h.data, h.data, z.data, h.dtype, h.numel());
    }
    return head_->forward(ctx, h);
  }
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override {
    Tensor dh = head_->backward(ctx, dy);
    if (backward_b_) b_->backward(ctx, dh, input_grad);
    return a_->backward(ctx, dh, input_grad);
  }

 private:
  int64_t dim_;
  Module *a_, *b_, *head_;
  bool run_b_ = true, backward_b_ = true;
};

// A unit whose weight is used twice (tied): y = ((x W^T) W^T) V^T. Its backward hands W two
// grads, which FSDP must sum, before V's (the group's last param) completes the group.
class TiedUnit : public Module {
 public:
  TiedUnit(int64_t dim, uint64_t seed) : Module("TiedUnit"), dim_(dim) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(dim));
    add_param("weight", {dim, dim}, nn::uniform_init(seed, dim * dim, bound));
    add_param("proj", {dim, dim}, nn::uniform_init(seed + 1, dim * dim, bound));
  }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override {
    x_ = x;
    h_ = linear(ctx, x, params()[0]->value);
    u_ = linear(ctx, h_, params()[0]->value);
    return linear(ctx, u_, params()[1]->value);
  }
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override {
    Param& w = *params()[0];
    Param& v = *params()[1];
    Tensor du = input_grad_of(ctx, dy, v.value);
    Tensor dh = input_grad_of(ctx, du, w.value);
    w.set_grad(ctx, weight_grad(ctx, du, h_));  // the second use
    w.set_grad(ctx, weight_grad(ctx, dh, x_));  // the first use
    Tensor dx = input_grad ? input_grad_of(ctx, dh, w.value) : Tensor{};
    v.set_grad(ctx, weight_grad(ctx, dy, u_));
    x_ = h_ = u_ = Tensor{};
    return dx;
  }

 private:
  Tensor linear(RunContext& ctx, const Tensor& x, const Tensor& w) {  // x w^T
    Tensor y = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, x.rows, dim_, MemTag::Activation);
    ctx.device->gemm(ctx.compute, false, true, x.rows, dim_, dim_, 1.0f, x.data, w.data,
                     ctx.act_dtype, 0.0f, y.data, y.dtype);
    return y;
  }
  Tensor input_grad_of(RunContext& ctx, const Tensor& dy, const Tensor& w) {  // dy w
    Tensor dx = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, dy.rows, dim_, MemTag::Activation);
    ctx.device->gemm(ctx.compute, false, false, dy.rows, dim_, dim_, 1.0f, dy.data, w.data,
                     ctx.act_dtype, 0.0f, dx.data, dx.dtype);
    return dx;
  }
  Tensor weight_grad(RunContext& ctx, const Tensor& dy, const Tensor& x) {  // dy^T x
    Tensor dw = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, dim_, dim_, MemTag::Grad);
    ctx.device->gemm(ctx.compute, true, false, dim_, dim_, x.rows, 1.0f, dy.data, x.data,
                     ctx.act_dtype, 0.0f, dw.data, dw.dtype);
    return dw;
  }

  int64_t dim_;
  Tensor x_, h_, u_;
};

// layers.0: a tied unit; layers.1: an ordinary Linear.
class TiedModel : public LoopModel {
 public:
  explicit TiedModel(int64_t dim) : LoopModel("Tied"), dim_(dim) {
    tied_ = &add_child("layers.0", std::make_unique<TiedUnit>(dim, 301));
    last_ = &add_child("layers.1", std::make_unique<nn::Linear>(dim, dim, false, 302));
  }
  std::vector<Module*> units() override { return {tied_, last_}; }
  int64_t dim() const override { return dim_; }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override {
    return last_->forward(ctx, tied_->forward(ctx, x));
  }
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override {
    return tied_->backward(ctx, last_->backward(ctx, dy), input_grad);
  }

 private:
  int64_t dim_;
  Module *tied_, *last_;
};

// ||a - b|| / ||b|| over all params.
inline double loop_relative_error(const std::vector<std::vector<float>>& a,
                                  const std::vector<std::vector<float>>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    for (size_t j = 0; j < a[i].size() && j < b[i].size(); ++j) {
      const double d = static_cast<double>(a[i][j]) - b[i][j];
      diff += d * d;
      norm += static_cast<double>(b[i][j]) * b[i][j];
    }
  return std::sqrt(diff / (norm > 0 ? norm : 1));  // NaN when a holds a NaN
}

// Losses at every step and params after the last, within `tol` (relative) of the reference.
inline void expect_matches_reference(const LoopResult& got, const LoopResult& ref, double tol,
                                     const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  ASSERT_EQ(got.params.size(), ref.params.size()) << what;
  for (size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], tol * std::abs(ref.losses[s]) + 1e-7)
        << what << ": step " << s;
  EXPECT_LE(loop_relative_error(got.params, ref.params), tol) << what;
}

}  // namespace fsdp::testing
