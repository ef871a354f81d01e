#include "generate/generator.h"

#include <cstring>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/sharded_state.h"
#include "fsdp/error.h"
#include "models/model_family.h"

namespace fsdp::generate {

namespace {

// Element `offset` of a tensor's buffer.
void* element(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace

void check_generation(const nn::ModelConfig& config, int64_t max_positions,
                      std::span<const int32_t> prompt, const GenerateOptions& o) {
  FSDP_OPTION_CHECK(!prompt.empty(), "the ", OptionName{"prompt"},
                    " is empty: generation continues a prompt of at least one token");
  FSDP_OPTION_CHECK(o.max_new_tokens >= 1, OptionName{"max_new_tokens"}, " must be >= 1, got ",
                    o.max_new_tokens);
  check_sampling(o.sampling);
  for (size_t i = 0; i < prompt.size(); ++i)
    FSDP_USER_CHECK(prompt[i] >= 0 && prompt[i] < config.vocab, "token ", i, " of the prompt is ",
                    prompt[i], ", outside the model's vocabulary of ", config.vocab,
                    " (a tokenizer of another model?)");
  const int64_t n = static_cast<int64_t>(prompt.size());
  FSDP_OPTION_CHECK(o.max_new_tokens <= max_positions - n, "the ", OptionName{"prompt"}, " (", n,
                    n == 1 ? " token) and " : " tokens) and ", OptionName{"max_new_tokens"}, " ",
                    o.max_new_tokens,
                    " make more than the model's ", max_positions,
                    " positions (max_position_embeddings, or the seq_len it was made for)");
  FSDP_USER_CHECK(config.sliding_window == 0 || n + o.max_new_tokens <= config.sliding_window,
                  "a sequence of ", n + o.max_new_tokens, " tokens is longer than the model's ",
                  "sliding_window ", config.sliding_window,
                  ": sliding-window attention is not implemented");
}

DecoderModel::DecoderModel(Device& device, const nn::ModelConfig& config, DType dtype,
                           const std::string& weights)
    : device_(device), config_(models::resolved(config)), dtype_(dtype) {
  FSDP_USER_CHECK(dtype == DType::F32 || dtype == DType::BF16,
                  "generation runs in fp32 or bf16, not ", dtype_name(dtype));
  const models::ModelFamily& family = models::family(config_.kind);
  const std::string refusal = family.generation_refusal();
  FSDP_USER_CHECK(refusal.empty(), refusal);
  max_positions_ = config_.max_positions > 0 ? config_.max_positions : config_.seq_len;
  model_ = models::build_model(config_);
  FSDP_CHECK(model_->embedding() && model_->final_norm() && model_->head(), "model '",
             config_.kind, "' can generate but has no embedding, final norm or head");
  for (Module* b : model_->blocks()) {
    auto* cached = dynamic_cast<nn::CachedBlock*>(b);
    FSDP_CHECK(cached != nullptr, "block ", b->fqn(), " of model '", config_.kind,
               "' has no cached forward");
    blocks_.push_back(cached);
  }
  stream_ = device_.create_stream("generate", StreamPriority::Normal);
  // fp32 first (what the files and the initial values give), cast once for bf16.
  checkpoint::ShardedState state;
  std::vector<Tensor> fp32;
  model_->visit([&](Module& m) {
    for (const auto& p : m.params()) {
      fp32.push_back(
          empty_tensor(device_, stream_, DType::F32, p->rows(), p->cols(), MemTag::ShardedState));
      checkpoint::ShardView v;
      v.fqn = checkpoint::param_fqn(m, *p);
      v.shape = p->shape();
      v.cols = p->cols();
      v.rows = {0, p->rows()};
      v.rank_rows = {v.rows};
      v.param = fp32.back().as<float>();
      state.tensors.push_back(std::move(v));
    }
  });
  const std::vector<Param*> params = model_->all_params();
  FSDP_CHECK(params.size() == fp32.size(), "the model's params changed while loading");
  if (weights.empty()) {
    for (size_t i = 0; i < params.size(); ++i)
      device_.copy_from_host(stream_, fp32[i].data, params[i]->init_values().data(),
                             fp32[i].bytes());
  } else {
    checkpoint::load_full_weights(weights, state, &device_, stream_, family.hf_names(config_));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    params[i]->release_init_values();
    if (dtype_ == DType::F32) {
      params[i]->value = std::move(fp32[i]);
      continue;
    }
    params[i]->value = empty_tensor(device_, stream_, dtype_, fp32[i].rows, fp32[i].cols,
                                    MemTag::ShardedState);
    device_.cast(stream_, params[i]->value.data, dtype_, fp32[i].data, DType::F32,
                 fp32[i].numel());
    fp32[i] = Tensor{};  // freed in stream order, after the cast
  }
  device_.synchronize_stream(stream_);
}

DecoderModel::~DecoderModel() {
  cache_.clear();
  if (model_)
    for (Param* p : model_->all_params()) p->value = Tensor{};
  synchronize_in_destructor(device_);
}

Tensor DecoderModel::upload_ids(std::span<const int32_t> ids) {
  Tensor t = empty_tensor(device_, stream_, DType::I32, static_cast<int64_t>(ids.size()), 1,
                          MemTag::Activation);
  device_.copy_from_host(stream_, t.data, ids.data(), ids.size_bytes());
  return t;
}

std::vector<float> DecoderModel::download_row(const Tensor& row) {
  std::vector<char> host(row.bytes());
  device_.copy_to_host(stream_, host.data(), row.data, host.size());
  device_.synchronize_stream(stream_);
  std::vector<float> out(static_cast<size_t>(row.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(host.data(), row.dtype, i);
  return out;
}

std::vector<float> DecoderModel::logits_cached(std::span<const int32_t> ids, int64_t position) {
  RunContext ctx{&device_, stream_, dtype_};
  Tensor h = model_->embedding()->forward(ctx, upload_ids(ids));
  for (size_t i = 0; i < blocks_.size(); ++i)
    h = blocks_[i]->forward_cached(ctx, h, cache_[i], position);
  // Only the last token's logits choose the next one: the head runs on that row alone.
  Tensor last = view_tensor(element(h, (h.rows - 1) * h.cols), h.dtype, 1, h.cols, h.storage);
  return download_row(model_->head()->forward(ctx, model_->final_norm()->forward(ctx, last)));
}

std::vector<float> DecoderModel::logits_recomputed(std::span<const int32_t> sequence) {
  nn::ModelConfig whole = config_;
  whole.seq_len = static_cast<int64_t>(sequence.size());
  std::unique_ptr<nn::Model> model = models::build_model(whole);
  const std::vector<Param*> mine = model_->all_params(), theirs = model->all_params();
  FSDP_CHECK(mine.size() == theirs.size(), "a model of another seq_len has other params");
  for (size_t i = 0; i < mine.size(); ++i) theirs[i]->value = mine[i]->value;  // shared
  RunContext ctx{&device_, stream_, dtype_};
  Tensor logits = model->forward(ctx, upload_ids(sequence));
  const Tensor last = view_tensor(element(logits, (logits.rows - 1) * logits.cols), logits.dtype,
                                  1, logits.cols, logits.storage);
  std::vector<float> row = download_row(last);
  for (Param* p : theirs) p->value = Tensor{};
  return row;
}

Generation DecoderModel::generate(std::span<const int32_t> prompt, const GenerateOptions& o) {
  check_generation(config_, max_positions_, prompt, o);
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + o.max_new_tokens;
  cache_.clear();
  if (o.kv_cache)
    for (nn::CachedBlock* b : blocks_) {
      nn::LayerKvCache c;
      c.k = empty_tensor(device_, stream_, dtype_, capacity, b->kv_width(), MemTag::Activation);
      c.v = empty_tensor(device_, stream_, dtype_, capacity, b->kv_width(), MemTag::Activation);
      cache_.push_back(std::move(c));
    }
  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  std::vector<float> logits = o.kv_cache ? logits_cached(prompt, 0) : logits_recomputed(sequence);
  Generation g;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const int32_t token = next_token(logits, o.sampling, step);
    g.tokens.push_back(token);
    if (o.keep_logits) g.logits.push_back(logits);
    if (o.eos_id && token == *o.eos_id) {
      g.stopped_at_eos = true;
      break;
    }
    if (step + 1 == o.max_new_tokens) break;
    sequence.push_back(token);
    const int64_t position = static_cast<int64_t>(sequence.size()) - 1;
    logits = o.kv_cache ? logits_cached(std::span<const int32_t>(&sequence.back(), 1), position)
                        : logits_recomputed(sequence);
  }
  cache_.clear();
  return g;
}

}  // namespace fsdp::generate
