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

class Param {
 public:
  Param(std::string name, std::vector<int64_t> shape, std::vector<float> init);

  const std::string& name() const { return name_; }  // local: "weight"
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  int64_t rows() const { return shape_.empty() ? 1 : shape_[0]; }  // dim 0
  int64_t cols() const { return numel() / (rows() ? rows() : 1); }
  // Host initial values (fp32, full size). Sharding keeps its slice and releases them.
  const std::vector<float>& init_values() const { return init_; }
  void release_init_values() { std::vector<float>().swap(init_); }

  // The unsharded value in the compute dtype, viewed as [rows, cols]. FSDP sets it between
  // the pre-forward (or pre-backward) hook and the reshard.
  Tensor value;
  // Unsharded gradient, for modules run without FSDP (the local reference).
  Tensor grad;

  // Called by Module::backward_impl with d(loss)/d(param) in the compute dtype. Without a
  // sink (no FSDP) the grad is kept in `grad` (accumulated if one is there).
  void set_grad(RunContext& ctx, Tensor g);
  std::function<void(RunContext&, Param&, Tensor)> grad_sink;

 private:
  std::string name_;
  std::vector<int64_t> shape_;
  std::vector<float> init_;
};

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
  // Every FSDP state of the tree goes before any module or param: a state touches the params
  // of its whole subtree. Post-order, so the root's state (whose comm context the others
  // use) goes last.
  virtual ~Module() { release_hooks(); }
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

  ModuleHooks* hooks = nullptr;  // set by fully_shard
  std::unique_ptr<ModuleHooks> owned_hooks;  // keeps the FSDP state alive with the module

 protected:
  virtual Tensor forward_impl(RunContext& ctx, const Tensor& x) = 0;
  virtual Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) = 0;

  Param& add_param(std::string name, std::vector<int64_t> shape, std::vector<float> init);
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
  void release_hooks() {
    for (auto& child : children_) child->release_hooks();
    owned_hooks.reset();
  }

  std::string type_;
  std::string fqn_;
  std::string local_name_;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Module>> children_;
  mutable std::map<std::pair<const char*, const char*>, std::string> labels_;
};

}  // namespace fsdp
