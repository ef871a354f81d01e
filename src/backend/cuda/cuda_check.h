// Error checks for CUDA, NCCL and cuBLASLt calls (private to src/backend/cuda).
//
// These are the CUDA members of the one macro family of Note [Errors] (include/fsdp/error.h):
// a failed call becomes an fsdp::Error through fsdp::detail::raise, whose message names the
// failed expression, the library's error name and text, and the CUDA device that was current.
// Nothing here exits or aborts: the caller's stack unwinds and `main` reports.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "fsdp/error.h"

namespace fsdp::cuda::detail {

// The device current on this thread, for error messages; -1 if even that query fails.
inline int current_device_for_message() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  return device;
}

inline std::string cuda_error_message(const char* expr, cudaError_t error) {
  return ::fsdp::detail::concat("CUDA error ", cudaGetErrorName(error), " (",
                                cudaGetErrorString(error), ") from `", expr,
                                "` on cuda:", current_device_for_message());
}

inline std::string nccl_error_message(const char* expr, ncclResult_t result) {
  // ncclGetLastError holds the detail (which peer, which transport) behind the generic text.
  const char* last = ncclGetLastError(nullptr);
  return ::fsdp::detail::concat("NCCL error ", static_cast<int>(result), " (",
                                ncclGetErrorString(result), ") from `", expr,
                                "` on cuda:", current_device_for_message(),
                                last && *last ? ::fsdp::detail::concat(": ", last) : "");
}

inline std::string cublas_error_message(const char* expr, cublasStatus_t status) {
  return ::fsdp::detail::concat("cuBLASLt error ", cublasLtGetStatusName(status), " (",
                                cublasLtGetStatusString(status), ") from `", expr,
                                "` on cuda:", current_device_for_message());
}

}  // namespace fsdp::cuda::detail

#define FSDP_CUDA_CHECK(expr)                                                                   \
  do {                                                                                          \
    const cudaError_t fsdp_cuda_error_ = (expr);                                                \
    if (fsdp_cuda_error_ != cudaSuccess) [[unlikely]]                                           \
      ::fsdp::detail::raise(__FILE__, __LINE__,                                                 \
                            ::fsdp::cuda::detail::cuda_error_message(#expr, fsdp_cuda_error_)); \
  } while (0)

#define FSDP_NCCL_CHECK(expr)                                                                    \
  do {                                                                                           \
    const ncclResult_t fsdp_nccl_result_ = (expr);                                               \
    if (fsdp_nccl_result_ != ncclSuccess) [[unlikely]]                                           \
      ::fsdp::detail::raise(__FILE__, __LINE__,                                                  \
                            ::fsdp::cuda::detail::nccl_error_message(#expr, fsdp_nccl_result_)); \
  } while (0)

#define FSDP_CUBLAS_CHECK(expr)                                                    \
  do {                                                                             \
    const cublasStatus_t fsdp_cublas_status_ = (expr);                             \
    if (fsdp_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                 \
      ::fsdp::detail::raise(                                                       \
          __FILE__, __LINE__,                                                      \
          ::fsdp::cuda::detail::cublas_error_message(#expr, fsdp_cublas_status_)); \
  } while (0)

// After a kernel launch: a bad configuration shows up here, not at the launch itself.
#define FSDP_CUDA_CHECK_LAUNCH() FSDP_CUDA_CHECK(cudaGetLastError())
