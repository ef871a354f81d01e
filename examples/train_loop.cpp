// The shortest full training loop with the library's modules: a stack of residual MLP blocks,
// each block its own FSDP unit, bf16 compute with fp32 master weights, AdamW.
//
//   train_loop [cpu|cuda] [ranks]     cpu: ranks as threads (default 2); cuda: 1 per GPU
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/launch.h"
#include "fsdp/nn/layers.h"
#include "fsdp/optim.h"

using namespace fsdp;

void train(int rank, Device& device, std::shared_ptr<Comm> world) {
  constexpr int64_t kDim = 64, kTokens = 32;
  const Stream compute = device.create_stream("compute", StreamPriority::Normal);
  RunContext ctx{&device, compute, DType::BF16};  // activations and gathered params in bf16

  nn::Sequential model;
  for (int i = 0; i < 3; ++i)
    model.append(std::make_unique<nn::ResidualMlp>(kDim, 2 * kDim, Activation::GELU, 100 + i));

  Mesh mesh("dp", device, world);
  FullyShardOptions options;
  options.mp_policy = {DType::BF16, DType::F32};  // compute in bf16, reduce in fp32
  for (const auto& block : model.children()) fully_shard(*block, mesh, options);
  FsdpModule& root = fully_shard(model, mesh, options);

  std::vector<optim::ParamSpan> shards;
  for (const ShardedGroupView& g : sharded_groups(root)) shards.push_back({g.param, g.grad, g.numel});
  optim::OptimizerConfig adamw;
  adamw.adamw.lr = 3e-3f;
  optim::Optimizer optimizer(device, compute, shards, adamw);

  float* loss = static_cast<float*>(device.alloc(2 * sizeof(float), compute, MemTag::Other));
  for (int step = 0; step < 5; ++step) {
    Tensor x = empty_tensor(device, compute, DType::BF16, kTokens, kDim, MemTag::Activation);
    device.synthetic_batch(compute, x.data, x.dtype, kTokens, kDim, /*seed=*/1, step,
                           rank * kTokens, 1.0f);
    Tensor y = model.forward(ctx, x);
    Tensor dy = empty_tensor(device, compute, y.dtype, y.rows, y.cols, MemTag::Activation);
    device.mean_square_loss(compute, y.data, y.dtype, y.numel(), loss, dy.data);
    model.backward(ctx, dy, /*input_grad=*/false);
    optimizer.step(compute);
    zero_sharded_grads(root);
    world->all_reduce(loss, loss + 1, 1, DType::F32, ReduceOp::Avg, compute);
    float mean = 0;
    device.copy_to_host(compute, &mean, loss + 1, sizeof mean);
    device.synchronize_stream(compute);
    if (rank == 0) std::printf("step %d  loss %.5f\n", step, mean);
  }
  device.free(loss, compute);
}

int main(int argc, char** argv) {
  const std::string backend = argc > 1 ? argv[1] : "cpu";
  const int ranks = argc > 2 ? std::atoi(argv[2]) : (backend == "cpu" ? 2 : 0);
  try {
    if (backend == "cuda")
      run_cuda_ranks(ranks, train);  // one process per GPU, or this process under torchrun
    else
      run_cpu_ranks(ranks, train);  // ranks as threads
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "train_loop: %s\n", e.what());
    return 1;
  }
}
