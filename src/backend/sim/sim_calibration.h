// What the simulation backend knows about a GPU and its links: measured op timings and bus
// bandwidths, read from a calibration file (Note [Calibration file]), and the cost of each op
// derived from them (Note [Op costs]).
//
// Note [Calibration file]
// JSON, {"format": "fsdp-sim-calibration", "version": 1, ...}; every number is checked
// (finite, in range) when the file is read, and a bad one fails naming its key:
//  - "device": what was measured (text); "peak_tflops": dense bf16 peak, for MFU;
//    "device_memory_gib" (optional): what a rank's peak must fit in;
//  - "host": {"kernel_launch_us", "gemm_launch_us", "collective_launch_us"}: host time of one
//    call (what an eager step's host pays per op; 0 under a captured step); "moe_route_us" and
//    "moe_route_backward_us" (optional, 0 when absent): the host's own work in one dropless
//    MoE layer once it has read the router's probabilities (the routing), and once it has read
//    the combine weights' gradients (the router's gradient) (Note [Simulated host routing]);
//  - "kernel_min_us": the least time a kernel takes on the device; "kernel_sharing" (optional,
//    in [0, 1], 1 when absent): how kernels of different streams share the GPU while they
//    overlap (Note [Shared channels]), so that op timings measured alone add up in a step;
//    "memory_kernel_sharing" (optional, in [0, 4], kernel_sharing when absent): the same for
//    memory-bound kernels (those Note [Op costs] times by bytes), which lose more to a GEMM
//    beside them than the GEMM loses to them; "memory_kernel_yield" and "memory_kernel_lead"
//    (optional, in [0, 16], memory_kernel_sharing when absent): what each kernel of a
//    higher-priority stream adds in its place to a memory-bound kernel beside it, and each
//    kernel of a lower-priority one (the engine's all-gather and reduce-scatter streams are
//    high, compute normal), as the GPU hands free SMs to the high-priority streams first;
//  - "memory": {"gbps": copy bandwidth (bytes read + written per second, in GB/s),
//    "host_copy_gbps": host <-> device, "by_op": {op class: GB/s}} for memory-bound kernels
//    whose measured bandwidth differs from a copy's (Note [Op costs] names the classes);
//  - "gemm": {"default_tflops": {dtype: TFLOP/s}, "in_step_factor": {layout: factor},
//    "grouped_factor": {layout: factor}, "table": [{"dtype", "m", "n", "k", "layout", "us"}]}:
//    measured GEMMs alone; layout is "nn", "nt", "tn" or "tt" (trans_a, trans_b);
//    in_step_factor scales a layout's GEMMs for what they lose to the kernels beside them in a
//    real step, grouped_factor a grouped GEMM (one call for many, as the MoE experts issue
//    them): its time over the same GEMMs one by one at the table's times, as timed alone or
//    in a traced step (bench/fit_calibration.py --moe-step; both 1 when absent);
//    "fp8" (optional): {"tensorwise", "rowwise": the time of Device::fp8_gemm's GEMM kernel
//    over the bf16 GEMM's of the same shape and layout, per recipe; "rowwise_outer_vector":
//    whether cuBLASLt takes rowwise scales itself (true when absent), else each rowwise GEMM
//    also runs the fp32 pass of Note [Rowwise fp8 without outer-vector scales]}; without it
//    --fp8 is not simulated (Note [Simulated fp8] in sim_fp8_ops.cpp);
//  - "attention": {"forward": [...], "backward": [...]}, rows {"batch", "seq", "heads",
//    "kv_heads", "head_dim", "us"}, and "default_tflops_forward" / "_backward";
//  - "links": {"nvlink": L, "network": L}, L = {"base_us": once per collective (launch and
//    synchronization; 0 when absent), "latency_us": per ring step, "busbw_gbps":
//    [[message bytes, GB/s], ...]}: NCCL's bus bandwidth by message size (log-linear in
//    between, flat beyond the ends). The network's is per GPU (its own NIC).
#pragma once

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/dtype.h"

