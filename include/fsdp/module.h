// Modules with explicit forward and backward.
//
// Note [Module hooks]
// A module's forward()/backward() run its hooks around forward_impl()/backward_impl(). FSDP
// installs the hooks (src/core/fsdp_state.cpp): pre-forward gathers the module's params,
// post-forward reshards them, pre-backward gathers again, post-backward reduce-scatters.
// A module's backward hands each param's gradient to Param::set_grad() as soon as it is
// computed; FSDP's grad sink counts them per param group and reduce-scatters a group the
// moment its last grad arrives, in whatever order the module produces them.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/device.h"
#include "fsdp/tensor.h"

namespace fsdp {

class Module;

// What a forward or backward call runs on.
struct RunContext {
  Device* device = nullptr;
  Stream compute;
  DType act_dtype = DType::F32;  // activations and unsharded params/grads
};

// A param's initial values, made on demand (Note [Lazy initial values]).
using ParamInit = std::function<std::vector<float>()>;

// Note [Lazy initial values]
// Building a model records each param's shape and how to make its initial values, and
// makes none of them: a model family's param counts, FLOPs and memory plan are read from a
// built module (src/models), so building one must cost no memory even for a shape that would
// not fit. The values are made on the first init_values() (sharding keeps its slice and
// releases them), from a generator that depends only on the seed, so when they are made does
// not change what they are.
class Param {
 public:
  Param(std::string name, std::vector<int64_t> shape, std::vector<float> init);
  Param(std::string name, std::vector<int64_t> shape, ParamInit init);

  const std::string& name() const { return name_; }  // local: "weight"
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  int64_t rows() const { return shape_.empty() ? 1 : shape_[0]; }  // dim 0
  int64_t cols() const { return numel() / (rows() ? rows() : 1); }
  // Host initial values (fp32, full size), made on the first call. Sharding keeps its slice
  // and releases them.
  const std::vector<float>& init_values() const;
  void release_init_values() {
    std::vector<float>().swap(init_);
    make_init_ = nullptr;
  }

  // The unsharded value in the compute dtype, viewed as [rows, cols]. FSDP sets it between
  // the pre-forward (or pre-backward) hook and the reshard.
  Tensor value;
  // Unsharded gradient, for modules run without FSDP (the local reference).
  Tensor grad;

  // Called by Module::backward_impl with d(loss)/d(param) in the compute dtype. Without a
  // sink (no FSDP) the grad is kept in `grad` (accumulated if one is there).
  void set_grad(RunContext& ctx, Tensor g);
  // How many set_grad calls one backward makes: one per module that uses the param (2 for a
  // tied embedding and head, Note [Tied embeddings] in fsdp/nn/transformer.h). FSDP reduces
  // the param's grad only once all of them have arrived.
  int uses() const { return uses_; }
  void add_use() { ++uses_; }
  std::function<void(RunContext&, Param&, Tensor)> grad_sink;

  // fp8 training (docs/fp8.md): the recipe of the Linear whose weight this is (None: its
  // GEMMs run in the param dtype). nn::enable_fp8 sets it on the blocks' Linears.
  Fp8Recipe fp8 = Fp8Recipe::None;
  // Note [Float8 all-gather]: when FSDP gathered this weight as fp8, its E4M3 codes
  // ([rows, cols], row-major) and inverse scale (one fp32, device memory), set with `value`
  // and cleared with it; the Linear's GEMMs read them instead of casting `value` again.
  const uint8_t* fp8_value = nullptr;
  const float* fp8_scale_inv = nullptr;

