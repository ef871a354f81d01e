// The models the CLI and tests train, their synthetic data and losses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/nn/moe.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/nn/layers.h"

namespace fsdp::nn {

struct ModelConfig {
  // The model family (src/models, one file each; `fsdp train --help` lists them).
  std::string kind = "mlp";
  int layers = 4;
  int64_t dim = 64;
  int64_t hidden = 0;   // expert hidden size (0: dim)
  int experts = 4;
  int64_t classes = 0;  // >0: a head Linear(D, classes) on the root and cross-entropy loss
  MoeGradOrder grad_order = MoeGradOrder::DenseFirst;
  // resmlp and moe: a pre-norm (RMSNorm, eps 1e-5) at the start of each block's branch, so
  // the residual stream's growth does not reach the branch; the command turns it on.
  bool norm = false;
  double spin_forward_us = 1000, spin_backward_us = 1000;  // kind "spin": SpinBlock durations
  // kind "transformer" (dim and layers above; 0 means the default named)
  int64_t heads = 4;
  int64_t kv_heads = 0;  // 0: heads (no grouping)
  int64_t ffn_dim = 0;   // 0: 8 * dim / 3 rounded up to a multiple of 64
  int64_t seq_len = 32;
  int64_t vocab = 256;
  // The Hugging Face dialects (Llama 3, Qwen2, Mistral; docs/transformer.md), as in
  // TransformerConfig:
  int64_t head_dim = 0;  // 0: dim / heads
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double norm_eps = 1e-5;       // the RMSNorms'
  bool tie_embeddings = false;  // Note [Tied embeddings]
  bool attention_bias = false;
  // The most positions the model takes (Hugging Face's max_position_embeddings); 0: not
  // known (a model without a config.json), seq_len then bounds text generation.
  int64_t max_positions = 0;
  // Mistral's and Qwen2's sliding-window attention: 0, none. Not implemented: a window
  // shorter than seq_len is refused (it would change the math).
  int64_t sliding_window = 0;
  uint64_t seed = 1;
  // kind "moe-transformer" (docs/moe.md): the transformer above with an MoE layer in every
  // other block; `experts` above, and:
  int top_k = 2;
  int moe_every = 2;           // is_moe_layer: every other block
  int64_t expert_ffn_dim = 0;  // 0: ffn_dim
  double capacity_factor = 0;  // 0: dropless
  float aux_loss_weight = 0.01f;
  int ep = 1;                  // expert-parallel ranks
  int ep_rank = 0;             // set per rank by the trainer
  int64_t moe_group_tokens = 0;  // Note [MoE routing]: a rank's tokens (set by the trainer)
  MoeGradOrder expert_grad_order = MoeGradOrder::ExpertsFirst;  // tests: every firing order
};

// The MoE layer's settings from a ModelConfig (kind "moe-transformer"), validated.
MoeConfig moe_config(const ModelConfig& config);

// The transformer's sizes from a ModelConfig, defaults resolved and validated.
TransformerConfig transformer_config(const ModelConfig& config);

// The root module, built by a model family (src/models, one file each): an optional
// embedding, the blocks "layers.i" (each an FSDP unit), an optional final norm and an optional
// head, run in that order. The mlp-like families' root is "layers.i" and "head"; the
// transformer's is "tok_embeddings", "layers.i", "norm", "output".
class Model : public Module {
 public:
  // An empty root; a family's build() adds its parts (models::build_model does both).
  explicit Model(const ModelConfig& config);
  const ModelConfig& config() const { return config_; }
  const std::vector<Module*>& blocks() const { return blocks_; }

  // Building, in forward order: each part is a child of the root named as given.
  void set_embedding(std::string name, std::unique_ptr<Module> embedding);
  Module& add_block(std::unique_ptr<Module> block);  // "layers.<i>"
  void set_final_norm(std::string name, std::unique_ptr<Module> norm);
  void set_head(std::string name, std::unique_ptr<Module> head);
  // What the model's output is: `dim` logits for a cross-entropy loss, or features for a
  // mean-square loss.
  void set_output(int64_t dim, bool cross_entropy);

