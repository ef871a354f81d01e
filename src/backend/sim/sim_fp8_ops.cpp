// Note [Simulated fp8]
// The simulated device's fp8 ops (docs/fp8.md) cost what the CUDA backend's do
// (src/backend/cuda/cuda_fp8_ops.cpp), op by op, and compute nothing:
//  - fp8_amax and fp8_cast are memory-bound passes: their bytes (x read; the amaxes written;
//    for the cast also the amaxes read, the one-byte codes and the inverse scales written) at
//    their op class's bandwidth (memory.by_op "fp8_amax", "fp8_cast"; the calibration's
//    memory.gbps when it has none), as the other memory-bound kernels (Note [Op costs]).
//  - fp8_gemm runs what the CUDA backend enqueues: cuBLASLt's fp8 kernels take one layout
//    (A [m, k], B [n, k] row-major), so an A stored transposed and a B stored untransposed
//    are first transposed byte by byte (memory class "fp8_transpose", read + written); then
//    the GEMM kernel, the bf16 GEMM of the same call (shape and layout, Note [Op costs]) at
//    the calibration's time ratio for the recipe (gemm.fp8, fp8_gemm_us); rowwise without
//    cuBLASLt's outer-vector scales (gemm.fp8.rowwise_outer_vector false) also fills a unit
//    scale and runs the fp32 pass of Note [Rowwise fp8 without outer-vector scales]
//    ("fp8_scale_outer": the fp32 products and the scales read, C written).
//  - Memory: the ledger counts what the engine allocates, as on the CPU backend; the CUDA
//    backend's own stream-ordered temporaries inside fp8_gemm (the transposed operands, the
//    fp32 products) are not counted.
// The fp8 all-gather needs nothing here: the engine gathers the codes as param-dtype units
// (Note [Float8 all-gather]) and its amax all-reduce is an ordinary all-reduce, so the
// simulated collectives' bytes follow from its calls.
#include "backend/sim/sim_device.h"
#include "fsdp/error.h"

namespace fsdp::sim {

namespace {

double d(int64_t n) {
  return static_cast<double>(n);
}

int64_t scale_count(Device::Fp8Axis axis, int64_t rows, int64_t cols) {
  return axis == Device::Fp8Axis::Tensor ? 1 : axis == Device::Fp8Axis::Rows ? rows : cols;
}

void check_input(const char* op, DType t, int64_t rows, int64_t cols) {
  FSDP_CHECK(rows >= 0 && cols >= 0, op, ": rows ", rows, ", cols ", cols);
  FSDP_CHECK(t == DType::F32 || t == DType::BF16, op, ": x must be fp32 or bf16, got ",
             dtype_name(t));
}

}  // namespace

void SimDevice::fp8_amax(Stream s, const void*, DType t, int64_t rows, int64_t cols, Fp8Axis axis,
                         float* amax) {
  check_input("fp8_amax", t, rows, cols);
  FSDP_CHECK(amax != nullptr, "fp8_amax: amax is null");
  memory_op(s, "fp8_amax",
            d(rows) * d(cols) * d(dtype_size(t)) + 4 * d(scale_count(axis, rows, cols)));
}

void SimDevice::fp8_cast(Stream s, const void*, DType t, DType, int64_t rows, int64_t cols,
                         Fp8Axis axis, const float* amax, Fp8Format, uint8_t* q, uint8_t* q_t,
                         float* scale_inv) {
  check_input("fp8_cast", t, rows, cols);
  FSDP_CHECK(amax != nullptr && (rows * cols == 0 || q != nullptr || q_t != nullptr),
             "fp8_cast: a null buffer");
  const double scales = d(scale_count(axis, rows, cols));
  // x read once; one byte written per element for each layout asked for (Note [Fp8 cast tiles]).
  const double layouts = (q ? 1 : 0) + (q_t ? 1 : 0);
  memory_op(s, "fp8_cast",
            d(rows) * d(cols) * (d(dtype_size(t)) + layouts) + 4 * scales * (scale_inv ? 2 : 1));
}

void SimDevice::fp8_gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         Fp8Operand a, Fp8Operand b, bool rowwise, void* c, DType c_t) {
  check_fp8_gemm(m, n, k, a, b, c);
  if (m == 0 || n == 0) return;  // as on CUDA: nothing is enqueued
  if (k == 0) {
    fill(s, c, c_t, m * n, 0.0f);
    return;
  }
  const Calibration& cal = calibration();
  if (trans_a) memory_op(s, "fp8_transpose", 2 * d(m) * d(k));
  if (!trans_b) memory_op(s, "fp8_transpose", 2 * d(n) * d(k));
  static const char* names[4] = {"fp8_gemm_nn", "fp8_gemm_nt", "fp8_gemm_tn", "fp8_gemm_tt"};
  const int layout = (trans_a ? 2 : 0) | (trans_b ? 1 : 0);
  timed(s, OpKind::Kernel, names[layout], fp8_gemm_us(cal, rowwise, m, n, k, layout),
        cal.gemm_launch_us, 0, 2 * d(m) * d(n) * d(k));
  if (rowwise && !cal.fp8.rowwise_outer_vector) {
    memory_op(s, "fill", 4);
    memory_op(s, "fp8_scale_outer", d(m) * d(n) * (4 + d(dtype_size(c_t))) + 4 * (d(m) + d(n)));
  }
}

}  // namespace fsdp::sim
