// The MoE layer's ops on CUDA. The grouped GEMM (Note [Grouped GEMM] in include/fsdp/device.h):
// every non-empty group in one cublasGemmGroupedBatchedEx call, so the local experts' GEMMs of
// one projection are one launch instead of one per expert. The capacity-factor routing (Note
// [Device MoE routing]): kernels_moe_routing.cu.
#include <cublas_v2.h>

#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/staging_ring.h"
#include "backend/op_checks.h"

namespace fsdp::cuda {

class CublasHandle {
 public:
  CublasHandle() { FSDP_CUBLAS_CHECK(cublasCreate(&handle_)); }
  ~CublasHandle() {
    if (handle_) (void)cublasDestroy(handle_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

namespace {

cudaDataType_t cublas_type(DType t) {
  FSDP_CHECK(t == DType::F32 || t == DType::BF16, "grouped_gemm: unsupported dtype ", dtype_name(t));
  return t == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
}

int as_int(int64_t v, const char* what) {
  FSDP_CHECK(v >= 0 && v <= INT32_MAX, "grouped_gemm: ", what, " ", v, " does not fit in int");
  return static_cast<int>(v);
}

}  // namespace

// Row-major to column-major as in Note [Row-major GEMM on a column-major library]: cuBLAS's
// A is our B (transposed iff trans_b), its B is our A (iff trans_a), its M, N, K our n, m, k.
void CudaDevice::grouped_gemm(Stream s, bool trans_a, bool trans_b, const GemmGroup* groups,
                              int count, DType ab_t, DType c_t) {
  OpScope op(*this, s, OpKind::Kernel);
  const int n_groups = count;
  std::vector<cublasOperation_t> op_a, op_b;
  std::vector<int> m, n, k, lda, ldb, ldc, group_size;
  std::vector<float> alpha, beta;
  std::vector<const void*> a_ptrs, b_ptrs;
  std::vector<void*> c_ptrs;
  for (int i = 0; i < n_groups; ++i) {
    const GemmGroup& g = groups[i];
    FSDP_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "grouped_gemm group ", i, " shape ", g.m, "x",
               g.n, "x", g.k);
    if (g.m == 0 || g.n == 0) continue;
    if (g.k == 0) {
      kernels::fill(op.stream(), g.c, c_t, g.m * g.n, 0.0f);
      continue;
    }
    op_a.push_back(trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    op_b.push_back(trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    m.push_back(as_int(g.n, "n"));
    n.push_back(as_int(g.m, "m"));
    k.push_back(as_int(g.k, "k"));
    lda.push_back(as_int(trans_b ? g.k : g.n, "ld"));
    ldb.push_back(as_int(trans_a ? g.m : g.k, "ld"));
    ldc.push_back(as_int(g.n, "ld"));
    alpha.push_back(1.0f);
    beta.push_back(0.0f);
    group_size.push_back(1);
    a_ptrs.push_back(g.b);
    b_ptrs.push_back(g.a);
    c_ptrs.push_back(g.c);
  }
  const int launched = static_cast<int>(group_size.size());
  if (launched == 0) return;
  if (!cublas_) cublas_ = std::make_shared<CublasHandle>();
  FSDP_CUBLAS_CHECK(cublasSetStream(cublas_->get(), op.stream()));
  // The pointer arrays live on the device; the shapes, scalars and group sizes on the host.
  std::vector<const void*> pointers;
  pointers.insert(pointers.end(), a_ptrs.begin(), a_ptrs.end());
  pointers.insert(pointers.end(), b_ptrs.begin(), b_ptrs.end());
  pointers.insert(pointers.end(), c_ptrs.begin(), c_ptrs.end());
  const auto* staged = static_cast<const void* const*>(
      upload(op.stream(), pointers.data(), pointers.size() * sizeof(void*)));
  try {
    FSDP_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        cublas_->get(), op_a.data(), op_b.data(), m.data(), n.data(), k.data(), alpha.data(),
        staged, cublas_type(ab_t), lda.data(), staged + launched, cublas_type(ab_t), ldb.data(),
        beta.data(), const_cast<void* const*>(staged + 2 * launched), cublas_type(c_t),
        ldc.data(), launched, group_size.data(), CUBLAS_COMPUTE_32F));
  } catch (...) {
    release_upload(op.stream());
    throw;
  }
  release_upload(op.stream());
}

void CudaDevice::moe_route(Stream s, const MoeRouting& r) {
  backend::check_moe_routing(r, "moe_route");
  OpScope op(*this, s, OpKind::Kernel);
  kernels::moe_route(op.stream(), pool_, r);
}

void CudaDevice::moe_route_backward(Stream s, const MoeRouting& r, const float* dsend_weight,
                                    float* dprobs) {
  const char* name = "moe_route_backward";
  backend::check_moe_routing(r, name);
  if (r.tokens > 0) backend::check_ptr(dprobs, "dprobs", name);
  if (r.tokens > 0) backend::check_ptr(dsend_weight, "dsend_weight", name);
  OpScope op(*this, s, OpKind::Kernel);
  kernels::moe_route_backward(op.stream(), r, dsend_weight, dprobs);
}

}  // namespace fsdp::cuda
