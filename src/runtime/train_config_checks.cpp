// TrainConfig's rules, in the API's own terms (Note [Options checked once]): train_rank
// checks its config here before any collective, and the command line runs the same check
// before it starts a rank, naming its flags instead.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "fsdp/checkpoint.h"
#include "fsdp/error.h"
#include "fsdp/nn/model.h"
#include "models/model_family.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

namespace {

// Note [Model sizes] (src/models/families.cpp): the run's own sizes, beyond any real run.
constexpr int64_t kMaxTokens = int64_t{1} << 32;  // per rank per micro-batch
constexpr int kMaxWorldSize = 1 << 20;
constexpr int kMaxRsInputBuffers = 1 << 10;
constexpr double kMaxActivationBytes = static_cast<double>(int64_t{1} << 60);

}  // namespace

bool grads_outlive_step(const TrainConfig& c) {
  return c.cuda_graph || c.optimizer_in_forward || c.offload_optimizer || c.optimizer_in_backward;
}

void check_train_config(const TrainConfig& c, int world_size) {
  const OptionName tokens{"tokens"};
  FSDP_OPTION_CHECK(c.steps >= 1, OptionName{"steps"}, " must be >= 1, got ", c.steps);
  FSDP_OPTION_CHECK(c.tokens >= 1, tokens, " must be >= 1, got ", c.tokens);
  FSDP_OPTION_CHECK(c.tokens <= kMaxTokens, tokens, " ", c.tokens,
                    " is beyond any real run: at most ", kMaxTokens, " per rank and micro-batch");
  FSDP_OPTION_CHECK(c.micro_batches >= 1, OptionName{"micro_batches"}, " must be >= 1, got ",
                    c.micro_batches);
  FSDP_OPTION_CHECK(world_size >= 1 && world_size <= kMaxWorldSize, OptionName{"world_size"}, " ",
                    world_size, " is outside 1..", kMaxWorldSize);
  check_reduce_scatter_max_input_buffers(c.rs_max_input_buffers);
  FSDP_OPTION_CHECK(c.rs_max_input_buffers <= kMaxRsInputBuffers,
                    OptionName{"reduce_scatter_max_input_buffers"}, " ", c.rs_max_input_buffers,
                    " is beyond any real run: at most ", kMaxRsInputBuffers);
  const OptionName in_backward{"optimizer_in_backward"};
  FSDP_OPTION_CHECK(!(c.optimizer_in_backward && c.optimizer.max_grad_norm > 0), in_backward,
                    " cannot clip gradients (clipping needs every gradient before any step): "
                    "set ", OptionName{"max_grad_norm"}, " to 0 or turn ", in_backward, " off");
  FSDP_OPTION_CHECK(!(c.optimizer_in_backward && c.optimizer_in_forward),
                    OptionName{"optimizer_in_forward"}, " and ", in_backward,
                    " exclude each other: the optimizer runs in backward or in forward, not both");
  // Note [Optimizer offload]: the host steps each group once, after backward.
  const OptionName offload{"offload"};
  FSDP_OPTION_CHECK(!(c.offload_optimizer && c.optimizer_in_backward), offload,
                    " optimizer and ", in_backward, " exclude each other: the step runs on the "
                    "host after the grads are down, not on the device in backward");
  FSDP_OPTION_CHECK(!(c.offload_optimizer && c.optimizer_in_forward), offload,
                    " optimizer and ", OptionName{"optimizer_in_forward"}, " exclude each other: "
                    "with the offload each group's all-gather already waits for its host step");
  FSDP_OPTION_CHECK(!(c.offload_optimizer && c.cuda_graph), offload,
                    " optimizer cannot run in a captured step (", OptionName{"cuda_graph"},
                    "): its host steps and transfers are not graph work");
  // Note [Grads set to none]: the grads must outlive the step, or have fixed addresses.
  if (c.zero_grad_set_to_none && grads_outlive_step(c)) {
    const OptionName none{"zero_grad_set_to_none"};
    FSDP_OPTION_CHECK(!c.cuda_graph, none, " cannot run in a captured step (",
                      OptionName{"cuda_graph"}, "): the graph's grad addresses are fixed");
    FSDP_OPTION_CHECK(!c.optimizer_in_forward, none, " and ", OptionName{"optimizer_in_forward"},
                      " exclude each other: the next forward reads the grads");
    FSDP_OPTION_CHECK(!c.offload_optimizer, none, " and ", offload,
                      " optimizer exclude each other: the grads go down after the step is issued");
    FSDP_OPTION_CHECK(!c.optimizer_in_backward, none, " and ", in_backward,
                      " exclude each other: the optimizer in backward keeps no grads to free");
  }
  check_checkpoint_options(c.checkpoint);
  const nn::ModelConfig model = models::resolved(c.model);  // the family's size checks
  const models::ModelFamily& family = models::family(model.kind);
  // The activations a step keeps, bounded in double before anything sizes them (int64).
  const double width = static_cast<double>(std::max(
      {4 * model.dim, model.hidden, model.ffn_dim, model.expert_ffn_dim, model.heads * model.seq_len}));
  const double activations = static_cast<double>(c.tokens) *
                             ((model.layers + 2.0) * 16 * width * std::max(model.top_k, 1) +
                              static_cast<double>(model.vocab + model.classes)) *
                             4;
  if (activations > kMaxActivationBytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2g", activations);
    throw UserError(detail::concat("a step of ", c.tokens, " tokens through this model keeps about ",
                                   text, " bytes of activations, far more than any machine "
                                   "holds (at most 2^60); use fewer tokens or a smaller model"));
  }
  if (family.batch_kind() == models::BatchKind::Tokens)
    FSDP_OPTION_CHECK(c.tokens % model.seq_len == 0, tokens, " (", c.tokens,
                      ") must be a multiple of the sequence length (", model.seq_len, ")");
  // Note [Activation checkpointing]: full on any family's blocks, selective where the
  // family says what is cheap to make again.
  nn::check_activation_checkpoint(c.activation_checkpoint);
  if (c.activation_checkpoint.mode == ActivationCheckpoint::Selective) {
    const std::string why = family.selective_checkpoint_refusal();
    FSDP_OPTION_CHECK(why.empty(), OptionName{"activation_checkpoint"}, " selective: ", why);
  }
  if (c.cuda_graph)  // Note [Captured steps]
    if (std::optional<OptionError> why = family.capture_refusal(model)) throw *why;
  // HSDP (docs/hsdp.md) and the post-forward mesh (Note [Post-forward mesh]).
  const int replicas = c.hsdp_replicas;
  const OptionName hsdp{"hsdp_replicas"};
  FSDP_OPTION_CHECK(replicas >= 0, hsdp, " must be >= 1 (replicas), got ", replicas);
  FSDP_OPTION_CHECK(world_size % std::max(replicas, 1) == 0, hsdp, " ", replicas,
                    " must divide the world size ", world_size);
  const int ep = family.expert_parallel_size(model);
  FSDP_OPTION_CHECK(replicas <= 1 || ep == 1, hsdp,
                    " with expert parallelism (", OptionName{"ep"}, " ", ep,
                    ") is not supported yet: use one of the two");
  FSDP_OPTION_CHECK(world_size % ep == 0, OptionName{"ep"}, " (", ep,
                    ") must divide the number of ranks (", world_size, ")");
  // fp8 (docs/fp8.md).
  if (c.fp8 != Fp8Recipe::None) {
    const OptionName fp8{"fp8"};
    FSDP_OPTION_CHECK(c.param_dtype == DType::BF16, fp8, " needs ", OptionName{"param_dtype"},
                      " bf16 (its GEMMs take and give bf16), got ", dtype_name(c.param_dtype));
    nn::enable_fp8(*models::build_model(model), c.fp8);  // refuses blocks without Linears
    const bool fp8_gather = c.fp8 == Fp8Recipe::Tensorwise && c.fp8_all_gather;
    FSDP_OPTION_CHECK(!(fp8_gather && c.optimizer_in_forward), fp8, " tensorwise with ",
                      OptionName{"fp8_all_gather"}, " cannot take ",
                      OptionName{"optimizer_in_forward"},
                      " (its update writes the all-gather input in bf16): turn one off");
    FSDP_OPTION_CHECK(!(fp8_gather && c.reshard_after_forward_size > 0), fp8, " tensorwise with ",
                      OptionName{"fp8_all_gather"}, " cannot take ",
                      OptionName{"reshard_after_forward_size"}, " yet: turn one off");
  }
  const int shard = world_size / std::max(replicas, 1);
  const int n = c.reshard_after_forward_size;
  FSDP_OPTION_CHECK(n == 0 || shard % n == 0, OptionName{"reshard_after_forward_size"}, " ", n,
                    " must divide the shard size ", shard,
                    replicas > 1 ? " (the world size / the replicas)" : " (the world size)");
}

}  // namespace fsdp::runtime