  Module* embedding() const { return embedding_; }
  Module* final_norm() const { return final_norm_; }
  Module* head() const { return head_; }
  bool uses_cross_entropy() const { return cross_entropy_; }
  int64_t output_dim() const { return output_dim_; }
  int64_t param_count();
  // The params one token's forward uses (for FLOPs): an MoE layer counts K of its experts; the
  // others all of their params. Equals param_count() for models without MoE layers.
  int64_t active_param_count();
  // The MoE transformer's expert parallelism: the ep communicator its MoE layers dispatch over
  // (nullptr with ep 1), and the expert grads held for the end of backward (ExpertsDeferred).
  void set_expert_comm(Comm* ep);
  // The MoE layers' statistics of the last forward, which live in device memory (Note [MoE
  // routing]), so a step reads none of them on the host: add_aux_loss adds the auxiliary loss
  // (summed over the MoE layers in layer order, then added once) to `loss` (device fp32);
  // copy_expert_loads copies each MoE layer's max expert load to dst[i] (device fp32, one per
  // moe_layer_count(), in layer order; -1 for a layer that has not run). Nothing for other
  // models.
  int moe_layer_count();
  void add_aux_loss(Device& d, Stream s, float* loss);
  void copy_expert_loads(Device& d, Stream s, float* dst);
  void release_deferred_expert_grads(RunContext& ctx);

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;

 private:
  ModelConfig config_;
  Module* embedding_ = nullptr;   // token ids -> [tokens, dim]
  std::vector<Module*> blocks_;
  Module* final_norm_ = nullptr;
  Module* head_ = nullptr;
  int64_t output_dim_ = 0;
  bool cross_entropy_ = false;
};

// fp8 training (docs/fp8.md): marks the weight of every Linear inside the blocks (Param::fp8)
// with `recipe`, and the grouped experts' w13 and w2 (Note [Fp8 experts]), except MoE
// routers, whose softmax wants the param dtype; the embedding, the head, the norms and
// attention stay as they are. Returns how many modules it marked. A
// Linear with a fused ReLU cannot take it: a one-line OptionError.
int enable_fp8(Model& model, Fp8Recipe recipe);

// Which blocks of a Model are checkpointed, and how (Note [Activation checkpointing] in
// fsdp/module.h), after torchtitan's activation_checkpoint: mode full checkpoints every block,
// or one block in N (its layer-level option N; here blocks 0, N, 2N, ..., i.e. block i when
// i % N == 0, so the last block, whose backward comes first and holds its whole set at the
// peak anyway, is checkpointed only when N divides L - 1); mode selective is its op-level
// policy on every block.
struct ActivationCheckpointConfig {
  ActivationCheckpoint mode = ActivationCheckpoint::None;
  int every = 1;  // mode Full: every N-th block (>= 1)
  // The mode of block `layer` (0-based).
  ActivationCheckpoint of_block(int layer) const;
  // "none", "full", "every:N" (N > 1) or "selective": what parse_activation_checkpoint reads.
  std::string to_string() const;
  friend bool operator==(const ActivationCheckpointConfig&,
                         const ActivationCheckpointConfig&) = default;
};
// Reads none | full | every:N | selective; an OptionError naming activation_checkpoint
// otherwise (Note [Options checked once]).
ActivationCheckpointConfig parse_activation_checkpoint(const std::string& text);
// The rule for a config given as a struct: every >= 1 (an OptionError otherwise).
void check_activation_checkpoint(const ActivationCheckpointConfig& config);
// Sets each block's mode (Module::set_activation_checkpoint); before the first forward.
void apply_activation_checkpointing(Model& model, const ActivationCheckpointConfig& config);

// Training data: row r of the global batch of a step is Uniform(-sqrt 3, sqrt 3) (unit
// variance) from include/fsdp/synthetic.h, made on the device by Device::synthetic_batch.
// Every row depends only on (seed, step, global row), so a single-rank reference can rebuild
// the global batch that the ranks share.
constexpr float kDataBound = 1.7320508f;

// The labels of a model with classes: the argmax of each row's first label_width() features
// (synthetic_label in fsdp/synthetic.h, a target a linear head can learn), made on the device
// by Device::synthetic_labels.
inline int64_t label_width(const ModelConfig& c) { return c.classes < c.dim ? c.classes : c.dim; }

// The transformer's synthetic tokens for rows [first_row, first_row + tokens) of the global
// batch of `step` (whole sequences of seq_len): ids, and labels = the next token of each
// sequence. Sequence g's seq_len + 1 tokens depend only on (seed, step, its first global row);
// each next token follows a fixed rule from the previous one with probability 3/4 and is
// random otherwise, so there is something to learn.
struct TokenBatch {
  std::vector<int32_t> ids, labels;
};
TokenBatch make_token_batch(const ModelConfig& config, uint64_t seed, int step, int64_t first_row,
                            int64_t tokens);

}  // namespace fsdp::nn
