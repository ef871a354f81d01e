// Sharded checkpoints and full-weight files (docs/checkpoint.md).
//
//   fsdp train ... --save-dir DIR --save-every N [--keep-last K]   DIR/step-000123/ every N steps
//   fsdp train ... --resume DIR            a checkpoint, or a save dir (its latest complete one)
//   fsdp train ... --init-from FILE        full weights (fqn or Hugging Face Llama names)
//   fsdp export --checkpoint DIR --out FILE [--dtype bf16]
//   fsdp export --checkpoint DIR --hf OUT_DIR [--max-shard-size 5GB] [--dtype fp32]
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/dtype.h"

namespace fsdp {

struct CheckpointOptions {
  std::string save_dir;   // where step-NNNNNN/ checkpoints go ("" : no saves)
  int save_every = 0;     // save after every N steps, and after the last one (0: only the last)
  int keep_last = 0;      // keep the newest K complete checkpoints (0: all)
  std::string resume;     // a checkpoint directory, or a save dir: its latest complete checkpoint
  std::string init_from;  // full weights: a safetensors file, or a Hugging Face model directory
  bool verbose = false;   // one line per save on stdout (rank 0)
  bool enabled() const { return !save_dir.empty() || !resume.empty() || !init_from.empty(); }
};

// The options' rules (an OptionError naming them, Note [Options checked once]); the trainer's
// check_train_config runs it.
void check_checkpoint_options(const CheckpointOptions& options);

// Writes the full weights of a checkpoint to a safetensors file, in fp32 or bf16: Hugging
// Face names where the model's family has them (the transformer's wqkv and w13 split by rows),
// the fqns otherwise.
void export_checkpoint(const std::string& checkpoint_dir, const std::string& out_path,
                       DType dtype);
// The same as a Hugging Face model directory `out_dir`: config.json (from the model the
// checkpoint recorded), generation_config.json, the weights in shards of at most
// max_shard_bytes and their index. Refused for a model with no Hugging Face config.
void export_checkpoint_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                          DType dtype, uint64_t max_shard_bytes);

}  // namespace fsdp