 private:
  std::string name_;
  std::vector<int64_t> shape_;
  int uses_ = 1;
  mutable std::vector<float> init_;
  mutable ParamInit make_init_;  // empty once made (or for values given up front)
};

// Note [Activation checkpointing]
// What a module's forward keeps for its backward (FSDP2 leaves this to
// torch.utils.checkpoint; torchtitan's activation_checkpoint mode names the choices):
// - None: everything its backward reads (the default).
// - Full: only its input. Its backward first runs forward_impl again on that input, then
//   backward_impl. Between the module's pre-backward and post-backward hooks, so under FSDP
//   the recompute reads the params the backward's all-gather brought (or that stayed
//   gathered): no all-gather of its own, the same collectives as without checkpointing, and
//   the unit stays unsharded from its recompute to its post-backward.
// - Selective: keeps what a GEMM or the attention op made (costly to make again) and drops what
//   cheap elementwise work made (a norm's output, SwiGLU's output); backward_impl remakes
//   what it finds dropped, just before it needs it, with the same forward kernels. Only
//   modules that say what is cheap drop anything (the transformer's blocks: docs/memory.md).
// The recompute runs the same kernels on the same inputs, so on the CPU backend losses and
// gradients are bitwise those without checkpointing. It stops early (recompute_impl): work
// whose output only flows into the module's own output, which backward never reads, is not
// done again (the transformer block's FFN output projection and its residual add).
// PyTorch's checkpoint stops early too. It applies to a module run through
// forward() and backward(), whose descendants have no FSDP hooks of their own (a unit's
// recompute must not gather). A module's drop_own_saved says what it frees; one that does
// not override it keeps its saved tensors (correct, but nothing saved).
enum class ActivationCheckpoint : uint8_t { None, Full, Selective };
const char* activation_checkpoint_name(ActivationCheckpoint mode);  // "none", "full", "selective"

struct ModuleHooks {
  virtual ~ModuleHooks() = default;
  virtual void pre_forward(RunContext& ctx) = 0;
  virtual void post_forward(RunContext& ctx) = 0;
  virtual void pre_backward(RunContext& ctx) = 0;
  virtual void post_backward(RunContext& ctx) = 0;
};

class Module {
 public:
  explicit Module(std::string type) : type_(std::move(type)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  Tensor forward(RunContext& ctx, const Tensor& x);
  // input_grad false: the caller will not use d(loss)/d(input) (the model's first block), so
  // the module may skip computing it and return an undefined Tensor.
  Tensor backward(RunContext& ctx, const Tensor& dy, bool input_grad = true);

  const std::string& type() const { return type_; }
  // Fully qualified name from the root: "" for the root, "layers.3", "layers.3.experts.1".
  const std::string& fqn() const { return fqn_; }
  const std::vector<std::unique_ptr<Param>>& params() const { return params_; }
  const std::vector<std::unique_ptr<Module>>& children() const { return children_; }
  // Pre-order walk over this module and its descendants.
  void visit(const std::function<void(Module&)>& fn);
  // Every param of this module and its descendants, in pre-order.
  std::vector<Param*> all_params();

  // "phase fqn what" (e.g. "fwd layers.3 gemm"), made once and kept for the timeline.
  const char* op_label(const char* phase, const char* what) const;

  // Note [Activation checkpointing]: how forward() keeps what backward() needs (None by
  // default). Set it on a block before its first forward.
  void set_activation_checkpoint(ActivationCheckpoint mode) { checkpoint_ = mode; }
  ActivationCheckpoint activation_checkpoint() const { return checkpoint_; }

  ModuleHooks* hooks = nullptr;  // set by fully_shard; owned by owned_hooks below

 protected:
  virtual Tensor forward_impl(RunContext& ctx, const Tensor& x) = 0;
  virtual Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) = 0;
  // Note [Activation checkpointing]: what this module frees after a checkpointed forward
  // (its children get their own call): Full drops
  // every tensor forward_impl kept for backward_impl; Selective only those backward_impl
  // makes again when it finds them missing. Default: nothing.
  virtual void drop_own_saved(ActivationCheckpoint) {}
  // Note [Activation checkpointing]: a Full recompute of this module, which keeps for
  // backward_impl what forward_impl keeps; its output is not needed, so a module may leave
  // out the work that only makes it. Default: forward_impl itself.
  virtual void recompute_impl(RunContext& ctx, const Tensor& x) { (void)forward_impl(ctx, x); }
  // A child's part of this module's recompute_impl: the child's recompute_impl, or its
  // forward() where that runs more than forward_impl (hooks, a checkpoint of its own).
  static void recompute_child(RunContext& ctx, Module& child, const Tensor& x);

  Param& add_param(std::string name, std::vector<int64_t> shape, std::vector<float> init);
  Param& add_param(std::string name, std::vector<int64_t> shape, ParamInit init);
  template <typename M>
  M& add_child(std::string name, std::unique_ptr<M> child) {
    M& ref = *child;
    child->set_fqn(fqn_.empty() ? name : fqn_ + "." + name);
    child->local_name_ = std::move(name);
    children_.push_back(std::move(child));
    return ref;
  }

 private:
  void set_fqn(const std::string& fqn);
  // Full: runs recompute_impl on the kept input.
  void recompute_forward(RunContext& ctx);
  // Drops what forward kept for backward in this module and its descendants: all of it
  // (Full, their checkpointed inputs too), or what each one's backward remakes (Selective).
  void drop_saved(ActivationCheckpoint what);

  ActivationCheckpoint checkpoint_ = ActivationCheckpoint::None;
  Tensor checkpoint_input_;  // Full: forward's input, from forward() to backward()
  std::string type_;
  std::string fqn_;
  std::string local_name_;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Module>> children_;
  mutable std::map<std::pair<const char*, const char*>, std::string> labels_;

 public:
  // Keeps the FSDP state alive with the module. Declared last, so it is destroyed first,
  // while the params and children it points at still exist (Note [FSDP teardown]).
  std::unique_ptr<ModuleHooks> owned_hooks;
};

}  // namespace fsdp
