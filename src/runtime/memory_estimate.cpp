#include "runtime/memory_estimate.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "models/model_family.h"

namespace fsdp::runtime {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

RankMemoryModel::RankMemoryModel(const TrainConfig& c, int shard_ranks)
    : model_(models::resolved(c.model)),
      family_(&models::family(model_.kind)),
      world_(std::max(shard_ranks, 1)) {
  const int ep = family_->expert_parallel_size(model_);
  std::unique_ptr<nn::Model> model = models::build_model(model_);  // no values made
  units_ = models::unit_param_counts(*model);
  output_dim_ = model->output_dim();
  // The experts of a rank (E / ep of them) shard over world / ep ranks, the rest over world.
  if (const auto is_expert = family_->expert_modules())
    model->visit([&](Module& m) {
      if (is_expert(m))
        for (const auto& p : m.params()) expert_params_ += p->numel();
    });
  expert_world_ = std::max(world_ / std::max(ep, 1), 1);
  for (int64_t n : units_) total_ += n;
}

MemoryEstimate RankMemoryModel::estimate(const TrainConfig& c) const {
  const int world = world_;
  const models::ModelFamily& family = *family_;
  const nn::ModelConfig& model_config = model_;
  const std::vector<int64_t>& units = units_;
  const int64_t p = dtype_size(c.param_dtype), r = dtype_size(c.reduce_dtype);
  // docs/memory.md: the sharded fp32 param and grad, and the optimizer's states per element.
  // (The optimizer on the host would move the states and the fp32 param off this term.)
  const int64_t states = c.optimizer.kind == "adamw" ? 2 : 1;
  // The root stays gathered from its forward to its backward (FSDP2's default for the root);
  // of the blocks, the largest and the next (the one prefetched beside it) are gathered at
  // once.
  int64_t largest = 0, second = 0;
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
  const int64_t total = total_;
  const int64_t dense_params = total - expert_params_;
  const int64_t sharded =
      (ceil_div(dense_params, world) + ceil_div(expert_params_, expert_world_)) * (2 + states) * 4;
  // Two units gathered (the one computing, the one prefetched), one unit's unsharded grads,
  // the ring's k RS inputs; without reshard after forward every unit stays gathered.
  const int64_t gathered = c.reshard_after_forward ? root + largest + second : total;
  largest = std::max(largest, root);  // the largest unit's grads and RS input
  const int64_t rs_inputs = world > 1 ? c.rs_max_input_buffers * largest * r : 0;
  // Micro-batches but the last skip the gradient sync: every unit accumulates its unsharded
  // grads in fp32 from the first micro-batch's backward to the last's (the GradAccum tag).
  const int64_t accumulated = c.micro_batches > 1 ? total * 4 : 0;
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
  const double head = tokens * static_cast<double>(output_dim_) * (2 * act + 4);
  const double passed = tokens * 3 * d * act;
  // The peak comes in the last block's backward: every other block's saved activations, and
  // the last block's, about half of which it has freed by the time its grads are all made.
  const double activations = tokens * (kept - last_kept + 0.5 * last_whole) + head + passed;
  if (getenv("FSDP_ESTIMATE_DEBUG"))
    fprintf(stderr, "sharded %lld gathered %lld grads %lld rs %lld accum %lld act %.0f (kept %.0f last %.0f whole %.0f head %.0f passed %.0f)\n",
            (long long)sharded, (long long)(gathered * p), (long long)(largest * p), (long long)rs_inputs,
            (long long)accumulated, activations, tokens * (kept - last_kept), tokens * last_kept, tokens * last_whole, head, passed);
  MemoryEstimate e;
  e.device_bytes = sharded + (gathered + largest) * p + rs_inputs + accumulated +
                   static_cast<int64_t>(activations);
  e.host_bytes = total * 4;  // each param's fp32 initial values, made while sharding
  return e;
}

MemoryEstimate estimate_rank_memory(const TrainConfig& config, int shard_ranks) {
  return RankMemoryModel(config, shard_ranks).estimate(config);
}

}  // namespace fsdp::runtime
