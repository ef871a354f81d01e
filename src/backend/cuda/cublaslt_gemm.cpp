#include "backend/cuda/cublaslt_gemm.h"

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace fsdp::cuda {

namespace {

cudaDataType_t lt_type(DType t) {
  return t == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
}

// An operand's type: fp8 keys carry their formats (bit 1: our A, bit 2: our B).
cudaDataType_t operand_type(uint8_t fp8, bool ours_a, DType ab_t) {
  if (!(fp8 & 1)) return lt_type(ab_t);
  return (fp8 & (ours_a ? 2 : 4)) ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}

// The largest power of two (up to the 256 cuBLASLt assumes by default) dividing the address:
// a view into the middle of a buffer must not get a kernel that needs 16-byte alignment.
uint16_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint16_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment >>= 1;
  return alignment;
}

template <typename T>
void set_desc_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                        const T& value) {
  FSDP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)));
}

template <typename T>
void set_preference(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                    const T& value) {
  FSDP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)));
}

}  // namespace

size_t LtGemm::KeyHash::operator()(const Key& key) const {
  size_t h = 0;
  auto mix = [&h](uint64_t v) {
    h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  };
  mix(static_cast<uint64_t>(key.m));
  mix(static_cast<uint64_t>(key.n));
  mix(static_cast<uint64_t>(key.k));
  mix((uint64_t{key.trans_a} << 0) | (uint64_t{key.trans_b} << 1) |
      (static_cast<uint64_t>(key.ab_t) << 2) | (static_cast<uint64_t>(key.c_t) << 4) |
      (uint64_t{key.align_a} << 8) | (uint64_t{key.align_b} << 24) | (uint64_t{key.align_c} << 40));
  mix(static_cast<uint64_t>(key.fp8) | (uint64_t{key.relu} << 8));
  return h;
}

LtGemm::LtGemm(cudaMemPool_t workspace_pool) : pool_(workspace_pool) {
  if (const char* v = std::getenv("FSDP_GEMM_AUTOTUNE"); v && *v) {
    const std::string value = v;
    FSDP_CHECK(value == "0" || value == "1", "FSDP_GEMM_AUTOTUNE must be 0 or 1, got '", value,
               "'");
    autotune_ = value == "1";
  }
  FSDP_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

LtGemm::~LtGemm() {
  for (auto& [key, plan] : plans_) destroy_plan(plan);
  // Workspaces may still be in use by queued GEMMs: free them in their streams' order.
  for (auto& [stream, workspace] : workspaces_) (void)cudaFreeAsync(workspace, stream);
  if (handle_) (void)cublasLtDestroy(handle_);
}

void* LtGemm::workspace_for(cudaStream_t stream) {
  auto it = workspaces_.find(stream);
  if (it != workspaces_.end()) return it->second;
  // Stream-ordered allocation from the device pool: no device-wide sync on the first GEMM.
  void* workspace = nullptr;
  FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&workspace, kWorkspaceBytes, pool_, stream));
  workspaces_.emplace(stream, workspace);
  return workspace;
}

void LtGemm::destroy_plan(Plan& plan) noexcept {
  if (plan.lt_a) (void)cublasLtMatrixLayoutDestroy(plan.lt_a);
  if (plan.lt_b) (void)cublasLtMatrixLayoutDestroy(plan.lt_b);
  if (plan.lt_c) (void)cublasLtMatrixLayoutDestroy(plan.lt_c);
  if (plan.op) (void)cublasLtMatmulDescDestroy(plan.op);
  plan = Plan{};
}

int LtGemm::fastest(const Plan& plan, const Key& key, const Operands& operands,
                    const cublasLtMatmulHeuristicResult_t* results, int count) {
  const cudaStream_t stream = operands.stream;
  void* workspace = workspace_for(stream);
  const size_t c_bytes = static_cast<size_t>(key.m * key.n) * (key.c_t == DType::F32 ? 4 : 2);
  void* scratch_c = nullptr;
  FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&scratch_c, c_bytes, pool_, stream));
  cudaEvent_t start = nullptr, stop = nullptr;
  FSDP_CUDA_CHECK(cudaEventCreate(&start));
  FSDP_CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.0f, beta = 0.0f;
  int best = 0;
  float best_ms = INFINITY;
  try {
    for (int i = 0; i < count; ++i) {
      auto matmul = [&] {
        return cublasLtMatmul(handle_, plan.op, &alpha, operands.b, plan.lt_a, operands.a,
                              plan.lt_b, &beta, scratch_c, plan.lt_c, scratch_c, plan.lt_c,
                              &results[i].algo, workspace, kWorkspaceBytes, stream);
      };
      if (matmul() != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that cannot run loses
      constexpr int kRuns = 3;
      FSDP_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int r = 0; r < kRuns; ++r) FSDP_CUBLAS_CHECK(matmul());
      FSDP_CUDA_CHECK(cudaEventRecord(stop, stream));
      FSDP_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      FSDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (ms < best_ms) best = i, best_ms = ms;
    }
  } catch (...) {
    (void)cudaFreeAsync(scratch_c, stream);
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  FSDP_CUDA_CHECK(cudaFreeAsync(scratch_c, stream));
  FSDP_CUDA_CHECK(cudaEventDestroy(start));
  FSDP_CUDA_CHECK(cudaEventDestroy(stop));
  return best;
}

