// `fsdp export --init`: a model's initial weights (its seed's init), without training.
#pragma once

#include <string>

#include "fsdp/dtype.h"
#include "fsdp/nn/model.h"

namespace fsdp::models {

void export_initial_weights(const nn::ModelConfig& model, const std::string& out_path,
                            DType dtype);

}  // namespace fsdp::models
