#include "runtime/memory_estimate.h"

#include <algorithm>
#include <set>

#include "fsdp/nn/model.h"
#include "fsdp/optim_offload.h"
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
  std::set<const Param*> experts;
  if (const auto is_expert = family_->expert_modules())
    model->visit([&](Module& m) {
      if (is_expert(m))
        for (const auto& p : m.params()) {
          expert_params_ += p->numel();
          experts.insert(p.get());
        }
    });
  for (Module* block : model->blocks()) {
    int64_t n = 0;
    for (Param* p : block->all_params())
      if (experts.count(p)) n += p->numel();
    block_experts_.push_back(n);
  }
  // Note [Float8 all-gather] in core/param_group_fp8.cpp: tensorwise fp8 weights travel and
  // stay gathered as one byte each.
  unit_fp8_params_.assign(units_.size(), 0);
  if (c.fp8 == Fp8Recipe::Tensorwise && c.fp8_all_gather) {
    nn::enable_fp8(*model, c.fp8);
    const std::vector<Module*> blocks = model->blocks();
    for (size_t i = 0; i < blocks.size() && i < units_.size(); ++i)
      for (Param* p : blocks[i]->all_params())
        if (p->fp8 == Fp8Recipe::Tensorwise) unit_fp8_params_[i] += p->numel();
  }
  expert_world_ = std::max(world_ / std::max(ep, 1), 1);
  for (int64_t n : units_) total_ += n;
}

