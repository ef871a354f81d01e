#include "runtime/memory_estimate.h"

#include <algorithm>

#include "models/model_family.h"

namespace fsdp::runtime {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

MemoryEstimate estimate_rank_memory(const TrainConfig& c, int shard_ranks) {
  const int world = std::max(shard_ranks, 1);
  nn::ModelConfig model_config = models::resolved(c.model);
  const models::ModelFamily& family = models::family(model_config.kind);
  const int ep = family.expert_parallel_size(model_config);
  std::unique_ptr<nn::Model> model = models::build_model(model_config);  // no values made
  const std::vector<int64_t> units = models::unit_param_counts(*model);

  // The experts of a rank (E / ep of them) shard over world / ep ranks, the rest over world.
  int64_t expert_params = 0;
  if (const auto is_expert = family.expert_modules())
    model->visit([&](Module& m) {
      if (is_expert(m))
        for (const auto& p : m.params()) expert_params += p->numel();
    });
  const int expert_world = std::max(world / std::max(ep, 1), 1);

  const int64_t p = dtype_size(c.param_dtype), r = dtype_size(c.reduce_dtype);
  // docs/memory.md: the sharded fp32 param and grad, and the optimizer's states per element.
  const int64_t states = c.optimizer.kind == "adamw" ? 2 : 1;
  // The root stays gathered from its forward to its backward (FSDP2's default for the root);
  // of the blocks, the largest and the next (the one prefetched beside it) are gathered at
  // once.
  int64_t largest = 0, second = 0, total = 0;
  const int64_t root = ceil_div(units.back(), world) * world;
  for (size_t i = 0; i + 1 < units.size(); ++i) {
    const int64_t gathered = ceil_div(units[i], world) * world;
    if (gathered > largest) {
      second = largest;
      largest = gathered;
    } else {
      second = std::max(second, gathered);
    }
  }
  for (int64_t n : units) total += n;
  const int64_t dense_params = total - expert_params;
  const int64_t shard_numel = ceil_div(dense_params, world) + ceil_div(expert_params, expert_world);
  // Note [Optimizer offload]: the states leave the device.
  const int64_t sharded = shard_numel * (2 + (c.offload_optimizer ? 0 : states)) * 4;
  // Two units gathered (the one computing, the one prefetched), one unit's unsharded grads,
  // the ring's k RS inputs; without reshard after forward every unit stays gathered.
  const int64_t gathered = c.reshard_after_forward ? root + largest + second : total;
  largest = std::max(largest, root);  // the largest unit's grads and RS input
  const int64_t rs_inputs = world > 1 ? c.rs_max_input_buffers * largest * r : 0;
  const double tokens = static_cast<double>(c.tokens);
  const double act = static_cast<double>(p);
  // What every block keeps under its checkpointing mode (Note [Activation checkpointing]),
  // and the last block's whole set, which its backward holds (made again first when it is
  // checkpointed).
  const int layers = model_config.layers;
  double kept = 0;
  for (int i = 0; i < layers; ++i)
    kept += family.block_saved_bytes_per_token(model_config, i, c.param_dtype,
                                               c.activation_checkpoint.of_block(i));
  const double last_kept = family.block_saved_bytes_per_token(
      model_config, layers - 1, c.param_dtype, c.activation_checkpoint.of_block(layers - 1));
  const double last_whole = family.block_saved_bytes_per_token(
      model_config, layers - 1, c.param_dtype, ActivationCheckpoint::None);
  // The root's output and its gradient, and the loss's fp32 work per output; the first
  // block's input, and the gradient that backward passes from block to block with the one it
  // makes.
  const double d = static_cast<double>(model_config.dim);
  const double head = tokens * static_cast<double>(model->output_dim()) * (2 * act + 4);
  const double passed = tokens * 3 * d * act;
  // The peak comes in the last block's backward: every other block's saved activations, and
  // the last block's, about half of which it has freed by the time its grads are all made.
  const double activations = tokens * (kept - last_kept + 0.5 * last_whole) + head + passed;
  MemoryEstimate e;
  e.device_bytes = sharded + (gathered + largest) * p + rs_inputs + static_cast<int64_t>(activations);
  e.host_bytes = total * 4;  // each param's fp32 initial values, made while sharding
  // Note [Optimizer offload]: a master and the states per element, two grad slots of the
  // largest unit's shard.
  if (c.offload_optimizer)
    e.host_bytes += shard_numel * (1 + states) * 4 + optim::kOffloadGradSlots * (largest / world) * 4;
  return e;
}

}  // namespace fsdp::runtime
