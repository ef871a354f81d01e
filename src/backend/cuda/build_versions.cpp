// `fsdp --version`: the CUDA runtime and NCCL this binary was compiled against (the headers'
// versions, so no CUDA call is made and nothing is initialized).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "backend/cuda/cuda_backend.h"

namespace fsdp::cuda {

std::string build_versions() {
  return "CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
         std::to_string(CUDART_VERSION % 1000 / 10) + ", NCCL " + std::to_string(NCCL_MAJOR) +
         "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH);
}

}  // namespace fsdp::cuda