namespace fsdp::sim {

struct GemmSample {
  DType dtype = DType::BF16;
  int64_t m = 0, n = 0, k = 0;
  int layout = 0;  // bit 1: trans_a, bit 0: trans_b
  double us = 0;
};

struct AttentionSample {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double us = 0;
};

struct LinkCurve {
  double base_us = 0;                             // once per collective
  double latency_us = 0;                          // per ring step
  std::vector<std::pair<double, double>> busbw;   // (message bytes, GB/s), by bytes
  // Bus bandwidth for a message of `bytes`, in GB/s.
  double gbps(double bytes) const;
  // The curve scaled so that its largest bandwidth is `peak_gbps`.
  void scale_to(double peak_gbps);
  double peak_gbps() const;
};

// Note [Simulated fp8]: what an fp8 GEMM costs against the bf16 GEMM of the same call.
struct Fp8GemmRates {
  double tensorwise = 0, rowwise = 0;  // time ratios; 0: not calibrated
  bool rowwise_outer_vector = true;
};

struct Calibration {
  std::string device = "unknown";
  std::string source;  // the file it was read from ("" for a built-in one)
  double peak_tflops = 989;
  double device_memory_gib = 0;  // 0: unknown (nothing is said about fitting)
  double kernel_launch_us = 0, gemm_launch_us = 0, collective_launch_us = 0;
  double moe_route_us = 0, moe_route_backward_us = 0;  // Note [Simulated host routing]
  double kernel_min_us = 0;
  double kernel_sharing = 1.0;  // Note [Shared channels]: how overlapping kernels share the GPU
  double memory_kernel_sharing = -1;  // the same for memory-bound kernels; < 0: kernel_sharing
  double memory_kernel_yield = -1;    // beside a higher-priority kernel; < 0: as above
  double memory_kernel_lead = -1;     // beside a lower-priority kernel; < 0: as above
  double memory_gbps = 3000;
  double host_copy_gbps = 25;
  std::map<std::string, double> op_gbps;  // memory-bound op class -> GB/s
  std::map<DType, double> gemm_default_tflops;
  std::array<double, 4> gemm_in_step_factor{1, 1, 1, 1};  // by layout
  std::array<double, 4> grouped_gemm_factor{1, 1, 1, 1};  // by layout
  std::vector<GemmSample> gemms;
  Fp8GemmRates fp8;
  std::vector<AttentionSample> attention_forward, attention_backward;
  double attention_forward_tflops = 300, attention_backward_tflops = 250;
  LinkCurve nvlink, network;
};

// Reads and checks a calibration file; a UserError naming the file and the bad key.
Calibration read_calibration(const std::string& path);
Calibration parse_calibration(const std::string& text, const std::string& source);
// A calibration of round numbers with no host costs and no latency: every op costs exactly
// its bytes or flops at the rates given, which is what hand-computed tests want.
Calibration ideal_calibration(double memory_gbps, double tflops, double link_gbps);

// ---- Note [Op costs]
// Device microseconds of one op on the calibrated GPU; no op is shorter than kernel_min_us.
double gemm_us(const Calibration& c, DType ab_t, int64_t m, int64_t n, int64_t k, int layout);
// One grouped GEMM over `count` groups of (m, n, k): the groups' GEMM times less the kernel
// minimum each would pay alone, times the layout's grouped factor, plus one kernel minimum.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};
double grouped_gemm_us(const Calibration& c, DType ab_t, const GemmShape* groups, int count,
                       int layout);
// The GEMM kernel of Device::fp8_gemm (Note [Simulated fp8]): the bf16 GEMM of the same
// shape and layout at the calibration's fp8 ratio for the recipe (which must be calibrated).
double fp8_gemm_us(const Calibration& c, bool rowwise, int64_t m, int64_t n, int64_t k,
                   int layout);
// Causal attention, grouped-query; forward or backward.
double attention_us(const Calibration& c, bool backward, int64_t batch, int64_t seq,
                    int64_t heads, int64_t kv_heads, int64_t head_dim);
// A memory-bound kernel of op class `op` moving `bytes` (read + written).
double memory_us(const Calibration& c, const std::string& op, double bytes);
// The flops the attention counts (causal: half the score matrix), forward or backward.
double attention_flops(bool backward, int64_t batch, int64_t seq, int64_t heads,
                       int64_t head_dim);

}  // namespace fsdp::sim