MemoryEstimate RankMemoryModel::estimate(const TrainConfig& c) const {
  const int world = world_;
  const models::ModelFamily& family = *family_;
  const nn::ModelConfig& m = model_;
  const double p = static_cast<double>(dtype_size(c.param_dtype));
  const double r = static_cast<double>(dtype_size(c.reduce_dtype));
  // docs/memory.md: the sharded fp32 param and grad, and the optimizer's states per element.
  // Note [Optimizer offload]: the states leave the device (the fp32 param and grad stay).
  const int64_t states = c.optimizer.kind == "adamw" ? 2 : 1;
  const int64_t device_states = c.offload_optimizer ? 0 : states;
  const int64_t dense_params = total_ - expert_params_;
  const int64_t shard_numel = ceil_div(dense_params, world) + ceil_div(expert_params_, expert_world_);
  // Note [Grads set to none]: freed after each step, a grad shard lives from its group's
  // reduce-scatter to the optimizer step only; otherwise it is part of the sharded state.
  const bool grads_freed = c.zero_grad_set_to_none;
  const double grads = static_cast<double>(shard_numel) * 4;
  const double sharded = static_cast<double>(shard_numel * (1 + device_states) * 4) +
                         (grads_freed ? 0 : grads);
  // Micro-batches but the last skip the gradient sync: every unit accumulates its unsharded
  // grads in fp32 from the first micro-batch's backward to the last's (the GradAccum tag).
  const double accumulated = c.micro_batches > 1 ? static_cast<double>(total_) * 4 : 0;
  // Each unit gathered (W x its shard, padding included); the blocks, then the root. Its
  // gathered bytes are `gathered_bytes` (p a param, 1 a float8-gathered one); its gradients
  // and reduce-scatter inputs are numels of `gathered`.
  const int blocks = static_cast<int>(units_.size()) - 1;
  std::vector<double> gathered(units_.size()), gathered_bytes(units_.size());
  double largest_block = 0, all_gathered_bytes = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    gathered[i] = static_cast<double>(ceil_div(units_[i], world) * world);
    gathered_bytes[i] = gathered[i] * p - static_cast<double>(unit_fp8_params_[i]) * (p - 1);
    all_gathered_bytes += gathered_bytes[i];
    if (static_cast<int>(i) < blocks) largest_block = std::max(largest_block, gathered[i]);
  }
  const double root = gathered.back();
  // What each block keeps for backward under its checkpointing mode (Note [Activation
  // checkpointing]), its whole set (its backward holds it, made again first when it is
  // checkpointed) and what its backward holds besides (the gradients of its activations).
  const double tokens = static_cast<double>(c.tokens);
  const int layers = std::min(m.layers, blocks);
  std::vector<double> kept(layers);
  double all_kept = 0;
  // Tensorwise fp8: some inputs kept as one-byte codes (ModelFamily::block_fp8_saved_delta...).
  const bool fp8_codes = c.fp8 == Fp8Recipe::Tensorwise;
  auto codes = [&](int i) {
    return fp8_codes ? family.block_fp8_saved_delta_per_token(
                           m, i, c.param_dtype, c.activation_checkpoint.of_block(i))
                     : 0.0;
  };
  for (int i = 0; i < layers; ++i)
    all_kept += kept[i] = family.block_saved_bytes_per_token(
                              m, i, c.param_dtype, c.activation_checkpoint.of_block(i)) +
                          codes(i);
  // The peak comes at one of two moments (docs/memory.md):
  // - the loss: every block's saved set, the logits and their gradient, the final norm's
  //   output; the root gathered and the last block prefetched for its backward (every unit,
  //   without reshard after forward);
  const double d = static_cast<double>(m.dim);
  const double at_loss =
      tokens * (all_kept + static_cast<double>(output_dim_) * 2 * p + d * p) +
      (c.reshard_after_forward
           ? gathered_bytes.back() + (blocks > 0 ? gathered_bytes[blocks - 1] : 0)
           : all_gathered_bytes);
  // - block j's backward, n = L-1-j blocks after the last's: the saved sets of the blocks
  //   before it, its whole set and its backward's work; the root and block j gathered, j-1
  //   prefetched (without reshard after forward: the root and blocks 0..j); the root's grads
  //   and about a quarter of block j's (the FFN's output projection's, made before SwiGLU's
  //   backward); the RS inputs of up to k blocks done (none on one rank: Note [One-rank
  //   reduce-scatter]). n runs to k: past it the ring holds no more, and the saved sets
  //   only shrink.
  // An RS output of its own (shard x r) exists unless the reduce-scatter writes the fp32 grad
  // shard itself (Note [Lazy zero grad]): with a bf16 reduce. (Micro-batches without the sync
  // reduce nothing, so the last one's reduce-scatter writes the shard as one batch's does.)
  const bool rs_output = world > 1 && c.reduce_dtype != DType::F32;
  // With the grads freed, those of the blocks done (their shards) grow through backward, so
  // every block is a candidate, and so is the optimizer step: all grads and nothing else.
  double in_backward = grads_freed ? grads : 0, below = all_kept, reduced = 0, grads_done = 0;
  for (int n = 0; n < layers && (grads_freed || n <= c.rs_max_input_buffers); ++n) {
    const int j = layers - 1 - n;
    below -= kept[j];
    if (n > 0) {
      reduced += static_cast<double>(units_[j + 1]);  // its fp32 accumulator is freed
      if (grads_freed)
        grads_done += 4.0 * static_cast<double>(
                                ceil_div(units_[j + 1] - block_experts_[j + 1], world) +
                                ceil_div(block_experts_[j + 1], expert_world_));
    }
    // A recompute keeps its Linears' bf16 inputs, not codes: only the codes its forward kept.
    const double whole =
        family.block_saved_bytes_per_token(m, j, c.param_dtype, ActivationCheckpoint::None) +
        codes(j);
    const double work = family.block_backward_bytes_per_token(m, j, c.param_dtype);
    double held = gathered_bytes.back() + gathered_bytes[j];  // bytes
    if (c.reshard_after_forward) {
      if (j > 0) held += gathered_bytes[j - 1];
    } else {
      for (int i = 0; i < j; ++i) held += gathered_bytes[i];
    }
    // Inside the block's FFN backward (SwiGLU's gradients live): the root's grads and the FFN
    // output projection's (a quarter of a dense block's params). A block's experts are a
    // group of their own, on their own mesh, whose backward comes first in the block: their
    // grads and their copy into an RS input are held at once, beside the block's whole set
    // and (an upper bound: measured, the peak holds part of it) its backward's work.
    const double experts = static_cast<double>(
        ceil_div(block_experts_[j], expert_world_) * expert_world_);
    const double dense = static_cast<double>(units_[j]) - static_cast<double>(block_experts_[j]);
    const double root_grads = static_cast<double>(units_.back()) * p;
    const double ring = world > 1 ? std::min(n, c.rs_max_input_buffers) * largest_block * r +
                                        (rs_output && n > 0 ? largest_block / world * r : 0)
                                  : 0;
    const double accumulators = accumulated > 0 ? accumulated - 4 * reduced : 0;
    const double before =
        tokens * (below + whole) + held + root_grads + ring + accumulators + grads_done;
    in_backward = std::max(in_backward, before + tokens * work + 0.25 * dense * p);
    if (experts > 0)
      in_backward = std::max(
          in_backward, before + tokens * work + experts * (p + (world > 1 ? r : 0)) +
                           (rs_output ? experts / expert_world_ * r : 0));
  }
  MemoryEstimate e;
  e.device_bytes = static_cast<int64_t>(sharded + std::max(at_loss + accumulated, in_backward));
  e.host_bytes = total_ * 4;  // each param's fp32 initial values, made while sharding
  // Note [Optimizer offload]: a master and the states per element, two grad slots of the
  // largest unit's shard.
  if (c.offload_optimizer)
    e.host_bytes += shard_numel * (1 + states) * 4 +
                    optim::kOffloadGradSlots * static_cast<int64_t>(std::max(largest_block, root) / world) * 4;
  return e;
}

MemoryEstimate estimate_rank_memory(const TrainConfig& config, int shard_ranks) {
  return RankMemoryModel(config, shard_ranks).estimate(config);
}

}  // namespace fsdp::runtime
