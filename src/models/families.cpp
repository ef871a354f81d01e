// The registry of model families, and what is read from a built model (Note [Model
// families]).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fsdp/error.h"
#include "models/model_family.h"

namespace fsdp::models {

// Each family's file defines one of these.
const ModelFamily& mlp_family();
const ModelFamily& spin_family();
const ModelFamily& resmlp_family();
const ModelFamily& moe_family();
const ModelFamily& llama_family();
const ModelFamily& moe_llama_family();

namespace {

const std::vector<const ModelFamily*>& registry() {
  static const std::vector<const ModelFamily*> families{
      &mlp_family(), &resmlp_family(), &moe_family(), &spin_family(), &llama_family(),
      &moe_llama_family()};
  return families;
}

}  // namespace

const ModelFamily& family(const std::string& name) {
  for (const ModelFamily* f : registry())
    if (f->name() == name) return *f;
  std::string known;
  for (const ModelFamily* f : registry()) known += (known.empty() ? "" : ", ") + std::string(f->name());
  throw UserError(detail::concat("unknown model '", name, "' (expected one of: ", known, ")"));
}

std::vector<std::string> family_names() {
  std::vector<std::string> out;
  for (const ModelFamily* f : registry()) out.emplace_back(f->name());
  return out;
}

void add_blocks(nn::Model& root,
                const std::function<std::unique_ptr<Module>(int layer, uint64_t seed)>& make) {
  const nn::ModelConfig& c = root.config();
  for (int i = 0; i < c.layers; ++i)
    root.add_block(make(i, c.seed * 1000003ull + static_cast<uint64_t>(i) * 7919ull));
}

FsdpModule& ModelFamily::parallelize(nn::Model& model, ParallelizeContext& ctx) const {
  for (Module* block : model.blocks()) fully_shard(*block, ctx.mesh, ctx.options);
  FullyShardOptions root = ctx.options;
  root.reshard_after_forward.reset();  // FSDP2's default for the root
  return fully_shard(model, ctx.mesh, root);
}

double ModelFamily::block_saved_bytes_per_token(const nn::ModelConfig& config, int, DType act,
                                                ActivationCheckpoint mode) const {
  if (mode == ActivationCheckpoint::Full) return static_cast<double>(config.dim * dtype_size(act));
  return saved_bytes_per_token(config, act);  // selective: refused where the family has none
}

std::string ModelFamily::generation_refusal() const {
  if (batch_kind() != BatchKind::Tokens)
    return detail::concat("the ", name_, " model is not a language model (its inputs are "
                          "features, not token ids): it cannot generate text");
  return detail::concat("the ", name_, " model's blocks have no KV-cache forward: it cannot "
                        "generate text yet");
}

std::string ModelFamily::selective_checkpoint_refusal() const {
  return detail::concat("the ", name_, " model's blocks have no selective policy (which of "
                        "their outputs are cheap to make again); full and every:N checkpoint "
                        "any model's blocks");
}

nlohmann::json ModelFamily::shape_fields(const nn::ModelConfig& m) const {
  return {{"kind", m.kind},       {"layers", m.layers},   {"dim", m.dim},
          {"hidden", m.hidden},   {"experts", m.experts}, {"classes", m.classes},
          {"norm", m.norm}};
}

namespace {

template <typename... Parts>
void size_check(bool ok, const char* option, const Parts&... rest) {
  if (!ok) throw OptionError(option, detail::concat(rest...));
}

// Note [Model sizes]
// Sizes beyond any real model are refused before anything is sized from them: a model of
// 2^31 layers would be built (in the memory estimate) before anything else could refuse it,
// and every size below is a factor of int64 products (elements, bytes) that must not
// overflow. The caps are far past real models (Llama 3 405B: 126 layers of width 16384, FFN
// 53248, vocabulary 128256; DeepSeek-V3: 256 experts of FFN 2048), and the parameters they
// imply, bounded in double (which cannot overflow), must stay below 2^50 (4 PiB of fp32), so
// that a product of parameters and a few more factors still fits int64. Sizes where 0 means
// "the default" refuse a negative value rather than take the default.
constexpr int64_t kMaxLayers = 1 << 14, kMaxDim = 1 << 18, kMaxWidth = 1 << 20;
constexpr int64_t kMaxExperts = 1 << 14, kMaxHeads = 1 << 14, kMaxClasses = 1 << 24;
constexpr int64_t kMaxModelVocab = 1 << 24, kMaxSeqLen = 1 << 24;
constexpr double kMaxCapacityFactor = 1 << 14;
constexpr double kMaxParams = static_cast<double>(int64_t{1} << 50);

void check_sizes(const nn::ModelConfig& c) {
  auto at_most = [](const char* option, int64_t value, int64_t hi) {
    size_check(value <= hi, option, " ", value, " is beyond any real model: at most ", hi);
  };
  // Sizes that every family needs, and those where 0 names the default.
  auto range = [&](const char* option, int64_t value, int64_t lo, int64_t hi, const char* lo_means) {
    size_check(value >= lo, option, " must be >= ", lo, lo_means, ", got ", value);
    at_most(option, value, hi);
  };
  range("layers", c.layers, 1, kMaxLayers, "");
  range("dim", c.dim, 1, kMaxDim, "");
  range("hidden", c.hidden, 0, kMaxWidth, " (0: the model's default)");
  range("ffn_dim", c.ffn_dim, 0, kMaxWidth, " (0: 8 * dim / 3 rounded up to 64)");
  range("expert_ffn_dim", c.expert_ffn_dim, 0, kMaxWidth, " (0: the FFN width)");
  range("kv_heads", c.kv_heads, 0, kMaxHeads, " (0: as many as the heads)");
  range("classes", c.classes, 0, kMaxClasses, " (0: no head)");
  // The families that use these check their lower bounds.
  at_most("experts", c.experts, kMaxExperts);
  at_most("heads", c.heads, kMaxHeads);
  at_most("vocab", c.vocab, kMaxModelVocab);
  at_most("seq_len", c.seq_len, kMaxSeqLen);
  // Past experts / top-k every routed token fits: a larger factor only sizes buffers from it.
  size_check(std::isfinite(c.capacity_factor), "capacity_factor", " must be a finite number, got ",
             c.capacity_factor);
  size_check(c.capacity_factor <= kMaxCapacityFactor, "capacity_factor", " ", c.capacity_factor,
             " is beyond any real model: at most ", kMaxCapacityFactor);
  const double dim = static_cast<double>(c.dim);
  const double width = static_cast<double>(
      std::max({4 * c.dim, c.hidden, c.ffn_dim, c.expert_ffn_dim}));  // the defaults are < 4 dim
  const double experts = static_cast<double>(std::max(c.experts, 1));
  const double params = c.layers * (4 * dim * dim + 3 * dim * width * experts) +
                        dim * static_cast<double>(c.vocab + c.classes + c.dim);
  if (params > kMaxParams) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2g", params);
    throw UserError(detail::concat("the model's sizes come to about ", text,
                                   " parameters (layers x dim x width x experts), far more than "
                                   "any machine holds (at most 2^50); make them smaller"));
  }
}

}  // namespace

