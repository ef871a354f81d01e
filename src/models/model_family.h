// Model families: one file each in src/models, registered once in families.cpp; nothing
// outside src/models names a family.
//
// Note [Model families]
// A family is everything the engine needs to know about one kind of model, in one place:
//   - its name and a line for `--help`;
//   - resolve(): its defaults and one-line refusals of bad sizes, in the options' own terms;
//   - build(): the module tree under a root nn::Model;
//   - parallelize(): which modules become FSDP units, their placements (an expert mesh), the
//     gradient divide factor;
//   - its batches (features or token sequences), whether a CUDA graph can capture it, and
//     the fields that decide its params' shapes (a checkpoint compares them on resume);
//   - what its blocks keep for backward per token (the memory estimate), under each
//     activation checkpointing mode, and whether its blocks have a selective policy.
//   - its Hugging Face names (Note [Hugging Face names] in src/checkpoint/checkpoint_format.h)
//     and the config.json keys it reads (Note [Hugging Face configs] in models/hf_config.h);
//   - whether text generation can run it (a KV-cache forward of its blocks).
// Param counts and FLOPs per token are not written per family: they are read from a built
// model (Note [Lazy initial values] makes building one cost no memory), so they cannot drift
// from what trains.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_format.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/nn/model.h"

namespace fsdp::models {

class HfKeys;  // models/hf_config.h

// What a family's batches are: synthetic features (rows of --dim) or token sequences.
enum class BatchKind { Features, Tokens };

// The meshes and options parallelize() starts from.
struct ParallelizeContext {
  Device& device;
  Comm& world;
  Mesh& mesh;  // the data-parallel mesh (2-D under HSDP)
  // A mesh named `name` over the ranks of `one_d`, or under HSDP the 2-D mesh of the world
  // (one_d is then unused and may be null).
  std::function<std::unique_ptr<Mesh>(const std::string& name, std::shared_ptr<Comm> one_d)>
      make_mesh;
  bool hsdp = false;
  FullyShardOptions options;  // every unit's; the root's reshard_after_forward is FSDP2's default
  bool experts_on_own_mesh = true;  // families with experts: shard them over a mesh of their own
  // Set by parallelize: the experts' mesh, where the family has one.
  std::unique_ptr<Mesh> expert_mesh;
};

class ModelFamily {
 public:
  // `summary`: one line, for --help.
  ModelFamily(std::string_view name, std::string_view summary) : name_(name), summary_(summary) {}
  virtual ~ModelFamily() = default;
  std::string_view name() const { return name_; }
  std::string_view summary() const { return summary_; }
  // Refuses bad sizes in one line (defaults a config leaves at 0 are read where used).
  virtual void resolve(nn::ModelConfig&) const {}
  // Adds the module tree to an empty root (root.config(), resolved).
  virtual void build(nn::Model& root) const = 0;
  virtual BatchKind batch_kind() const { return BatchKind::Features; }
  // Whether the command's default AdamW lr shrinks with the width (optim::default_adamw_lr);
  // false: AdamW's own default (Note [Command defaults]).
  virtual bool width_scaled_lr() const { return true; }
  // Ranks that split each MoE layer's experts (expert parallelism); 1: none.
  virtual int expert_parallel_size(const nn::ModelConfig&) const { return 1; }
  // Makes the FSDP units: by default every block, then the root. Returns the root's module.
  virtual FsdpModule& parallelize(nn::Model& model, ParallelizeContext& ctx) const;
  // Why a CUDA graph cannot capture a step of this config, naming the options that decide it
  // (Note [Options checked once]); none: it can.
  virtual std::optional<OptionError> capture_refusal(const nn::ModelConfig&) const {
    return std::nullopt;
  }
  // FLOPs per token beyond 6 x the GEMM params (attention's scores and values).
  virtual double attention_flops_per_token(const nn::ModelConfig&) const { return 0; }
  // Bytes that one block's forward keeps for its backward, per token of a micro-batch, with
  // activations of `act` (the memory estimate, docs/memory.md).
  virtual double saved_bytes_per_token(const nn::ModelConfig& config, DType act) const = 0;
  // The same for block `layer` under activation checkpointing `mode` (Note [Activation
  // checkpointing]), for the estimate and a planner: None is saved_bytes_per_token (by
  // default; its mean over blocks), Full the block's input alone, Selective what the
  // family's selective policy keeps.
  virtual double block_saved_bytes_per_token(const nn::ModelConfig& config, int layer, DType act,
                                             ActivationCheckpoint mode) const;
  // Tensorwise fp8 (Note [Fp8 operands reused by the weight grad] in src/nn/fp8_linear.h):
  // what block `layer` keeps per token beyond block_saved_bytes_per_token, where an fp8
  // Linear keeps its input's one-byte transposed codes in place of its input (less, where no
  // other module keeps that input); 0 for a family without fp8 Linears in its blocks.
  virtual double block_fp8_saved_delta_per_token(const nn::ModelConfig&, int /*layer*/,
                                                 DType /*act*/, ActivationCheckpoint) const {
    return 0;
  }
  // What block `layer`'s backward holds at once beyond the block's saved set, per token (the
  // gradients it makes of its own activations), for the estimate's peak inside the last
  // block's backward; by default half the block's saved bytes and three of its width (the
  // gradient passed in, the one being made, the model's input).
  virtual double block_backward_bytes_per_token(const nn::ModelConfig& config, int layer,
                                                DType act) const {
    return 0.5 * block_saved_bytes_per_token(config, layer, act, ActivationCheckpoint::None) +
           3.0 * static_cast<double>(config.dim * dtype_size(act));
  }
  // Why selective checkpointing cannot run on this family's blocks (they do not say which of
  // their outputs are cheap to make again); empty: it can. Full runs on every family's.
  virtual std::string selective_checkpoint_refusal() const;
  // Why `fsdp generate` cannot run this family's models (Note [KV cache] in fsdp/device.h: its
  // blocks need a cached forward, nn::CachedBlock, on token ids); empty: it can.
  virtual std::string generation_refusal() const;
  // The config fields that decide a param's shape (a checkpoint compares them on resume),
  // and back: read_shape_fields sets them in `config` (a checkpoint's model, for export).
  virtual nlohmann::json shape_fields(const nn::ModelConfig& config) const;
  virtual void read_shape_fields(const nlohmann::json& fields, nn::ModelConfig& config) const;
  // How the params of a model of `config` are named in Hugging Face checkpoints; an empty
  // map: they are not (export and --init-from use the fqns).
  virtual checkpoint::HfNames hf_names(const nn::ModelConfig&) const { return {}; }
  // Hugging Face's config.json (Note [Hugging Face configs] in models/hf_config.h): the
  // model_type values this family reads, and reading one: sets the model fields of `config`
  // (kind included) from `keys`, taking each key it knows and refusing values it cannot build.
  virtual std::vector<std::string> hf_model_types() const { return {}; }
  // The config.json of a model of `config` with weights in `dtype` (export --hf), which
  // read_hf_config reads back as the same model; null when the family has none.
  virtual nlohmann::json hf_config(const nn::ModelConfig&, DType) const { return nullptr; }
  virtual void read_hf_config(const std::string& /*model_type*/, HfKeys& /*keys*/,
                              nn::ModelConfig& /*config*/) const {}
  // Which modules hold a rank's E / ep experts (Note [Expert params in checkpoints]); the
  // predicate is empty for families without experts.
  virtual std::function<bool(const Module&)> expert_modules() const { return {}; }

