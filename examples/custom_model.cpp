// A model of one's own, sharded with FSDP and trained a few steps: a two-layer MLP written as
// a Module subclass (its params, forward and backward), through the public API only.
//
//   custom_model [cpu|cuda] [ranks]     cpu: ranks as threads (default 2); cuda: 1 per GPU
// Exits non-zero unless the loss went down.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/launch.h"
#include "fsdp/optim.h"
#include "fsdp/synthetic.h"

namespace {

using namespace fsdp;

// y = relu(x W1^T) W2^T. The module registers its params; FSDP gathers them into
// Param::value before forward and backward, and reduce-scatters what set_grad receives.
class TwoLayerMlp : public Module {
 public:
  TwoLayerMlp(int64_t dim, int64_t hidden) : Module("TwoLayerMlp"), dim_(dim), hidden_(hidden) {
    add_param("w1", {hidden, dim}, init(1, hidden * dim, dim));
    add_param("w2", {dim, hidden}, init(2, dim * hidden, hidden));
  }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override {
    Device& d = *ctx.device;
    x_ = x;
    h_ = empty_tensor(d, ctx.compute, ctx.act_dtype, x.rows, hidden_, MemTag::Activation);
    d.gemm_relu(ctx.compute, false, true, x.rows, hidden_, dim_, x.data, w1().value.data,
                ctx.act_dtype, h_.data, h_.dtype);
    Tensor y = empty_tensor(d, ctx.compute, ctx.act_dtype, x.rows, dim_, MemTag::Activation);
    d.gemm(ctx.compute, false, true, x.rows, dim_, hidden_, 1.0f, h_.data, w2().value.data,
           ctx.act_dtype, 0.0f, y.data, y.dtype);
    return y;
  }

  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override {
    Device& d = *ctx.device;
    const Stream s = ctx.compute;
    const DType t = ctx.act_dtype;
    const int64_t rows = dy.rows;
    // dW2 = dy^T h;  dh = dy W2, through the ReLU (h > 0 where its input was).
    Tensor dw2 = empty_tensor(d, s, t, dim_, hidden_, MemTag::Grad);
    d.gemm(s, true, false, dim_, hidden_, rows, 1.0f, dy.data, h_.data, t, 0.0f, dw2.data, t);
    Tensor dh = empty_tensor(d, s, t, rows, hidden_, MemTag::Activation);
    d.gemm(s, false, false, rows, hidden_, dim_, 1.0f, dy.data, w2().value.data, t, 0.0f, dh.data, t);
    Tensor dpre = empty_tensor(d, s, t, rows, hidden_, MemTag::Activation);
    d.activation_backward(s, Activation::ReLU, h_.data, dh.data, dpre.data, t, dh.numel());
    // dW1 = dpre^T x;  dx = dpre W1 (skipped when nobody needs it).
    Tensor dw1 = empty_tensor(d, s, t, hidden_, dim_, MemTag::Grad);
    d.gemm(s, true, false, hidden_, dim_, rows, 1.0f, dpre.data, x_.data, t, 0.0f, dw1.data, t);
    Tensor dx;
    if (input_grad) {
      dx = empty_tensor(d, s, t, rows, dim_, MemTag::Activation);
      d.gemm(s, false, false, rows, dim_, hidden_, 1.0f, dpre.data, w1().value.data, t, 0.0f,
             dx.data, t);
    }
    w2().set_grad(ctx, std::move(dw2));
    w1().set_grad(ctx, std::move(dw1));
    x_ = h_ = Tensor{};
    return dx;
  }

 private:
  Param& w1() const { return *params()[0]; }
  Param& w2() const { return *params()[1]; }
  // The same values on every rank, whatever the world size: Uniform(-1/sqrt(fan_in), ...).
  static std::vector<float> init(uint64_t seed, int64_t n, int64_t fan_in) {
    std::vector<float> v(static_cast<size_t>(n));
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    for (int64_t i = 0; i < n; ++i) v[i] = synthetic_uniform(seed, static_cast<uint64_t>(i), bound);
    return v;
  }

  int64_t dim_, hidden_;
  Tensor x_, h_;  // kept from forward for backward
};

void train(int rank, Device& device, std::shared_ptr<Comm> world, bool& loss_went_down) {
  constexpr int64_t kDim = 32, kHidden = 64, kTokens = 16;
  constexpr int kSteps = 8;
  const Stream compute = device.create_stream("compute", StreamPriority::Normal);
  RunContext ctx{&device, compute, DType::F32};

  TwoLayerMlp model(kDim, kHidden);
  Mesh mesh("dp", device, world);
  FsdpModule& root = fully_shard(model, mesh);  // one unit: both layers' params, sharded

  std::vector<optim::ParamSpan> shards;
  for (const ShardedGroupView& g : sharded_groups(root)) shards.push_back({g.param, g.grad, g.numel});
  optim::Optimizer optimizer(device, compute, shards, {});  // AdamW, lr 1e-3

  float* loss = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  float* mean_loss = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  float first = 0, last = 0;
  for (int step = 0; step < kSteps; ++step) {
    // This rank's rows of the step's global batch; the loss pulls the output towards 0.
    Tensor x = empty_tensor(device, compute, DType::F32, kTokens, kDim, MemTag::Activation);
    device.synthetic_batch(compute, x.data, DType::F32, kTokens, kDim, /*seed=*/7, step,
                           rank * kTokens, 1.0f);
    Tensor y = model.forward(ctx, x);
    Tensor dy = empty_tensor(device, compute, DType::F32, y.rows, y.cols, MemTag::Activation);
    device.mean_square_loss(compute, y.data, y.dtype, y.numel(), loss, dy.data);
    model.backward(ctx, dy, /*input_grad=*/false);
    optimizer.step(compute);
    zero_sharded_grads(root);
    world->all_reduce(loss, mean_loss, 1, DType::F32, ReduceOp::Avg, compute);
    float value = 0;
    device.copy_to_host(compute, &value, mean_loss, sizeof value);
    device.synchronize_stream(compute);
    if (step == 0) first = value;
    last = value;
    if (rank == 0) std::printf("step %d  loss %.6f\n", step, value);
  }
  device.free(loss, compute);
  device.free(mean_loss, compute);
  loss_went_down = last < first;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "cpu";
  const int ranks = argc > 2 ? std::atoi(argv[2]) : (backend == "cpu" ? 2 : 0);
  try {
    bool ok = false;
    if (backend == "cuda") {
      // Each rank is its own process: one whose loss did not go down fails the launch.
      fsdp::run_cuda_ranks(ranks, [](int rank, fsdp::Device& d, std::shared_ptr<fsdp::Comm> w) {
        bool went_down = false;
        train(rank, d, std::move(w), went_down);
        FSDP_CHECK(went_down, "the loss did not go down");
      });
      ok = true;
    } else {
      fsdp::run_cpu_ranks(ranks, [&](int rank, fsdp::Device& d, std::shared_ptr<fsdp::Comm> w) {
        bool went_down = false;
        train(rank, d, std::move(w), went_down);
        if (rank == 0) ok = went_down;
      });
    }
    std::printf("%s\n", ok ? "loss went down" : "the loss did not go down");
    return ok ? 0 : 1;
  } catch (const fsdp::Error& e) {
    std::fprintf(stderr, "custom_model: %s\n", e.what());
    return 1;
  }
}
