// The registry of model families, and what is read from a built model (Note [Model
// families]).
#include <cmath>

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

nlohmann::json ModelFamily::shape_fields(const nn::ModelConfig& m) const {
  return {{"kind", m.kind},       {"layers", m.layers},   {"dim", m.dim},
          {"hidden", m.hidden},   {"experts", m.experts}, {"classes", m.classes},
          {"norm", m.norm}};
}

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
  if (config.layers < 1) throw OptionError("layers", detail::concat(" must be >= 1, got ", config.layers));
  if (config.dim < 1) throw OptionError("dim", detail::concat(" must be >= 1, got ", config.dim));
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
