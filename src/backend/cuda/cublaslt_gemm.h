// Device::gemm on cuBLASLt.
//
// Note [Row-major GEMM on a column-major library]
// cuBLASLt is column-major. A row-major [r, c] matrix read column-major is its transpose
// [c, r] with leading dimension c, so instead of C = op(A) op(B) (row-major) we ask cuBLASLt
// for C^T = op(B)^T op(A)^T (column-major), which lands in memory as row-major C. Hence
// cuBLASLt's "A" is our B (transposed iff trans_b) and its "B" is our A (iff trans_a), and
// its M, N, K are our n, m, k.
//
// Plans (descriptors, layouts, and the heuristic's algorithm) are cached per shape, transposes,
// dtypes and pointer alignment, so the steady state makes no heuristic query. Each stream
// gets its own workspace, since two GEMMs on different streams may run at once. Not
// thread-safe: a device is driven by its rank's thread.
//
// Note [GEMM autotune]
// cuBLASLt's heuristic ranks algorithms by a model, not by a run, and its first choice is not
// always the fastest (weight-gradient shapes, where K is the token count, are the usual
// suspects). With FSDP_GEMM_AUTOTUNE=1 a new plan times the heuristic's top kAutotuneCandidates
// on the call's own operands (into a scratch output, so C is untouched) and keeps the fastest.
// This synchronizes the stream once per new shape (the first step), and the choice may differ
// between runs; it is off by default so plans stay deterministic.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "fsdp/dtype.h"
#include "fsdp/fp8.h"

namespace fsdp::cuda {

class LtGemm {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;
  static constexpr int kAutotuneCandidates = 8;

  explicit LtGemm(cudaMemPool_t workspace_pool);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Device::gemm's contract (include/fsdp/device.h); m, n, k > 0.
  void run(cudaStream_t stream, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const void* a, const void* b, DType ab_t, float beta, void* c, DType c_t,
           bool relu = false);  // relu: the CUBLASLT_EPILOGUE_RELU epilogue

  // Device::fp8_gemm with C = op(A) op(B) in cuBLASLt's one fp8 layout: A [m, k] and B
  // [n, k], both row-major (trans_a false, trans_b true); the caller transposes the rest. The
  // inverse scales are device pointers (one each, or m and n with rowwise: the
  // CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F mode), read when the GEMM runs.
  void run_fp8(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const void* a,
               Fp8Format a_format, const float* a_scale_inv, const void* b, Fp8Format b_format,
               const float* b_scale_inv, bool rowwise, void* c, DType c_t);

  // Whether this GPU's cuBLASLt has fp8 GEMMs with rowwise (outer-vector) scales; asked once,
  // with the first rowwise call's inverse scales (device pointers, m and n floats).
  bool rowwise_fp8_supported(const float* a_scale_inv, const float* b_scale_inv);

  size_t cached_plans() const { return plans_.size(); }
  bool autotune() const { return autotune_; }
  void set_autotune(bool on) { autotune_ = on; }  // for plans made after the call

 private:
  struct Key {
    int64_t m, n, k;
    bool trans_a, trans_b;
    DType ab_t, c_t;
    uint16_t align_a, align_b, align_c;  // bytes, power of two up to 256
    bool relu;
    // fp8 GEMMs: bit 0 set, bit 1 A is E5M2, bit 2 B is E5M2, bit 3 rowwise (0: not fp8).
    uint8_t fp8 = 0;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // The operands of the call that needs the plan: what autotuning runs on.
  struct Operands {
    cudaStream_t stream;
    const void *a, *b;
    // fp8: the inverse scales, set on the descriptor before the heuristic is asked (Note
    // [Fp8 scales before the heuristic] in cublaslt_gemm.cpp).
    const float* a_scale_inv = nullptr;
    const float* b_scale_inv = nullptr;
  };
  const Plan& plan_for(const Key& key, const Operands& operands);
  Plan make_plan(const Key& key, const Operands& operands);
  void make_descriptors(const Key& key, const Operands& operands, Plan& plan);
  // The heuristic's algorithms for the plan (up to max_results); 0 when cuBLASLt has none.
  int candidates(const Key& key, const Plan& plan, cublasLtMatmulHeuristicResult_t* results,
                 int max_results);
  static std::string describe(const Key& key);
  // Index of the fastest of `count` algorithms on the operands (Note [GEMM autotune]).
  int fastest(const Plan& plan, const Key& key, const Operands& operands,
              const cublasLtMatmulHeuristicResult_t* results, int count);
  static void destroy_plan(Plan& plan) noexcept;
  void* workspace_for(cudaStream_t stream);

  bool autotune_ = false;
  std::optional<bool> rowwise_fp8_supported_;
  cublasLtHandle_t handle_ = nullptr;
  cudaMemPool_t pool_;
  std::unordered_map<Key, Plan, KeyHash> plans_;
  std::unordered_map<cudaStream_t, void*> workspaces_;
};

}  // namespace fsdp::cuda
