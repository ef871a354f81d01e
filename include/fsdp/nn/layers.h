// The building blocks: Linear, activations, Sequential, a residual MLP block, an MoE block.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/module.h"

namespace fsdp::nn {

struct Fp8Operand;  // src/nn/fp8_linear.h

// The RMSNorm epsilon of the resmlp and moe blocks' pre-norms (as the transformer's).
constexpr float kNormEps = 1e-5f;

// Deterministic init: the same values whatever the world size, so sharded runs can be
// compared with an unsharded reference. Uniform(-bound, bound).
std::vector<float> uniform_init(uint64_t seed, int64_t n, float bound);
// The same values, made when the param first needs them (Note [Lazy initial values]).
ParamInit uniform_init_fn(uint64_t seed, int64_t n, float bound);
// n zeros, made when the param first needs them.
ParamInit zeros_init_fn(int64_t n);

class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias, uint64_t seed);
  // No bias; the weight ([out, in], row-major) starts at `weight_init`.
  Linear(int64_t in, int64_t out, std::vector<float> weight_init);
  Linear(int64_t in, int64_t out, ParamInit weight_init);
  // With a bias ([out]) that starts at `bias_init`.
  Linear(int64_t in, int64_t out, ParamInit weight_init, ParamInit bias_init);
  Param& weight() const { return *params()[0]; }
  Param* bias() const { return params().size() > 1 ? params()[1].get() : nullptr; }
  // Zero-bubble style: compute the weight grad later, in flush_deferred_grads().
  bool defer_weight_grad = false;
  // y = relu(x W^T) with the ReLU in the GEMM's epilogue (Device::gemm_relu): one pass over
  // the output instead of three. No bias.
  bool fused_relu = false;
  void flush_deferred_grads(RunContext& ctx);
  // The input forward kept for the weight grad (or, tensorwise fp8, its transposed codes in
  // its place: Note [Fp8 operands reused by the weight grad]). A selective checkpoint (Note
  // [Activation checkpointing]) drops it when its producer is cheap to run again, and hands
  // the remade input back before this backward.
  bool has_saved_input() const;
  void drop_saved_input() {
    saved_x_ = Tensor{};
    fp8_x_scales_.reset();
  }
  void restore_saved_input(Tensor x);

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;
  // Keeps the input and skips the GEMM, whose output backward does not read (unless it is
  // the fused ReLU's mask).
  void recompute_impl(RunContext& ctx, const Tensor& x) override;

 private:
  void weight_grads(RunContext& ctx, const Tensor& x, const Tensor& dy,
                    const Fp8Operand* fp8_x = nullptr, const Fp8Operand* fp8_dy = nullptr);
  int64_t in_, out_;
  Tensor saved_x_;
  Tensor saved_y_;  // fused_relu: the output, whose sign is the ReLU's mask
  Tensor deferred_x_, deferred_dy_;
  // fp8: what the weight grad reuses (Note [Fp8 operands reused by the weight grad]).
  std::shared_ptr<Fp8Operand> fp8_x_scales_, deferred_fp8_x_, deferred_fp8_dy_;
};

class Act : public Module {
 public:
  explicit Act(Activation f) : Module(f == Activation::ReLU ? "ReLU" : "GELU"), f_(f) {}

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  Activation f_;
  Tensor saved_x_;  // ReLU: its output (same sign as the input)
};

class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  template <typename M>
  M& append(std::unique_ptr<M> m) {
    return add_child(std::to_string(children().size()), std::move(m));
  }

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
};

// y = x + fc2(act(fc1(x))), or with norm: y = x + fc2(act(fc1(rms_norm(x)))).
class ResidualMlp : public Module {
 public:
  ResidualMlp(int64_t dim, int64_t hidden, Activation f, uint64_t seed, bool norm = false);

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
};

// A block of known duration, for studying the schedule: a [dim, dim] weight that FSDP shards
// and gathers like any other, forward = Device::spin(forward_us) (output = input), backward =
// spin(backward_us) with a zero weight grad. Compute time is then exact, so exposed
// communication and stalls can be computed by hand (tests/test_trace_forced.cpp).
class SpinBlock : public Module {
 public:
  SpinBlock(int64_t dim, double forward_us, double backward_us);

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;

 private:
  double forward_us_, backward_us_;
};

// The order in which the MoE block hands its param groups' grads to FSDP.
enum class MoeGradOrder { DenseFirst, ExpertsFirst, Interleaved, ExpertsDeferred };
MoeGradOrder parse_moe_grad_order(const std::string& name);

// A dense (soft) mixture of experts: y = x + sum_e softmax(router(h))_e * expert_e(h), with
// h = x, or h = rms_norm(x) with norm.
// Every token visits every expert, so no token dispatch is needed; the experts' params form
// their own param group on the expert mesh (shard_placement_fn), the router is dense.
class MoeBlock : public Module {
 public:
  MoeBlock(int64_t dim, int64_t hidden, int experts, MoeGradOrder order, uint64_t seed,
           bool norm = false);
  static bool is_expert_param(const Module& owner);  // owner lives under "experts."

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;
  void drop_own_saved(ActivationCheckpoint what) override;

 private:
  int experts_;
  MoeGradOrder order_;
  Module* norm_ = nullptr;
  Module* router_;
  std::vector<Module*> expert_;
  Tensor probs_;                  // [T, E] fp32
  std::vector<Tensor> expert_out_;  // expert_e(x), for d(probs)
};

}  // namespace fsdp::nn
