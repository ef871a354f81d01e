// A module that gives some params no grad in some steps: its group is reduce-scattered at the
// root's finalize with zeros for them, on every rank alike, and training matches an unsharded
// run. Drives the public API by hand (fully_shard, forward/backward, sharded_groups).
#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "fsdp/nn/layers.h"
#include "fsdp/optim.h"
#include "runtime/launch.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

// y = x W1^T, and W2 is used (y += x W2^T) only on even steps: on odd steps W2 gets no grad.
class SometimesUnused : public Module {
 public:
  explicit SometimesUnused(int64_t dim) : Module("SometimesUnused") {
    add_child("used", std::make_unique<nn::Linear>(dim, dim, false, 11));
    add_child("sometimes", std::make_unique<nn::Linear>(dim, dim, false, 12));
  }
  bool use_second = true;

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override {
    Tensor y = children()[0]->forward(ctx, x);
    if (use_second) {
      Tensor z = children()[1]->forward(ctx, x);
      ctx.device->add(ctx.compute, y.data, y.data, z.data, y.dtype, y.numel());
    }
    return y;
  }
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool) override {
    if (use_second) children()[1]->backward(ctx, dy);
    return children()[0]->backward(ctx, dy);
  }
};

// Trains 4 steps on `world` ranks (FSDP) or on one rank without FSDP (world 0); returns the
// full params of rank 0.
std::vector<std::vector<float>> train(int world) {
  const int64_t dim = 9, tokens = 4;
  std::vector<std::vector<float>> out;
  runtime::run_cpu_ranks(std::max(world, 1), {}, [&](int rank, Device& d, std::shared_ptr<Comm> comm) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, DType::F32};
    SometimesUnused model(dim);
    std::vector<optim::ParamSpan> spans;
    std::vector<Tensor> local_grads;
    std::unique_ptr<Mesh> mesh;
    FsdpModule* root = nullptr;
    if (world > 0) {
      mesh = std::make_unique<Mesh>("dp", d, comm);
      root = &fully_shard(model, *mesh);
      for (const ShardedGroupView& g : sharded_groups(*root)) spans.push_back({g.param, g.grad, g.numel});
    } else {  // the unsharded reference
      for (Param* p : model.all_params()) {
        p->value = empty_tensor(d, s, DType::F32, p->rows(), p->cols(), MemTag::ShardedState);
        d.copy_from_host(s, p->value.data, p->init_values().data(), p->numel() * 4);
        local_grads.push_back(empty_tensor(d, s, DType::F32, p->rows(), p->cols(), MemTag::ShardedState));
        d.fill(s, local_grads.back().data, DType::F32, p->numel(), 0.0f);
        float* g = local_grads.back().as<float>();
        p->grad_sink = [g](RunContext& c, Param& q, Tensor t) {
          c.device->accumulate(c.compute, g, t.data, t.dtype, q.numel(), 1.0f);
        };
        spans.push_back({p->value.as<float>(), g, p->numel()});
      }
    }
    optim::Optimizer opt(d, s, spans, {});
    for (int step = 0; step < 4; ++step) {
      model.use_second = step % 2 == 0;
      const int64_t rows = world > 0 ? tokens : tokens * 2;  // the reference sees both ranks' rows
      Tensor x = empty_tensor(d, s, DType::F32, rows, dim, MemTag::Activation);
      d.synthetic_batch(s, x.data, DType::F32, rows, dim, 5, step, world > 0 ? rank * tokens : 0, 1.0f);
      Tensor y = model.forward(ctx, x);
      Tensor dy = empty_tensor(d, s, DType::F32, rows, dim, MemTag::Activation);
      float* loss = static_cast<float*>(d.alloc(4, s, MemTag::Other));
      d.mean_square_loss(s, y.data, DType::F32, y.numel(), loss, dy.data);
      model.backward(ctx, dy, false);
      opt.step(s);
      if (root) zero_sharded_grads(*root); else opt.zero_grad(s);
      d.free(loss, s);
      d.synchronize();
    }
    if (rank == 0) {
      if (root) {
        out = gather_full_params(*root, s);
      } else {
        for (Param* p : model.all_params()) {
          out.emplace_back(static_cast<size_t>(p->numel()));
          d.copy_to_host(s, out.back().data(), p->value.data, p->numel() * 4);
        }
      }
    } else if (root) {
      gather_full_params(*root, s);  // collective: every rank takes part
    }
    d.synchronize();
    for (Param* p : model.all_params()) p->value = Tensor{};
  });
  return out;
}

TEST(UnusedParams, ZeroGradsAreReducedAtFinalizeAndTrainingMatchesTheReference) {
  const auto ref = train(0);
  const auto sharded = train(2);
  ASSERT_EQ(sharded.size(), ref.size());
  EXPECT_LE(relative_error(sharded, ref), 1e-6);
}

}  // namespace
}  // namespace fsdp::testing
