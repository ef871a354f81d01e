// TrainConfig's rules, in the API's own terms (Note [Options checked once]): train_rank
// checks its config here before any collective, and the command line runs the same check
// before it starts a rank, naming its flags instead.
#include "fsdp/error.h"
#include "models/model_family.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

namespace {

template <typename... Parts>
void option_check(bool ok, const char* option, const Parts&... rest) {
  if (!ok) throw OptionError(option, detail::concat(rest...));
}

}  // namespace

void check_train_config(const TrainConfig& c, int world_size) {
  option_check(c.steps >= 1, "steps", " must be >= 1, got ", c.steps);
  option_check(c.tokens >= 1, "tokens", " must be >= 1, got ", c.tokens);
  option_check(c.micro_batches >= 1, "micro_batches", " must be >= 1, got ", c.micro_batches);
  check_reduce_scatter_max_input_buffers(c.rs_max_input_buffers);
  option_check(!(c.optimizer_in_backward && c.optimizer.max_grad_norm > 0), "optimizer_in_backward",
               " cannot clip gradients (clipping needs every gradient before any step): turn "
               "clipping off or the optimizer in backward off");
  option_check(!(c.optimizer_in_backward && c.optimizer_in_forward), "optimizer_in_forward",
               " and the optimizer in backward exclude each other: the optimizer runs in "
               "backward or in forward, not both");
  const nn::ModelConfig model = models::resolved(c.model);  // the family's size checks
  const models::ModelFamily& family = models::family(model.kind);
  if (family.batch_kind() == models::BatchKind::Tokens)
    option_check(c.tokens % model.seq_len == 0, "tokens", " (", c.tokens,
                 ") must be a multiple of the sequence length (", model.seq_len, ")");
  // Note [Activation checkpointing]: full on any family's blocks, selective where the
  // family says what is cheap to make again.
  nn::check_activation_checkpoint(c.activation_checkpoint);
  if (c.activation_checkpoint.mode == ActivationCheckpoint::Selective) {
    const std::string why = family.selective_checkpoint_refusal();
    option_check(why.empty(), "activation_checkpoint", " selective: ", why);
  }
  if (c.cuda_graph) {
    const std::string why = family.capture_refusal(model);  // Note [Captured steps]
    FSDP_USER_CHECK(why.empty(), why);
  }
  // HSDP (docs/hsdp.md) and the post-forward mesh (Note [Post-forward mesh]).
  const int replicas = c.hsdp_replicas;
  option_check(replicas >= 0, "hsdp_replicas", " must be >= 1 (replicas), got ", replicas);
  option_check(world_size % std::max(replicas, 1) == 0, "hsdp_replicas", " ", replicas,
               " must divide the world size ", world_size);
  const int ep = family.expert_parallel_size(model);
  option_check(replicas <= 1 || ep == 1, "hsdp_replicas",
               " with expert parallelism (ep ", ep, ") is not supported yet: use one of the two");
  option_check(world_size % ep == 0, "ep", " (", ep, ") must divide the number of ranks (",
               world_size, ")");
  const int shard = world_size / std::max(replicas, 1);
  const int n = c.reshard_after_forward_size;
  option_check(n == 0 || shard % n == 0, "reshard_after_forward_size", " ", n,
               " must divide the shard size ", shard,
               replicas > 1 ? " (the world size / the replicas)" : " (the world size)");
}

}  // namespace fsdp::runtime
