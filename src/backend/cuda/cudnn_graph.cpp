// See Note [cuDNN graphs] in cudnn_graph.h.
#include "backend/cuda/cudnn_graph.h"

#include <cudnn.h>

namespace fsdp::cuda::cudnn {

std::string status_message(cudnnStatus_t status) {
  char last[1024] = {};
  cudnnGetLastErrorString(last, sizeof(last));
  std::string message = cudnnGetErrorString(status);
  if (last[0] != '\0') message += std::string(" (") + last + ")";
  return message;
}

Desc::Desc(cudnnBackendDescriptorType_t type) {
  FSDP_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_));
}

Desc::~Desc() {
  if (desc_) (void)cudnnBackendDestroyDescriptor(desc_);
}

Desc& Desc::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                const void* values) {
  const cudnnStatus_t status = cudnnBackendSetAttribute(desc_, name, type, count, values);
  FSDP_CHECK(status == CUDNN_STATUS_SUCCESS, "cuDNN rejected attribute ", static_cast<int>(name),
             " (type ", static_cast<int>(type), ", count ", count, "): ", status_message(status));
  return *this;
}

void Desc::finalize() {
  FSDP_CUDNN_CHECK(cudnnBackendFinalize(desc_));
}

cudnnStatus_t Desc::try_finalize() {
  return cudnnBackendFinalize(desc_);
}

cudnnBackendDescriptor_t GraphBuilder::keep(std::unique_ptr<Desc> d) {
  descs_.push_back(std::move(d));
  return descs_.back()->get();
}

cudnnBackendDescriptor_t GraphBuilder::make_tensor(int64_t uid, cudnnDataType_t type, Dims dims,
                                                   Dims strides, bool is_virtual,
                                                   bool by_value) {
  auto d = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  d->set_one(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data())
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data())
      .set_one(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid)
      .set_one(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, alignment);
  if (is_virtual) d->set_one(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, true);
  if (by_value) d->set_one(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, true);
  d->finalize();
  return keep(std::move(d));
}

cudnnBackendDescriptor_t GraphBuilder::tensor(int64_t uid, cudnnDataType_t type, Dims dims,
                                              Dims strides) {
  return make_tensor(uid, type, dims, strides, false, false);
}

cudnnBackendDescriptor_t GraphBuilder::scalar(int64_t uid, float value) {
  by_value_.emplace_back(uid, value);
  return make_tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
}

cudnnBackendDescriptor_t GraphBuilder::virt(cudnnDataType_t type, Dims dims, Dims strides) {
  return make_tensor(next_virtual_uid_++, type, dims, strides, true, false);
}

void GraphBuilder::add_op(std::unique_ptr<Desc> op) {
  op->finalize();
  ops_.push_back(keep(std::move(op)));
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                             cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t b,
                             cudnnBackendDescriptor_t t, cudnnDataType_t math, int64_t axis) {
  auto pw = std::make_unique<Desc>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw->set_one(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode)
      .set_one(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, math);
  if (mode == CUDNN_POINTWISE_GEN_INDEX)
    pw->set_one(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
  pw->finalize();
  auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, keep(std::move(pw)))
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
      .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
  if (b) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
  if (t) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
  op->set_one(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1.0f)
      .set_one(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1.0f);
  add_op(std::move(op));
}

void GraphBuilder::matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                          cudnnBackendDescriptor_t c) {
  auto mm = std::make_unique<Desc>(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  mm->set_one(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
  mm->finalize();
  auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
      .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, keep(std::move(mm)));
  add_op(std::move(op));
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t reduce_op, cudnnBackendDescriptor_t x,
                             cudnnBackendDescriptor_t y) {
  auto red = std::make_unique<Desc>(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  red->set_one(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
      .set_one(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, reduce_op);
  red->finalize();
  auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
      .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, keep(std::move(red)));
  add_op(std::move(op));
}

void GraphBuilder::reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  auto op = std::make_unique<Desc>(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
  add_op(std::move(op));
}

std::unique_ptr<Plan> GraphBuilder::build(cudnnHandle_t handle, const std::string& what,
                                          const std::string& remedy,
                                          cudnnBackendDescriptor_t device_prop) {
  auto graph = std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             static_cast<int64_t>(ops_.size()), ops_.data());
  if (handle) graph->set_one(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle);
  const cudnnStatus_t graph_status = graph->try_finalize();
  FSDP_CHECK(graph_status == CUDNN_STATUS_SUCCESS, "cuDNN rejected the operation graph of ", what,
             ": ", status_message(graph_status), "; ", remedy);
  const cudnnBackendDescriptor_t graph_desc = keep(std::move(graph));
  std::string last_failure = "heuristics found no viable engine config";
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph_desc)
        .set_one(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
    if (device_prop) heur.set_desc(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, device_prop);
    if (const cudnnStatus_t s = heur.try_finalize(); s != CUDNN_STATUS_SUCCESS) {
      last_failure = "heuristics: " + status_message(s);
      continue;
    }
    int64_t count = 0;
    FSDP_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    std::vector<std::unique_ptr<Desc>> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    int64_t returned = 0;
    if (count > 0)
      FSDP_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned,
                                                raw.data()));
    for (int64_t i = 0; i < returned; ++i) {
      auto plan_desc = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      if (handle) plan_desc->set_one(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle);
      if (device_prop) plan_desc->set_desc(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, device_prop);
      plan_desc->set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, raw[i]);
      if (const cudnnStatus_t s = plan_desc->try_finalize(); s != CUDNN_STATUS_SUCCESS) {
        last_failure = "engine config " + std::to_string(i) + ": " + status_message(s);
        continue;
      }
      auto plan = std::make_unique<Plan>();
      FSDP_CUDNN_CHECK(cudnnBackendGetAttribute(plan_desc->get(),
                                                CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                CUDNN_TYPE_INT64, 1, nullptr,
                                                &plan->workspace_bytes));
      plan->plan = plan_desc->get();
      descs_.push_back(std::move(configs[static_cast<size_t>(i)]));
      descs_.push_back(std::move(plan_desc));
      plan->descs = std::move(descs_);
      plan->by_value = std::move(by_value_);
      return plan;
    }
  }
  FSDP_FAIL("cuDNN has no engine for ", what, " (", last_failure,
            "; CUDNN_LOGLEVEL_DBG=2 shows every engine's reason); ", remedy);
}

void execute(cudnnHandle_t handle, cudaStream_t stream, const Plan& plan,
             const std::vector<std::pair<int64_t, void*>>& tensors, void* workspace) {
  std::vector<int64_t> uids;
  std::vector<void*> pointers;
  for (const auto& [uid, ptr] : tensors) {
    uids.push_back(uid);
    pointers.push_back(ptr);
  }
  for (const auto& [uid, value] : plan.by_value) {
    uids.push_back(uid);
    pointers.push_back(const_cast<float*>(&value));
  }
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
           uids.data())
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
           static_cast<int64_t>(pointers.size()), pointers.data())
      .set_one(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace);
  pack.finalize();
  FSDP_CUDNN_CHECK(cudnnSetStream(handle, stream));
  FSDP_CUDNN_CHECK(cudnnBackendExecute(handle, plan.plan, pack.get()));
}

}  // namespace fsdp::cuda::cudnn
