#include "models/hf_config.h"

#include <sys/stat.h>

#include <cmath>

#include "fsdp/error.h"
#include "io/file_io.h"
#include "models/model_family.h"

namespace fsdp::models {

int64_t HfKeys::integer(const std::string& key, int64_t lo, int64_t hi,
                        std::optional<int64_t> absent) {
  const nlohmann::json* v = get(key);
  if (v == nullptr || v->is_null()) {
    if (!absent) fail("has no \"", key, "\"");
    return *absent;
  }
  // 128.0 is an integer too (a float of an integral value, as some writers give).
  const bool integral =
      v->is_number_integer() ||
      (v->is_number_float() && std::isfinite(v->get<double>()) &&
       std::trunc(v->get<double>()) == v->get<double>() && std::fabs(v->get<double>()) < 9e15);
  if (!integral) fail_key(key, "is ", v->dump(), ", not an integer");
  const double d = v->get<double>();
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    fail_key(key, "is ", v->dump(), ", outside [", lo, ", ", hi, "]");
  return v->is_number_float()      ? static_cast<int64_t>(d)
         : v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>())
                                   : v->get<int64_t>();
}

double HfKeys::number(const std::string& key, double lo, double hi, std::optional<double> absent) {
  const nlohmann::json* v = get(key);
  if (v == nullptr || v->is_null()) {
    if (!absent) fail("has no \"", key, "\"");
    return *absent;
  }
  if (!v->is_number() || !std::isfinite(v->get<double>()))
    fail_key(key, "is ", v->dump(), ", not a number");
  const double d = v->get<double>();
  if (d < lo || d > hi) fail_key(key, "is ", v->dump(), ", outside [", lo, ", ", hi, "]");
  return d;
}

void HfKeys::require(const std::string& key, const nlohmann::json& want, const char* why) {
  const nlohmann::json* v = get(key);
  if (v == nullptr || v->is_null()) return;
  const bool same =
      v->is_number() && want.is_number() ? v->get<double>() == want.get<double>() : *v == want;
  if (!same) fail_key(key, "is ", v->dump(), "; only ", want.dump(), " is implemented (", why, ")");
}

std::string hf_config_in(const std::string& path) {
  if (path.empty() || !io::is_directory(path)) return "";
  const std::string file = path.back() == '/' ? path + kHfConfigFile : path + "/" + kHfConfigFile;
  return io::path_exists(file) ? file : "";
}

void apply_hf_config(const std::string& file, nn::ModelConfig& config) {
  const std::string name = "'" + file + "'";
  const std::string text = io::read_bounded_file(file, kMaxHfConfigBytes, "a config.json");  // Note [Reading files]
  const nlohmann::json j = tokenizer::json_reading::parse_bounded(text, name);
  HfKeys keys(j, "", name);
  const std::string type = keys.string("model_type");
  const ModelFamily* reader = nullptr;
  std::string known;
  for (const std::string& f : family_names())
    for (const std::string& t : family(f).hf_model_types()) {
      known += (known.empty() ? "" : ", ") + t;
      if (t == type) reader = &family(f);
    }
  if (!reader)
    keys.fail_key("model_type", "is \"", type, "\", which no model family reads (", known, " are)");
  // Keys of every Hugging Face config that do not change the math (Note [Hugging Face
  // configs]).
  for (const char* k :
       {"architectures", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
        "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range",
        "output_attentions", "output_hidden_states", "return_dict"})
    keys.ignore(k);
  nn::ModelConfig m = config;
  // The positions the model was made for: text generation's bound (it does not change the math).
  m.max_positions = keys.integer("max_position_embeddings", 1, int64_t{1} << 40, 0);
  reader->read_hf_config(type, keys, m);
  keys.done("the model");
  config = m;
}

}  // namespace fsdp::models