void ModelFamily::read_shape_fields(const nlohmann::json& j, nn::ModelConfig& m) const {
  m.layers = j.value("layers", m.layers);
  m.dim = j.value("dim", m.dim);
  m.hidden = j.value("hidden", m.hidden);
  m.experts = j.value("experts", m.experts);
  m.classes = j.value("classes", m.classes);
  m.norm = j.value("norm", m.norm);
}

nn::ModelConfig config_of_shape_fields(const nlohmann::json& fields) {
  nn::ModelConfig m;
  try {
    m.kind = fields.value("kind", m.kind);
    family(m.kind).read_shape_fields(fields, m);
  } catch (const nlohmann::json::exception&) {
    FSDP_USER_FAIL("the checkpoint's model fields are mistyped: ", fields.dump());
  }
  return m;
}

nn::ModelConfig resolved(nn::ModelConfig config) {
  check_sizes(config);  // Note [Model sizes]
  family(config.kind).resolve(config);
  return config;
}

std::unique_ptr<nn::Model> build_model(const nn::ModelConfig& config) {
  auto model = std::make_unique<nn::Model>(resolved(config));
  family(config.kind).build(*model);
  return model;
}

std::vector<int64_t> unit_param_counts(nn::Model& model) {
  std::vector<int64_t> units;
  int64_t in_blocks = 0;
  for (Module* block : model.blocks()) {
    int64_t n = 0;
    for (Param* p : block->all_params()) n += p->numel();
    units.push_back(n);
    in_blocks += n;
  }
  units.push_back(model.param_count() - in_blocks);
  return units;
}

double flops_per_token(nn::Model& model) {
  int64_t embedding = 0;  // a lookup, not a GEMM; unless a tied head uses the same param
  if (Module* e = model.embedding())
    for (Param* p : e->all_params())
      if (p->uses() == 1) embedding += p->numel();
  const double gemm_params = static_cast<double>(model.active_param_count() - embedding);
  return 6.0 * gemm_params + family(model.config().kind).attention_flops_per_token(model.config());
}

std::vector<int64_t> unit_param_counts(const nn::ModelConfig& config) {
  return unit_param_counts(*build_model(config));
}

double flops_per_token(const nn::ModelConfig& config) {
  return flops_per_token(*build_model(config));
}

}  // namespace fsdp::models