std::string LtGemm::describe(const Key& key) {
  std::string fp8;
  if (key.fp8)
    fp8 = std::string(" a=") + (key.fp8 & 2 ? "e5m2" : "e4m3") +
          " b=" + (key.fp8 & 4 ? "e5m2" : "e4m3") + (key.fp8 & 8 ? " (rowwise scales)" : "");
  return "gemm m=" + std::to_string(key.m) + " n=" + std::to_string(key.n) +
         " k=" + std::to_string(key.k) + " trans_a=" + std::to_string(key.trans_a) +
         " trans_b=" + std::to_string(key.trans_b) +
         (key.fp8 ? fp8 : std::string(" ab=") + dtype_name(key.ab_t)) +
         " c=" + dtype_name(key.c_t) + " alignments " + std::to_string(key.align_a) + "/" +
         std::to_string(key.align_b) + "/" + std::to_string(key.align_c);
}

// Note [Fp8 scales before the heuristic]: cuBLASLt's heuristic answers for the descriptor as
// it is. Asked before the scale pointers (or the rowwise scale mode's vectors) are set, it
// may answer for a GEMM without scaling (the rowwise mode without its vectors), so a plan's
// descriptor gets the first call's scale pointers; each call sets its own after.
void LtGemm::make_descriptors(const Key& key, const Operands& operands, Plan& plan) {
  FSDP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Note [Row-major GEMM on a column-major library]: Lt's A is our B, Lt's B is our A.
  const cublasOperation_t lt_trans_a = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t lt_trans_b = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, lt_trans_a);
  set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, lt_trans_b);
  if (key.relu) set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU);

  // Layouts describe the matrices as stored (column-major view, before the transposes).
  const uint64_t a_rows = key.trans_b ? key.k : key.n, a_cols = key.trans_b ? key.n : key.k;
  const uint64_t b_rows = key.trans_a ? key.m : key.k, b_cols = key.trans_a ? key.k : key.m;
  // torchao's default: fast accumulation for the forward GEMM (both operands E4M3), the
  // more accurate one for the gradient GEMMs (an E5M2 operand).
  if ((key.fp8 & 1) && !(key.fp8 & 6))
    set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t{1});
  if (key.fp8 & 8) {  // rowwise: a vector of inverse scales per operand
    set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                       int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F});
    set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                       int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F});
  }
  if (key.fp8 & 1) {
    FSDP_CHECK(operands.a_scale_inv && operands.b_scale_inv, "an fp8 gemm without inverse scales");
    // Note [Row-major GEMM on a column-major library]: cuBLASLt's A is our B.
    set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, operands.b_scale_inv);
    set_desc_attribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, operands.a_scale_inv);
  }
  FSDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.lt_a, operand_type(key.fp8, false, key.ab_t),
                                               a_rows, a_cols, static_cast<int64_t>(a_rows)));
  FSDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.lt_b, operand_type(key.fp8, true, key.ab_t),
                                               b_rows, b_cols, static_cast<int64_t>(b_rows)));
  FSDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.lt_c, lt_type(key.c_t), key.n, key.m,
                                               static_cast<int64_t>(key.n)));
}

int LtGemm::candidates(const Key& key, const Plan& plan, cublasLtMatmulHeuristicResult_t* results,
                       int max_results) {
  cublasLtMatmulPreference_t pref = nullptr;
  FSDP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  int found = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  try {
    set_preference(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
    set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{key.align_b});
    set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t{key.align_a});
    set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t{key.align_c});
    set_preference(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t{key.align_c});
    status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.lt_a, plan.lt_b, plan.lt_c,
                                            plan.lt_c, pref, max_results, results, &found);
  } catch (...) {
    (void)cublasLtMatmulPreferenceDestroy(pref);
    throw;
  }
  (void)cublasLtMatmulPreferenceDestroy(pref);
  // A combination this GPU's cuBLASLt lacks (rowwise fp8 scales on some) is no algorithm, not
  // an internal error: the callers say which GEMM.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return 0;
  FSDP_CUBLAS_CHECK(status);
  return found;
}

