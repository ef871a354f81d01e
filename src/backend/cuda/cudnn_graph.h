// A thin C++ layer over cuDNN's graph backend API (cudnn_graph.h): owned descriptors, an
// operation-graph builder for 4-D tensors, plan selection through cuDNN's heuristics, and
// execution with a variant pack (private to src/backend/cuda).
//
// Note [cuDNN graphs]
// cuDNN's fused engines (flash attention among them) are found by pattern-matching an operation
// graph of matmuls, pointwise ops and reductions. A graph is built once per shape: tensors
// (non-virtual ones carry a caller-chosen uid and are bound to memory at execution; virtual ones
// live inside the fused kernel), then ops, then heuristics pick engine configs and the first one
// whose execution plan finalizes is kept. Every descriptor a plan refers to stays alive in the
// plan. Scalars passed by value are bound to host floats owned by the plan.
#pragma once

#include <cudnn_graph.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/error.h"

namespace fsdp::cuda::cudnn {

std::string status_message(cudnnStatus_t status);

#define FSDP_CUDNN_CHECK(expr)                                                              \
  do {                                                                                      \
    const cudnnStatus_t fsdp_cudnn_status_ = (expr);                                        \
    if (fsdp_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                            \
      ::fsdp::detail::raise(__FILE__, __LINE__,                                             \
                            ::fsdp::detail::concat("cuDNN error from `", #expr, "`: ",      \
                                                   ::fsdp::cuda::cudnn::status_message(     \
                                                       fsdp_cudnn_status_)));               \
  } while (0)

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type);
  ~Desc();
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return desc_; }
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const void* values);
  template <typename T>
  Desc& set_one(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, T value) {
    return set(name, type, 1, &value);
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void finalize();
  cudnnStatus_t try_finalize();

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

using Dims = std::array<int64_t, 4>;

// A finalized execution plan and everything it refers to.
struct Plan {
  std::vector<std::unique_ptr<Desc>> descs;
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace_bytes = 0;
  std::vector<std::pair<int64_t, float>> by_value;  // uid -> host scalar (stable addresses)
};

class GraphBuilder {
 public:
  // A non-virtual tensor, bound to memory by uid at execution.
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides);
  // A scalar passed by value ([1,1,1,1] fp32), bound to a host float owned by the plan.
  cudnnBackendDescriptor_t scalar(int64_t uid, float value);
  // A tensor that lives inside the fused kernel.
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, Dims dims, Dims strides);

  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                 cudnnBackendDescriptor_t b = nullptr, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1);
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c);
  void reduction(cudnnReduceTensorOp_t op, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);

  // Finalizes the graph and picks a plan (heuristics mode A, then the fallback list). Raises an
  // Error naming `what` and cuDNN's last message when no engine takes the graph. The plan is
  // for the handle's GPU or, with no handle, for the GPU `device_prop` describes (cuDNN's
  // offline planning: a plan that cannot run, but shows whether an engine takes the graph).
  // `remedy` ends the error message (what the user can do instead).
  std::unique_ptr<Plan> build(cudnnHandle_t handle, const std::string& what,
                              const std::string& remedy,
                              cudnnBackendDescriptor_t device_prop = nullptr);

 private:
  cudnnBackendDescriptor_t keep(std::unique_ptr<Desc> d);
  cudnnBackendDescriptor_t make_tensor(int64_t uid, cudnnDataType_t type, Dims dims, Dims strides,
                                       bool is_virtual, bool by_value);
  void add_op(std::unique_ptr<Desc> op);

  std::vector<std::unique_ptr<Desc>> descs_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  std::vector<std::pair<int64_t, float>> by_value_;
  int64_t next_virtual_uid_ = 1 << 20;
};

// Runs `plan` on `stream` with the tensors bound by uid (by-value scalars are added from the
// plan), and `workspace` of at least plan.workspace_bytes.
void execute(cudnnHandle_t handle, cudaStream_t stream, const Plan& plan,
             const std::vector<std::pair<int64_t, void*>>& tensors, void* workspace);

}  // namespace fsdp::cuda::cudnn
