// Files of full (unsharded) weights: `fsdp export` writes them, --init-from reads them
// (checkpoint_loader.h). Params get their family's Hugging Face names where it has them (Note
// [Hugging Face names]), their fqns otherwise.
#pragma once

#include <string>
#include <vector>

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

}  // namespace fsdp::checkpoint
