#include "fsdp/module.h"

#include "fsdp/error.h"

namespace fsdp {

Param::Param(std::string name, std::vector<int64_t> shape, std::vector<float> init)
    : name_(std::move(name)), shape_(std::move(shape)), init_(std::move(init)) {
  FSDP_CHECK(static_cast<int64_t>(init_.size()) == numel(), "param '", name_, "': ", init_.size(),
             " initial values for a shape of ", numel(), " elements");
}

Param::Param(std::string name, std::vector<int64_t> shape, ParamInit init)
    : name_(std::move(name)), shape_(std::move(shape)), make_init_(std::move(init)) {
  FSDP_CHECK(make_init_ != nullptr, "param '", name_, "': no initial values");
}

const std::vector<float>& Param::init_values() const {
  if (make_init_) {
    init_ = make_init_();
    make_init_ = nullptr;
    FSDP_CHECK(static_cast<int64_t>(init_.size()) == numel(), "param '", name_, "': ",
               init_.size(), " initial values for a shape of ", numel(), " elements");
  }
  return init_;
}

int64_t Param::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

void Param::set_grad(RunContext& ctx, Tensor g) {
  if (grad_sink) {
    grad_sink(ctx, *this, std::move(g));
  } else if (grad.defined()) {
    ctx.device->add(ctx.compute, grad.data, grad.data, g.data, g.dtype, g.numel());
  } else {
    grad = std::move(g);
  }
}

const char* activation_checkpoint_name(ActivationCheckpoint mode) {
  switch (mode) {
    case ActivationCheckpoint::None: return "none";
    case ActivationCheckpoint::Full: return "full";
    case ActivationCheckpoint::Selective: return "selective";
  }
  return "?";
}

Tensor Module::forward(RunContext& ctx, const Tensor& x) {
  // The recompute must not run FSDP's hooks again (no all-gather, no post-forward reshard):
  // refused before any of this forward's work.
  if (checkpoint_ == ActivationCheckpoint::Full)
    for (auto& c : children_)
      c->visit([&](Module& m) {
        FSDP_USER_CHECK(!m.hooks, "module '", fqn_, "' is checkpointed (full) but '", m.fqn(),
                        "' inside it is an FSDP unit of its own, whose hooks its recompute "
                        "would run again: checkpoint the inner unit instead");
      });
  if (hooks) hooks->pre_forward(ctx);
  Tensor y = forward_impl(ctx, x);
  // Note [Activation checkpointing]: the drop comes before the post-forward reshard; the
  // tensors freed here are stream-ordered on the compute stream, as backward would free them.
  if (checkpoint_ != ActivationCheckpoint::None) {
    drop_saved(checkpoint_);
    if (checkpoint_ == ActivationCheckpoint::Full) checkpoint_input_ = x;
  }
  if (hooks) hooks->post_forward(ctx);
  return y;
}

Tensor Module::backward(RunContext& ctx, const Tensor& dy, bool input_grad) {
  if (hooks) hooks->pre_backward(ctx);
  if (checkpoint_ == ActivationCheckpoint::Full) recompute_forward(ctx);
  Tensor dx = backward_impl(ctx, dy, input_grad);
  if (hooks) hooks->post_backward(ctx);
  return dx;
}

void Module::recompute_forward(RunContext& ctx) {
  FSDP_CHECK(checkpoint_input_.defined(), "module '", fqn_,
             "' is checkpointed (full) but its backward came without a forward before it");
  Tensor input = std::move(checkpoint_input_);
  recompute_impl(ctx, input);
}

void Module::recompute_child(RunContext& ctx, Module& child, const Tensor& x) {
  if (child.hooks || child.checkpoint_ != ActivationCheckpoint::None)
    (void)child.forward(ctx, x);
  else
    child.recompute_impl(ctx, x);
}

void Module::drop_saved(ActivationCheckpoint what) {
  if (what == ActivationCheckpoint::None) return;
  drop_own_saved(what);
  if (what == ActivationCheckpoint::Full) checkpoint_input_ = Tensor{};
  for (auto& c : children_) c->drop_saved(what);
}

void Module::visit(const std::function<void(Module&)>& fn) {
  fn(*this);
  for (auto& c : children_) c->visit(fn);
}

std::vector<Param*> Module::all_params() {
  std::vector<Param*> out;
  visit([&](Module& m) {
    for (auto& p : m.params_) out.push_back(p.get());
  });
  return out;
}

Param& Module::add_param(std::string name, std::vector<int64_t> shape, std::vector<float> init) {
  params_.push_back(std::make_unique<Param>(std::move(name), std::move(shape), std::move(init)));
  return *params_.back();
}

Param& Module::add_param(std::string name, std::vector<int64_t> shape, ParamInit init) {
  params_.push_back(std::make_unique<Param>(std::move(name), std::move(shape), std::move(init)));
  return *params_.back();
}

const char* Module::op_label(const char* phase, const char* what) const {
  auto [it, inserted] = labels_.try_emplace({phase, what});
  if (inserted) it->second = std::string(phase) + " " + (fqn_.empty() ? "root" : fqn_) + " " + what;
  return it->second.c_str();
}

void Module::set_fqn(const std::string& fqn) {
  fqn_ = fqn;
  for (auto& c : children_) c->set_fqn(fqn_.empty() ? c->local_name_ : fqn_ + "." + c->local_name_);
}

}  // namespace fsdp
