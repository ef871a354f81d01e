// unshard(async_op=true) followed at once by reshard(): the all-gather is still writing the
// unsharded buffer when reshard frees it, unless reshard waits for it. On the virtual clock
// with a slow simulated link the all-gather's data lands after a premature free for certain,
// so the checked allocator's write-after-free check catches a missing wait on every run.
#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "fsdp/nn/model.h"
#include "runtime/launch.h"
#include "models/model_family.h"

namespace fsdp {
namespace {

TEST(CpuAsyncUnshard, ReshardRightAfterAnAsyncUnshardWaitsForTheAllGather) {
  cpu::CpuOptions o;
  o.virtual_clock = true;
  o.link_gbps = 1e-3;  // 1 MB/s: every all-gather takes simulated milliseconds
  runtime::run_cpu_ranks(2, o, [](int rank, Device& d, std::shared_ptr<Comm> comm) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, DType::F32};
    nn::ModelConfig mc;
    mc.kind = "mlp";
    mc.layers = 2;
    mc.dim = 8;
    std::unique_ptr<nn::Model> model_built = models::build_model(mc);
  nn::Model& model = *model_built;
    Mesh mesh("dp", d, comm);
    for (Module* block : model.blocks()) fully_shard(*block, mesh);
    fully_shard(model, mesh);
    // One forward and backward so the schedule exists (the blocks end resharded).
    Tensor x = empty_tensor(d, s, DType::F32, 3, mc.dim, MemTag::Activation);
    d.synthetic_batch(s, x.data, DType::F32, 3, mc.dim, 1, 0, rank * 3, 1.0f);
    Tensor y = model.forward(ctx, x);
    model.backward(ctx, y, /*input_grad=*/false);  // any gradient will do
    y = Tensor{};
    d.synchronize();
    FsdpModule& block = *fsdp_module_of(*model.blocks().front());
    for (int round = 0; round < 2; ++round) {
      block.unshard(/*async_op=*/true);
      block.reshard();
    }
    d.synchronize();  // a write into the freed buffers fails here
  });
}

}  // namespace
}  // namespace fsdp
