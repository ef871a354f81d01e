// `fsdp export --init`: a model's initial weights (its seed's init), without training: one
// file, or (--hf) a Hugging Face model directory.
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/dtype.h"
#include "fsdp/nn/model.h"

namespace fsdp::models {

void export_initial_weights(const nn::ModelConfig& model, const std::string& out_path,
                            DType dtype);
// The same as a Hugging Face model directory (checkpoint::write_hf_directory).
void export_initial_weights_hf(const nn::ModelConfig& model, const std::string& out_dir,
                               DType dtype, uint64_t max_shard_bytes);

}  // namespace fsdp::models