LtGemm::Plan LtGemm::make_plan(const Key& key, const Operands& operands) {
  Plan plan;
  try {
    make_descriptors(key, operands, plan);
    cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates]{};
    const int found = candidates(key, plan, results, autotune_ ? kAutotuneCandidates : 1);
    FSDP_CHECK(found > 0, "cuBLASLt has no algorithm for ", describe(key));
    // The ReLU epilogue writes C without reading it, like beta = 0: the same timing applies.
    const int chosen = autotune_ && found > 1 ? fastest(plan, key, operands, results, found) : 0;
    plan.algo = results[chosen].algo;
  } catch (...) {
    destroy_plan(plan);
    throw;
  }
  return plan;
}

bool LtGemm::rowwise_fp8_supported(const float* a_scale_inv, const float* b_scale_inv) {
  if (!rowwise_fp8_supported_) {
    const Key key{16, 16, 16, false, true, DType::BF16, DType::BF16, 256, 256, 256, false, 9};
    Plan plan;
    try {
      make_descriptors(key, Operands{nullptr, nullptr, nullptr, a_scale_inv, b_scale_inv}, plan);
      cublasLtMatmulHeuristicResult_t result{};
      rowwise_fp8_supported_ = candidates(key, plan, &result, 1) > 0;
    } catch (...) {
      destroy_plan(plan);
      throw;
    }
    destroy_plan(plan);
  }
  return *rowwise_fp8_supported_;
}

const LtGemm::Plan& LtGemm::plan_for(const Key& key, const Operands& operands) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  return plans_.emplace(key, make_plan(key, operands)).first->second;
}

void LtGemm::run(cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const void* a, const void* b, DType ab_t, float beta, void* c,
                 DType c_t, bool relu) {
  const Key key{
      m,   n, k, trans_a, trans_b, ab_t, c_t, alignment_of(a), alignment_of(b), alignment_of(c),
      relu};
  const Plan& plan = plan_for(key, Operands{stream, a, b});
  void* workspace = workspace_for(stream);
  FSDP_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.op, &alpha, b, plan.lt_a, a, plan.lt_b, &beta, c,
                                   plan.lt_c, c, plan.lt_c, &plan.algo, workspace, kWorkspaceBytes,
                                   stream));
}

void LtGemm::run_fp8(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* a,
                     Fp8Format a_format, const float* a_scale_inv, const void* b,
                     Fp8Format b_format, const float* b_scale_inv, bool rowwise, void* c,
                     DType c_t) {
  const uint8_t fp8 =
      static_cast<uint8_t>(1 | (a_format == Fp8Format::E5M2 ? 2 : 0) |
                           (b_format == Fp8Format::E5M2 ? 4 : 0) | (rowwise ? 8 : 0));
  const Key key{m,
                n,
                k,
                false,
                true,
                DType::BF16,
                c_t,
                alignment_of(a),
                alignment_of(b),
                alignment_of(c),
                false,
                fp8};
  // The plan's descriptor has this call's scale pointers before the heuristic is asked (Note
  // [Fp8 scales before the heuristic]), so autotuning times the candidates as they will run.
  const Plan* plan = &plan_for(key, Operands{stream, a, b, a_scale_inv, b_scale_inv});
  // Note [Row-major GEMM on a column-major library]: cuBLASLt's A is our B. The pointers go
  // into the cached descriptor at each call; the GEMM reads the values when it runs.
  set_desc_attribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scale_inv);
  set_desc_attribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale_inv);
  const float alpha = 1.0f, beta = 0.0f;
  void* workspace = workspace_for(stream);
  const cublasStatus_t status =
      cublasLtMatmul(handle_, plan->op, &alpha, b, plan->lt_a, a, plan->lt_b, &beta, c, plan->lt_c,
                     c, plan->lt_c, &plan->algo, workspace, kWorkspaceBytes, stream);
  // On the H200 an inverse scale that was not 16-byte aligned was refused here, on the host,
  // with every algorithm the heuristic offered (Note [Fp8 scales 16-byte aligned], fsdp/fp8.h).
  FSDP_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt failed (", cublasGetStatusString(status),
             ") on ", describe(key));
}

}  // namespace fsdp::cuda