 private:
  std::string_view name_, summary_;
};

// Adds config.layers blocks "layers.i", made by make(layer, seed); the seed is the block's
// own, from the model's (the mlp-like families' rule).
void add_blocks(nn::Model& root,
                const std::function<std::unique_ptr<Module>(int layer, uint64_t seed)>& make);

// The mlp-like families' head: Linear(D, classes) with a cross-entropy loss when
// config.classes > 0, else the blocks' features with a mean-square loss (mlp.cpp).
void add_classification_head(nn::Model& root);

// The family named `name`; a UserError naming the known ones otherwise.
const ModelFamily& family(const std::string& name);
// Every family's name, in registration order.
std::vector<std::string> family_names();

// The model a checkpoint's shape fields describe (ModelFamily::read_shape_fields); the
// fields no family wrote keep their defaults.
nn::ModelConfig config_of_shape_fields(const nlohmann::json& fields);

// Resolves `config` with its family (defaults, one-line checks) and returns it.
nn::ModelConfig resolved(nn::ModelConfig config);
// A model of `config` (resolved here), its params' values not made yet (Note [Lazy initial
// values]).
std::unique_ptr<nn::Model> build_model(const nn::ModelConfig& config);

// Read from a built model (Note [Model families]):
// each FSDP unit's param count, the blocks in order, then the root's own params;
std::vector<int64_t> unit_param_counts(nn::Model& model);
// training FLOPs per token: 6 x the active params that a GEMM uses (all but the embedding's,
// unless a tied head uses them too) plus the family's attention term.
double flops_per_token(nn::Model& model);
// The same, building the model of `config` (cheap: no values are made).
std::vector<int64_t> unit_param_counts(const nn::ModelConfig& config);
double flops_per_token(const nn::ModelConfig& config);

}  // namespace fsdp::models
