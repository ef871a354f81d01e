// Files of full (unsharded) weights: `fsdp export` writes them, --init-from reads them
// (checkpoint_loader.h). Params get their family's Hugging Face names where it has them (Note
// [Hugging Face names]), their fqns otherwise.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_format.h"
#include "fsdp/checkpoint.h"
#include "fsdp/nn/model.h"

namespace fsdp::checkpoint {

struct FullTensor {
  std::string fqn;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // row-major, fp32
};

// Writes atomically, in fp32 or bf16, with chunk checksums (Note [Checkpoint checksums]);
// under the Hugging Face names of `names` when given, else the fqns.
void write_full_weights(const std::string& path, const std::vector<FullTensor>& tensors,
                        DType dtype, const HfNames& names = {});

// A Hugging Face model directory (Note [Weight directories]): `config` as config.json, a
// generation_config.json, and the weights under `names` in shards of at most
// `max_shard_bytes` (a larger tensor alone; model.safetensors when one, else
// model-0000i-of-0000N.safetensors and model.safetensors.index.json). `dir` must not exist
// or be empty; it appears whole, or not at all (written beside it, then renamed).
void write_hf_directory(const std::string& dir, const std::vector<FullTensor>& tensors, DType dtype,
                        const HfNames& names, const nlohmann::json& config,
                        uint64_t max_shard_bytes);

}  // namespace fsdp::checkpoint
