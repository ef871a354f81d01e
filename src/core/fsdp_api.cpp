// The public API (include/fsdp/fsdp.h) over the core's states.
#include <sstream>

#include "core/fsdp_state.h"
#include "fsdp/error.h"

namespace fsdp {

void check_reduce_scatter_max_input_buffers(int k) {
  if (k < 1)
    throw OptionError("reduce_scatter_max_input_buffers",
                      detail::concat(" must be a positive integer, got ", k));
}

using core::FsdpState;

Mesh::Mesh(std::string name, Device& device, std::shared_ptr<Comm> comm)
    : name_(std::move(name)), device_(&device), comm_(std::move(comm)) {
  FSDP_CHECK(comm_ != nullptr, "mesh '", name_, "' needs a communicator");
}

Mesh::Mesh(std::string name, Device& device, std::shared_ptr<Comm> comm,
           std::shared_ptr<Comm> replicate)
    : Mesh(std::move(name), device, std::move(comm)) {
  FSDP_CHECK(replicate != nullptr, "mesh '", name_, "' needs a replicate communicator");
  replicate_ = std::move(replicate);
}

Mesh make_hsdp_mesh(std::string name, Device& device, Comm& world, int replicate, int shard) {
  FSDP_CHECK(replicate >= 1 && shard >= 1, "HSDP mesh '", name,
             "': replicate and shard sizes must be positive, got ", replicate, " x ", shard);
  FSDP_CHECK(static_cast<int64_t>(replicate) * shard == world.size(), "HSDP mesh '", name,
             "': replicate x shard (", replicate, " x ", shard, ") must equal the world size ",
             world.size());
  // Collective over `world`, in the same order on every rank: shard groups (consecutive
  // ranks), then replicas (every shard-th rank).
  std::shared_ptr<Comm> shard_comm = world.split_groups(shard, 1, name + "/shard");
  std::shared_ptr<Comm> replicate_comm = world.split_groups(replicate, shard, name + "/replicate");
  return Mesh(std::move(name), device, std::move(shard_comm), std::move(replicate_comm));
}

Stream Mesh::init_stream() {
  if (!init_stream_.valid()) init_stream_ = device_->create_stream("init", StreamPriority::Normal);
  return init_stream_;
}

std::string to_string(const ScheduleEvent& e) {
  return e.op + " " + e.unit + " " + e.phase;
}

FsdpModule& fully_shard(Module& module, Mesh& mesh, const FullyShardOptions& options) {
  FSDP_CHECK(!core::state_of(module), "module '", module.fqn(), "' is already fully_shard'ed");
  auto state = std::make_unique<FsdpState>(module, mesh, options);
  FsdpState& ref = *state;
  module.owned_hooks = std::move(state);
  module.hooks = &ref;
  return ref.handle;
}

FsdpModule* fsdp_module_of(Module& module) {
  FsdpState* s = core::state_of(module);
  return s ? &s->handle : nullptr;
}

Module& FsdpModule::module() const { return state_->module; }
const std::string& FsdpModule::fqn() const { return state_->module.fqn(); }
bool FsdpModule::is_root() const { return state_->is_root; }

namespace {
template <typename Fn>
void for_each_state(FsdpState& top, bool recurse, Fn fn) {
  if (!recurse) {
    fn(top);
    return;
  }
  top.module.visit([&](Module& m) {
    if (FsdpState* s = core::state_of(m)) fn(*s);
  });
}
}  // namespace

void FsdpModule::set_reshard_after_forward(bool reshard, bool recurse) {
  for_each_state(*state_, recurse, [&](FsdpState& s) { s.reshard_after_forward = reshard; });
}
void FsdpModule::set_reshard_after_backward(bool reshard, bool recurse) {
  for_each_state(*state_, recurse, [&](FsdpState& s) { s.reshard_after_backward = reshard; });
}
void FsdpModule::set_requires_gradient_sync(bool sync, bool recurse) {
  for_each_state(*state_, recurse, [&](FsdpState& s) { s.requires_gradient_sync = sync; });
}
void FsdpModule::set_requires_all_reduce(bool all_reduce, bool recurse) {
  for_each_state(*state_, recurse, [&](FsdpState& s) { s.requires_all_reduce = all_reduce; });
}
void FsdpModule::set_is_last_backward(bool last) { state_->is_last_backward = last; }

void FsdpModule::set_reduce_scatter_max_input_buffers(int k, bool recurse) {
  check_reduce_scatter_max_input_buffers(k);
  for_each_state(*state_, recurse, [&](FsdpState& s) { s.reduce_scatter_max_input_buffers = k; });
  // After lazy init (on the root or any unit of its tree) the root's resolved k changes at
  // once: the next reduce-scatter reserves against it, as in FSDP2.
  if (FsdpState* root = state_->ctx ? state_->root : nullptr) {
    int resolved = 1;
    for (FsdpState* s : root->all_states) resolved = std::max(resolved, s->reduce_scatter_max_input_buffers);
    root->ctx->ring.set_capacity(resolved);
  }
}

void FsdpModule::set_separate_reduce_scatter_group(bool enable, bool recurse) {
  // Its communicators are made at lazy init, collectively, in the same order on every rank.
  FSDP_USER_CHECK(!state_->ctx, "set_separate_reduce_scatter_group must be called before "
                  "FSDP's lazy init (the first forward, or an unshard() before it)");
  for_each_state(*state_, recurse, [&](FsdpState& s) { s.separate_reduce_scatter_group = enable; });
}

void FsdpModule::set_gradient_divide_factor(double factor, bool recurse) {
  FSDP_CHECK(factor > 0, "set_gradient_divide_factor: the factor must be positive, got ", factor);
  for_each_state(*state_, recurse, [&](FsdpState& s) { s.gradient_divide_factor = factor; });
}

namespace {
std::vector<FsdpState*> states_of(const std::vector<FsdpModule*>& modules) {
  std::vector<FsdpState*> out;
  for (FsdpModule* m : modules) {
    FSDP_CHECK(m != nullptr, "prefetch list holds a null module");
    out.push_back(&m->state());
  }
  return out;
}
}  // namespace

void FsdpModule::set_modules_to_forward_prefetch(const std::vector<FsdpModule*>& modules) {
  state_->forward_prefetch = states_of(modules);
  state_->forward_prefetch_set = true;
}
void FsdpModule::set_modules_to_backward_prefetch(const std::vector<FsdpModule*>& modules) {
  state_->backward_prefetch = states_of(modules);
  state_->backward_prefetch_set = true;
}

void FsdpModule::unshard(bool async_op) { state_->explicit_unshard(async_op); }
void FsdpModule::reshard() { state_->reshard(state_->compute, "explicit"); }

void FsdpModule::set_on_grad_shard_ready(GradShardReadyFn on_ready) {
  FSDP_USER_CHECK(!state_->ctx, "set_on_grad_shard_ready must be called before FSDP's lazy init "
                  "(the first forward, or an unshard() before it)");
  state_->grad_shard_ready = std::move(on_ready);
}

void FsdpModule::set_optimizer_in_backward(ShardStepFn step) {
  FSDP_USER_CHECK(!state_->ctx, "set_optimizer_in_backward must be called before FSDP's lazy init "
                  "(the first forward, or an unshard() before it)");
  FSDP_USER_CHECK(!state_->optimizer_in_forward,
                  "the optimizer runs in backward or in forward, not both");
  state_->optimizer_in_backward = std::move(step);
}

void FsdpModule::set_optimizer_in_forward(optim::OptimizerInForward& updates) {
  FSDP_USER_CHECK(!state_->ctx, "set_optimizer_in_forward must be called before FSDP's lazy init "
                  "(the first forward, or an unshard() before it)");
  FSDP_USER_CHECK(!state_->optimizer_in_backward,
                  "the optimizer runs in backward or in forward, not both");
  state_->optimizer_in_forward = &updates;
}

void FsdpModule::set_shard_offload_hooks(ShardOffloadHooks hooks) {
  FSDP_USER_CHECK(!state_->ctx, "set_shard_offload_hooks must be called before FSDP's lazy init "
                  "(the first forward, or an unshard() before it)");
  state_->offload_hooks = std::move(hooks);
}

void FsdpModule::defer_shard_updates(Stream s) { state_->defer_updates(s); }

void FsdpModule::apply_pending_shard_updates(Stream s) {
  FSDP_USER_CHECK(state_->is_root || !state_->ctx, "apply_pending_shard_updates: call it on the root");
  state_->apply_pending_updates(s);
}

int FsdpModule::pending_shard_updates() const {
  const optim::OptimizerInForward* updates =
      state_->ctx ? state_->ctx->optimizer_in_forward : nullptr;
  return updates ? updates->pending_count() : 0;
}

void FsdpModule::set_event_log(std::vector<ScheduleEvent>* log) {
  state_->event_log = log;
  if (state_->ctx) state_->ctx->event_log = log;
}
void FsdpModule::set_rs_reclaim_policy_for_testing(RsReclaimPolicy policy) {
  state_->rs_policy = policy;
  if (state_->ctx) state_->ctx->ring.set_policy(policy);
}
int FsdpModule::reduce_scatter_max_input_buffers() const {
  return state_->ctx ? state_->ctx->ring.capacity() : state_->reduce_scatter_max_input_buffers;
}

std::vector<ShardedGroupView> sharded_groups(FsdpModule& root, bool with_grads) {
  std::vector<ShardedGroupView> out;
  Stream init = root.state().mesh.init_stream();
  root.module().visit([&](Module& m) {
    if (FsdpState* s = core::state_of(m))
      for (auto& g : s->groups)
        out.push_back({g->label().empty() ? s->module.fqn() : g->label(), g->shard_param(),
                       with_grads ? g->ensure_grad_shard(init) : nullptr,
                       g->layout().shard_numel, &g->mesh()});
  });
  root.state().mesh.device().synchronize_stream(init);
  return out;
}

void zero_sharded_grads(FsdpModule& root) {
  root.module().visit([](Module& m) {
    if (FsdpState* s = core::state_of(m))
      for (auto& g : s->groups) g->mark_grad_shard_zero();
  });
}

void release_sharded_grads(FsdpModule& root, Stream s) {
  root.module().visit([s](Module& m) {
    if (FsdpState* st = core::state_of(m))
      for (auto& g : st->groups) g->release_grad_shard(s);
  });
}

std::vector<float*> grad_shards(FsdpModule& root) {
  std::vector<float*> out;
  root.module().visit([&](Module& m) {
    if (FsdpState* st = core::state_of(m))
      for (auto& g : st->groups) out.push_back(g->shard_grad());
  });
  return out;
}

std::vector<std::vector<float>> gather_full_params(FsdpModule& root, Stream compute) {
  std::vector<std::vector<float>> out;
  Device& d = root.state().mesh.device();
  root.apply_pending_shard_updates(compute);  // Note [Optimizer in forward]
  for (Param* p : root.module().all_params()) {
    const core::FsdpState::ParamHome* home = nullptr;
    root.module().visit([&](Module& m) {
      if (FsdpState* s = core::state_of(m))
        for (auto& h : s->homes)
          if (h.param == p) home = &h;
    });
    FSDP_CHECK(home, "param '", p->name(), "' is not managed by FSDP");
    core::ParamGroup& g = *home->group;
    const int64_t n = g.layout().shard_numel;
    const int world = g.layout().world;
    float* buf = static_cast<float*>(d.alloc(static_cast<size_t>(n * world) * 4, compute, MemTag::Other));
    g.mesh().comm().all_gather(g.shard_param(), buf, n, DType::F32, compute);
    std::vector<float> gathered(static_cast<size_t>(n * world));
    d.copy_to_host(compute, gathered.data(), buf, gathered.size() * 4);
    d.free(buf, compute);
    d.synchronize_stream(compute);
    out.push_back(core::unshard_param(g.layout(), home->index, gathered));
  }
  return out;
}

}  // namespace fsdp
