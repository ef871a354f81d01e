// `fsdp export`: full weights in one safetensors file (docs/checkpoint.md).
//   fsdp export --checkpoint DIR --out model.safetensors [--dtype fp32|bf16]
//   fsdp export --init --model ... (the train command's model flags) --out init.safetensors
//   fsdp export --checkpoint DIR --hf OUT_DIR [--max-shard-size 5GB] [--dtype bf16|fp32]
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "tools/train_command.h"

namespace fsdp::tools {

struct ExportOptions {
  std::string checkpoint;  // a checkpoint, or a save dir (its latest complete checkpoint)
  bool init = false;       // the initial weights of the model the train flags describe
  std::string out;
  std::string hf;                      // a Hugging Face model directory instead of --out
  std::string max_shard_size = "5GB";  // --hf: Hugging Face's default
  std::string dtype;                   // fp32 for --out, bf16 for --hf
  TrainOptions train;      // --init: the model flags
};

CLI::App* add_export_command(CLI::App& app, ExportOptions& options);
int run_export(ExportOptions& options);
// "5GB", "500MB", "2GiB", "1000000" (bytes; kB/MB/GB powers of 1000, KiB/MiB/GiB of 1024, as
// Hugging Face's max_shard_size); one-line error otherwise.
uint64_t parse_shard_size(const std::string& text);

}  // namespace fsdp::tools
