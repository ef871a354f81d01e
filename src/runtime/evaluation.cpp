#include "runtime/evaluation.h"

#include "runtime/step_parts.h"

namespace fsdp::runtime {

float evaluate(Device& device, Comm& world, RunContext& ctx, nn::Model& model,
               BatchSource& source, int64_t batches, int64_t first_row, int64_t rows, int step) {
  float* scratch = static_cast<float*>(device.alloc(3 * sizeof(float), ctx.compute, MemTag::Other));
  float* loss = scratch;
  float* loss_avg = scratch + 1;
  float* mean = scratch + 2;
  device.fill(ctx.compute, mean, DType::F32, 1, 0.0f);
  for (int64_t k = 0; k < batches; ++k) {
    DeviceBatch batch =
        make_step_batch(source, step, device, ctx.compute, k, first_row, rows, ctx.act_dtype);
    Tensor y = model.forward(ctx, batch.x);
    loss_and_grad(device, ctx.compute, model, y, batch, loss);
    device.set_label("eval loss all-reduce");
    world.all_reduce(loss, loss_avg, 1, DType::F32, ReduceOp::Avg, ctx.compute);
    device.accumulate(ctx.compute, mean, loss_avg, DType::F32, 1, 1.0f / static_cast<float>(batches));
  }
  float value = 0;
  device.copy_to_host(ctx.compute, &value, mean, sizeof(float));
  device.synchronize_stream(ctx.compute);
  device.free(scratch, ctx.compute);
  return value;
}

}  // namespace fsdp::runtime
