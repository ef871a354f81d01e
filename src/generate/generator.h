// Text generation on one device: a decoder model whole (one rank, no FSDP), its KV cache, and
// the loop that appends one chosen token at a time (Note [KV cache] in fsdp/device.h). Token
// ids in, token ids out; the command (tools/generate_command.cpp) brings the tokenizer.
//
// Note [Generation reuses the model]
// Generation runs the model's own modules with their own weights: the embedding, each block's
// forward_cached (nn::CachedBlock: the block's own norms, projections and feed-forward around
// the cached attention), the final norm and the head. Whether a family can generate is the
// family's to say (ModelFamily::generation_refusal). The check of the KV cache is the same model
// run without it: kv_cache = false recomputes the whole sequence through the training forward
// (Model::forward of a model of seq_len = the sequence's length, sharing the weights) for
// every token, and greedy decoding must choose the same tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fsdp/device.h"
#include "fsdp/nn/kv_cache.h"
#include "fsdp/nn/model.h"
#include "generate/sampling.h"

namespace fsdp::generate {

struct GenerateOptions {
  int64_t max_new_tokens = 32;  // >= 1
  SamplingOptions sampling;
  std::optional<int32_t> eos_id;  // stop once it is chosen (it ends the new tokens)
  bool kv_cache = true;           // false: the whole sequence again for every token
  bool keep_logits = false;       // return the logits each new token was chosen from
};

struct Generation {
  std::vector<int32_t> tokens;              // the new tokens, in order
  std::vector<std::vector<float>> logits;   // keep_logits: one row per new token
  bool stopped_at_eos = false;
};

class DecoderModel {
 public:
  // The model of `config` (resolved here), with activations and weights in `dtype` (fp32 or
  // bf16), its weights read from `weights` (a safetensors file or a Hugging Face directory,
  // by its Hugging Face names or its fqns, as --init-from reads them) or, when empty, the
  // config's initial values. One-line errors: a family that cannot generate, bad weights.
  DecoderModel(Device& device, const nn::ModelConfig& config, DType dtype,
               const std::string& weights);
  ~DecoderModel();
  const nn::ModelConfig& config() const { return config_; }
  // The longest sequence (prompt and new tokens) it takes: max_position_embeddings of its
  // config.json, else the seq_len it was configured with.
  int64_t max_positions() const { return max_positions_; }

  Generation generate(std::span<const int32_t> prompt, const GenerateOptions& options);

 private:
  std::vector<float> logits_cached(std::span<const int32_t> ids, int64_t position);
  std::vector<float> logits_recomputed(std::span<const int32_t> sequence);
  Tensor upload_ids(std::span<const int32_t> ids);
  std::vector<float> download_row(const Tensor& row);

  Device& device_;
  Stream stream_;
  nn::ModelConfig config_;
  DType dtype_;
  int64_t max_positions_ = 0;
  std::unique_ptr<nn::Model> model_;
  std::vector<nn::CachedBlock*> blocks_;
  std::vector<nn::LayerKvCache> cache_;
};

// The checks generate() makes before it runs, each one line: a non-empty prompt of ids in
// [0, vocab), max_new_tokens >= 1, the sampling options, and prompt + new tokens within
// max_positions (and within a sliding window, which this attention does not implement).
void check_generation(const nn::ModelConfig& config, int64_t max_positions,
                      std::span<const int32_t> prompt, const GenerateOptions& options);

}  // namespace fsdp::generate
