// Files of full (unsharded) weights: `fsdp export` writes them, --init-from reads them
// (checkpoint_loader.h). Transformer params get Hugging Face Llama names; others their fqns.
#pragma once

#include <string>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/nn/model.h"

namespace fsdp::checkpoint {

struct FullTensor {
  std::string fqn;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // row-major, fp32
};

// Writes atomically, in fp32 or bf16, with chunk checksums (Note [Checkpoint checksums]).
void write_full_weights(const std::string& path, const std::vector<FullTensor>& tensors,
                        DType dtype);

}  // namespace fsdp::checkpoint
