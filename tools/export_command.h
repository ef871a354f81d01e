// `fsdp export`: full weights in one safetensors file (docs/checkpoint.md).
//   fsdp export --checkpoint DIR --out model.safetensors [--dtype fp32|bf16]
//   fsdp export --init --model ... (the train command's model flags) --out init.safetensors
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "tools/train_command.h"

namespace fsdp::tools {

struct ExportOptions {
  std::string checkpoint;  // a checkpoint, or a save dir (its latest complete checkpoint)
  bool init = false;       // the initial weights of the model the train flags describe
  std::string out;
  std::string dtype = "fp32";
  TrainOptions train;      // --init: the model flags
};

CLI::App* add_export_command(CLI::App& app, ExportOptions& options);
int run_export(ExportOptions& options);

}  // namespace fsdp::tools
