// fp8 on the CUDA backend (docs/fp8.md): the casts in kernels_fp8.cu, the GEMM on cuBLASLt
// with device-side inverse scales (CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER; rowwise through
// the OUTER_VEC_32F scale mode), so no host read and graph capture works.
//
// cuBLASLt runs fp8 GEMMs in one layout only (row-major A [m, k] and B [n, k], "TN" in its
// column-major terms): an operand in the other layout is transposed into a stream-ordered
// temporary first. The scales keep their meaning (per row of op(A), per column of op(B)).
//
// Note [Rowwise fp8 without outer-vector scales]: cuBLASLt's rowwise (OUTER_VEC_32F) scales
// are not on every GPU (on the H200 with cuBLAS 13 the heuristic refuses them). Rowwise
// scales factor out of the sum (sum_k a[i,k] sa[i] b[k,j] sb[j] = sa[i] sb[j] sum_k ...), so
// there the GEMM runs on the codes with unit scales into fp32 and a kernel applies them.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernels.h"
#include "fsdp/error.h"

namespace fsdp::cuda {

namespace {

void check_fp8_input(const char* op, const void* x, DType t, int64_t rows, int64_t cols) {
  FSDP_CHECK(rows >= 0 && cols >= 0, op, ": rows ", rows, ", cols ", cols);
  FSDP_CHECK(t == DType::F32 || t == DType::BF16, op, ": x must be fp32 or bf16, got ",
             dtype_name(t));
  FSDP_CHECK(rows * cols == 0 || x != nullptr, op, ": x is null");
}

}  // namespace

void CudaDevice::fp8_amax(Stream s, const void* x, DType t, int64_t rows, int64_t cols,
                          Fp8Axis axis, float* amax) {
  check_fp8_input("fp8_amax", x, t, rows, cols);
  FSDP_CHECK(amax != nullptr, "fp8_amax: amax is null");
  OpScope op(*this, s, OpKind::Kernel);
  kernels::fp8_amax(op.stream(), x, t, rows, cols, axis, amax);
}

void CudaDevice::fp8_cast(Stream s, const void* x, DType t, DType value_t, int64_t rows,
                          int64_t cols, Fp8Axis axis, const float* amax, Fp8Format f, uint8_t* q,
                          uint8_t* q_t, float* scale_inv) {
  check_fp8_input("fp8_cast", x, t, rows, cols);
  FSDP_CHECK(amax != nullptr && (rows * cols == 0 || q != nullptr || q_t != nullptr),
             "fp8_cast: a null buffer");
  OpScope op(*this, s, OpKind::Kernel);
  kernels::fp8_cast(op.stream(), x, t, value_t, rows, cols, axis, amax, f, q, q_t, scale_inv);
}

void CudaDevice::fp8_gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          Fp8Operand a, Fp8Operand b, bool rowwise, void* c, DType c_t) {
  const char* name = "fp8_gemm";
  check_fp8_gemm(m, n, k, a, b, c);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // no products: zeros, as Device::gemm gives
    OpScope op(*this, s, OpKind::Kernel);
    kernels::fill(op.stream(), c, c_t, m * n, 0.0f);
    return;
  }
  // cuBLASLt's fp8 kernels want 16-byte aligned rows: k (the leading dimension of both
  // operands in its layout) a multiple of 16, and m and n too for the transposed copies and C.
  FSDP_CHECK(m % 16 == 0 && n % 16 == 0 && k % 16 == 0, name, " on CUDA needs m, n and k "
             "multiples of 16 (cuBLASLt's fp8 GEMMs), got ", m, "x", n, "x", k);
  uint8_t* a_t = nullptr;
  uint8_t* b_t = nullptr;
  if (trans_a) a_t = static_cast<uint8_t*>(alloc(static_cast<size_t>(m * k), s, MemTag::Activation));
  if (!trans_b) b_t = static_cast<uint8_t*>(alloc(static_cast<size_t>(n * k), s, MemTag::Activation));
  float* acc = nullptr;  // Note [Rowwise fp8 without outer-vector scales]
  if (rowwise && !gemm_->rowwise_fp8_supported(a.scale_inv, b.scale_inv))
    acc = static_cast<float*>(
        alloc(static_cast<size_t>(m * n + 1) * sizeof(float), s, MemTag::Activation));
  {
    OpScope op(*this, s, OpKind::Kernel);
    const uint8_t* a_rows = a.data;  // [m, k]
    const uint8_t* b_rows = b.data;  // [n, k]
    if (a_t) kernels::transpose_u8(op.stream(), a.data, k, m, a_t), a_rows = a_t;
    if (b_t) kernels::transpose_u8(op.stream(), b.data, k, n, b_t), b_rows = b_t;
    if (acc) {
      // Note [Rowwise fp8 without outer-vector scales]: op(A) op(B) of the codes with unit
      // scales, in fp32, then each element times its row's and its column's inverse scale:
      // the same product, one fp32 pass more.
      float* one = acc + m * n;
      kernels::fill(op.stream(), one, DType::F32, 1, 1.0f);
      gemm_->run_fp8(op.stream(), m, n, k, a_rows, a.format, one, b_rows, b.format, one, false,
                     acc, DType::F32);
      kernels::fp8_scale_outer(op.stream(), acc, m, n, a.scale_inv, b.scale_inv, c, c_t);
    } else {
      gemm_->run_fp8(op.stream(), m, n, k, a_rows, a.format, a.scale_inv, b_rows, b.format,
                     b.scale_inv, rowwise, c, c_t);
    }
  }
  if (a_t) free(a_t, s);  // stream-ordered: after the GEMM read it
  if (b_t) free(b_t, s);
  if (acc) free(acc, s);
}

}  // namespace fsdp::cuda
