// A Hugging Face model's config.json as a model of a family (--hf-config FILE, or the
// config.json of --init-from DIR).
//
// Note [Hugging Face configs]
// config.json's "model_type" picks the family that reads it (ModelFamily::hf_model_types;
// the transformer reads llama, qwen2 and mistral), which sets the model's fields from the
// keys. Every key is read, or refused in one line naming it, so that nothing is dropped in
// silence:
//   - a key no reader knows is refused (a new option of the model may change its math);
//   - a known key whose value changes the model in a way not implemented here (a rope
//     scaling other than default and llama3, an activation other than silu, dropout, biases
//     on the MLP, a sliding window shorter than the sequences) is refused, naming the key
//     and its value;
//   - keys that do not change the math are read and left: token ids, dtypes, versions,
//     initializer_range, use_cache, architectures; max_position_embeddings is kept as
//     ModelConfig::max_positions, the bound of text generation.
// The file is bounded (kMaxHfConfigBytes, JSON nested at most 64 deep) and every number is
// checked for its type and range before it is used. The fields it does not set (seq_len,
// the seed, expert parallelism) keep their values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/nn/model.h"
#include "tokenizer/json_object.h"

namespace fsdp::models {

inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr int64_t kMaxHfConfigBytes = 1 << 20;

// The keys of one JSON object of a config.json, read key by key (json_reading::Object: a key
// nobody took is refused by done()), with typed reads that refuse a value of the wrong type
// or range in one line naming the key.
class HfKeys : public tokenizer::json_reading::Object {
 public:
  // `where`: the object's path in the file ("" for the top); `file`: the file's name, quoted.
  HfKeys(const nlohmann::json& v, std::string where, const std::string& file)
      : Object(v, std::move(where), file), file_(file) {}
  const std::string& file() const { return file_; }
  // An integer in [lo, hi]; `absent` when the key is missing or null (required without it).
  int64_t integer(const std::string& key, int64_t lo, int64_t hi,
                  std::optional<int64_t> absent = std::nullopt);
  // A finite number in [lo, hi]; `absent` as above.
  double number(const std::string& key, double lo, double hi,
                std::optional<double> absent = std::nullopt);
  // A key that, when present and not null, must have the value `want` (this model has no
  // other); `why` says what another value would mean.
  void require(const std::string& key, const nlohmann::json& want, const char* why);

 private:
  const std::string& file_;
};

// DIR/config.json when `path` is a directory that holds one; "" otherwise.
std::string hf_config_in(const std::string& path);

// Sets the model fields of `config` (the family too) from the config.json at `file`; one-line
// errors naming the file and the key (Note [Hugging Face configs]).
void apply_hf_config(const std::string& file, nn::ModelConfig& config);

}  // namespace fsdp::models
