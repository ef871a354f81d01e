// The unsharded reference that the parity tests compare FSDP with: one rank, no FSDP, fp32,
// the same model, batches, loss and optimizer.
#include "models/model_family.h"
#include "runtime/step_parts.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

RankResult train_local_reference(Device& device, const TrainConfig& config, int world_size) {
  FSDP_CHECK(config.param_dtype == DType::F32, "the local reference runs in fp32 only");
  RankResult result;
  const Stream compute = device.create_stream("compute", StreamPriority::Normal);
  RunContext ctx{&device, compute, DType::F32};
  nn::ModelConfig model_config = config.model;
  model_config.ep = 1;  // every expert here
  model_config.moe_group_tokens = config.tokens;  // route each rank's tokens as its own group
  std::unique_ptr<nn::Model> built = models::build_model(model_config);
  nn::Model& model = *built;
  nn::enable_fp8(model, config.fp8);
  std::vector<optim::ParamSpan> spans;
  std::vector<Tensor> grads;
  std::vector<std::string> names;  // fqns, in all_params() order
  model.visit([&](Module& m) {
    for (const auto& p : m.params()) names.push_back(m.fqn().empty() ? p->name() : m.fqn() + "." + p->name());
  });
  for (Param* p : model.all_params()) {
    p->value = empty_tensor(device, compute, DType::F32, p->rows(), p->cols(), MemTag::ShardedState);
    device.copy_from_host(compute, p->value.data, p->init_values().data(), p->numel() * sizeof(float));
    grads.push_back(empty_tensor(device, compute, DType::F32, p->rows(), p->cols(), MemTag::ShardedState));
    device.fill(compute, grads.back().data, DType::F32, p->numel(), 0.0f);
    float* g = grads.back().as<float>();
    p->grad_sink = [g](RunContext& c, Param& param, Tensor t) {
      c.device->accumulate(c.compute, g, t.data, t.dtype, param.numel(), 1.0f);
    };
    spans.push_back({p->value.as<float>(), g, p->numel(), nullptr, names[spans.size()]});
  }
  optim::Optimizer optimizer(device, compute, spans, config.optimizer);
  std::unique_ptr<BatchSource> source = make_source(config, 0, 1);
  float* loss = static_cast<float*>(device.alloc(sizeof(float), compute, MemTag::Other));
  const int64_t rows = config.tokens * world_size;
  Tensor micro_scale;
  for (int step = 0; step < config.steps; ++step) {
    optimizer.begin_step(compute, config.schedule.at(step, config.optimizer.base_lr()));
    float loss_sum = 0;
    for (int mb = 0; mb < config.micro_batches; ++mb) {
      DeviceBatch batch = source->make(device, compute,
                                       static_cast<int64_t>(step) * config.micro_batches + mb, 0,
                                       rows, DType::F32);
      Tensor y = model.forward(ctx, batch.x);
      Tensor dy = loss_and_grad(device, compute, model, y, batch, loss);
      model.add_aux_loss(device, compute, loss);  // Note [MoE routing]
      scale_for_micro_batches(device, compute, dy, config.micro_batches, micro_scale);
      // Each rank's loss is a mean over its own rows, and FSDP averages the ranks: the same
      // as the mean over all rows.
      model.backward(ctx, dy, /*input_grad=*/false);  // the data needs no gradient
      float value = 0;
      device.copy_to_host(compute, &value, loss, sizeof(float));
      device.synchronize_stream(compute);
      loss_sum += value;
    }
    optimizer.compute_grad_squares(compute);
    optimizer.step(compute);
    optimizer.zero_grad(compute);
    std::vector<float> squares(optimizer.grad_square_names().size());
    device.copy_to_host(compute, squares.data(), optimizer.grad_squares(), squares.size() * sizeof(float));
    device.synchronize();
    result.losses.push_back(loss_sum / config.micro_batches);
    result.grad_norms.push_back(global_norm(squares));
  }
  for (Param* p : model.all_params()) {
    std::vector<float> v(static_cast<size_t>(p->numel()));
    device.copy_to_host(compute, v.data(), p->value.data, v.size() * sizeof(float));
    result.params.push_back(std::move(v));
  }
  device.synchronize();
  for (Param* p : model.all_params()) p->value = Tensor{};
  grads.clear();
  device.free(loss, compute);
  result.memory = device.memory_stats();
  return result;
}

}  // namespace fsdp::runtime
