// `fsdp generate`: text from a model, on one rank (the model whole on one device, unsharded),
// through the model's own tokenizer (docs/generate.md).
//   fsdp generate --init-from DIR|FILE [--hf-config config.json] [--tokenizer PATH]
//                 --prompt TEXT | --input-ids I,J,.. [--max-new-tokens N] [--temperature T] [--top-p P] [--seed S]
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace fsdp::tools {

struct GenerateCommandOptions {
  std::string init_from;  // a Hugging Face directory (config.json, weights), or a safetensors file
  std::string hf_config;  // the config.json of --init-from FILE
  std::string tokenizer;  // default: the tokenizer.json or tokenizer.model in --init-from DIR
  std::string prompt;
  std::string input_ids;  // the prompt as token ids, "1,2,3", instead of --prompt
  int64_t max_new_tokens = 32;
  double temperature = 0;
  double top_p = 1;
  uint64_t seed = 0;
  std::string backend = "auto";
  std::string dtype = "fp32";
  bool ignore_eos = false;
  bool no_special_tokens = false;
  bool no_kv_cache = false;
  std::string json_path;
};

CLI::App* add_generate_command(CLI::App& app, GenerateCommandOptions& options);
int run_generate(const GenerateCommandOptions& options);

}  // namespace fsdp::tools
