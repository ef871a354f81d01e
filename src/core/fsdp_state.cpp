#include "core/fsdp_state.h"

#include <algorithm>
#include <string>

#include "fsdp/error.h"

namespace fsdp::core {

namespace {

// Params of `module`'s subtree that no FSDP descendant already owns.
void collect_managed_params(Module& module, bool is_top, std::vector<std::pair<Module*, Param*>>& out) {
  if (!is_top && state_of(module)) return;
  for (const auto& p : module.params()) out.push_back({&module, p.get()});
  for (const auto& c : module.children()) collect_managed_params(*c, false, out);
}

void collect_states(Module& module, std::vector<FsdpState*>& out) {
  if (FsdpState* s = state_of(module)) out.push_back(s);
  for (const auto& c : module.children()) collect_states(*c, out);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// Note [Sub-meshes]
// A param group may shard over a mesh that spans a subset of the module's mesh's ranks (the
// experts' efsdp mesh inside dp, docs/moe.md). Each rank then runs the group's collectives with
// the members of its own sub-mesh; the sub-meshes of different ranks may differ (one per ep
// rank) as long as each is inside the module's mesh. The Mesh's communicator comes from
// Comm::split, so it always contains this rank.
void check_placement_mesh(Mesh& target, Mesh& module_mesh, const Module& owner, const Param& param) {
  std::vector<int> a = target.comm().world_ranks(), b = module_mesh.comm().world_ranks();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  FSDP_CHECK(std::includes(b.begin(), b.end(), a.begin(), a.end()), "param '", owner.fqn(), ".",
             param.name(), "' is placed on mesh '", target.name(), "' (ranks ", rank_list(a),
             "), which is not a subset of mesh '", module_mesh.name(), "' (ranks ", rank_list(b),
             "): a param group's mesh must lie within its module's mesh");
}

}  // namespace

FsdpState* state_of(Module& module) { return dynamic_cast<FsdpState*>(module.hooks); }

FsdpState::FsdpState(Module& m, Mesh& default_mesh, const FullyShardOptions& options)
    : module(m), mesh(default_mesh), mp(options.mp_policy),
      reshard_after_forward(options.reshard_after_forward) {
  FSDP_CHECK(options.mp_policy.reduce_dtype == DType::F32 || options.mp_policy.reduce_dtype == DType::BF16,
             "unsupported reduce dtype");
  std::vector<std::pair<Module*, Param*>> managed;
  collect_managed_params(m, true, managed);
  // One group per distinct mesh, in order of first appearance (FSDP2's per-param mesh).
  std::vector<Mesh*> meshes;
  std::vector<std::vector<Param*>> members;
  for (auto [owner, param] : managed) {
    Mesh* target = options.shard_placement_fn ? options.shard_placement_fn(*owner, *param) : nullptr;
    if (!target) target = &default_mesh;
    FSDP_CHECK(&target->device() == &default_mesh.device(), "param '", owner->fqn(), ".",
               param->name(), "' is placed on mesh '", target->name(),
               "', which lives on another device than mesh '", default_mesh.name(), "'");
    check_placement_mesh(*target, default_mesh, *owner, *param);
    auto it = std::find(meshes.begin(), meshes.end(), target);
    if (it == meshes.end()) {
      meshes.push_back(target);
      members.emplace_back();
      it = meshes.end() - 1;
    }
    members[it - meshes.begin()].push_back(param);
  }
  const Stream init = default_mesh.init_stream();
  for (size_t g = 0; g < meshes.size(); ++g) {
    groups.push_back(std::make_unique<ParamGroup>(*this, *meshes[g], members[g], static_cast<int>(g), init));
    for (size_t i = 0; i < members[g].size(); ++i)
      homes.push_back({members[g][i], groups.back().get(), static_cast<int>(i)});
  }
  default_mesh.device().synchronize_stream(init);
  for (ParamHome& h : homes) {
    h.param->release_init_values();
    ParamGroup* group = h.group;
    const int index = h.index;
    h.param->grad_sink = [group, index](RunContext& ctx, Param&, Tensor g) {
      group->on_grad(ctx, index, std::move(g));
    };
  }
}

FsdpState::~FsdpState() {
  for (ParamHome& h : homes) h.param->grad_sink = nullptr;
  groups.clear();
}

CommContext& FsdpState::comm_context() const {
  FSDP_CHECK(ctx, "module '", module.fqn(), "' has not run forward yet (FSDP is initialized lazily at the first forward)");
  return *ctx;
}

void FsdpState::lazy_init(RunContext& run) {
  // The first state to run forward becomes the root of every state below it.
  is_root = true;
  root = this;
  compute = run.compute;
  owned_ctx_ = std::make_unique<CommContext>(mesh.device());
  ctx = owned_ctx_.get();
  collect_states(module, all_states);
  int k = 1;
  int ordinal = 0;
  for (FsdpState* s : all_states) {
    FSDP_CHECK(s == this || !s->is_root, "module '", s->module.fqn(),
               "' ran forward on its own before its root; run the root's forward first");
    s->root = this;
    s->ctx = ctx;
    s->compute = run.compute;
    s->unit_label = s->module.fqn().empty() ? "root" : s->module.fqn();
    k = std::max(k, s->reduce_scatter_max_input_buffers);
    ctx->separate_reduce_scatter_group |= s->separate_reduce_scatter_group;
    for (auto& g : s->groups) {
      std::string label = s->unit_label;
      if (s->groups.size() > 1) label += "[" + g->mesh().name() + "]";
      g->lazy_init(*ctx, label, ordinal++);
    }
  }
  ctx->ring.set_capacity(k);
  ctx->ring.set_policy(rs_policy);
  ctx->event_log = event_log;
  ctx->optimizer_in_backward = optimizer_in_backward;
  if (ctx->separate_reduce_scatter_group)
    for (FsdpState* s : all_states)
      for (auto& g : s->groups) ctx->create_separate_comm(g->mesh());
  optimizer_done_ = mesh.device().create_event();
}

void FsdpState::root_pre_forward(RunContext& run) {
  if (!ctx) lazy_init(run);
  compute = run.compute;
  Device& d = mesh.device();
  // The all-gathers read the shards the optimizer wrote on the compute stream.
  d.record_event(optimizer_done_, run.compute);
  d.wait_event(ctx->all_gather_stream, optimizer_done_);
  ctx->post_forward_order.clear();
  for (FsdpState* s : all_states)
    for (auto& g : s->groups) g->reset_backward();
}

void FsdpState::unshard(const char* phase) {
  bool issued = false;
  for (auto& g : groups) {
    if (!g->is_unsharded() && !g->is_gathering()) {
      issued = true;
      g->unshard();
    }
  }
  if (issued) ctx->log("unshard", unit_label, phase);
}

void FsdpState::wait_for_unshard(Stream s) {
  for (auto& g : groups) g->wait_for_unshard(s);
}

void FsdpState::reshard(Stream s, const char* phase) {
  bool any = false;
  for (auto& g : groups) {
    any |= g->is_unsharded() || g->is_gathering();
    g->reshard(s);
  }
  if (any) ctx->log("reshard", unit_label, phase);
}

void FsdpState::prefetch(const std::vector<FsdpState*>& targets, const char* phase) {
  for (FsdpState* t : targets) t->unshard(phase);
}

void FsdpState::pre_forward(RunContext& run) {
  if (!ctx || (is_root && training_state == TrainingState::Idle)) root_pre_forward(run);
  training_state = TrainingState::Forward;
  unshard("forward");
  wait_for_unshard(run.compute);
  if (forward_prefetch_set) prefetch(forward_prefetch, "forward");
}

void FsdpState::post_forward(RunContext& run) {
  if (effective_reshard_after_forward()) reshard(run.compute, "forward");
  ctx->post_forward_order.push_back(this);
  training_state = TrainingState::Idle;
}

void FsdpState::pre_backward(RunContext& run) {
  training_state = TrainingState::PreBackward;
  for (auto& g : groups) g->reset_backward();
  unshard("pre_backward");
  wait_for_unshard(run.compute);
  if (backward_prefetch_set) {
    prefetch(backward_prefetch, "pre_backward");
  } else {
    // Default: the unit that ran forward just before this one runs backward next.
    auto& order = ctx->post_forward_order;
    auto it = std::find(order.begin(), order.end(), this);
    if (it != order.end() && it != order.begin()) (*(it - 1))->unshard("pre_backward");
  }
}

void FsdpState::post_backward(RunContext& run) {
  training_state = TrainingState::PostBackward;
  // Groups whose grads never all arrived (unused params) reduce what they have now.
  for (auto it = groups.rbegin(); it != groups.rend(); ++it)
    if ((*it)->post_backward_pending()) (*it)->post_backward(run);
  if (reshard_after_backward) reshard(run.compute, "post_backward");
  if (is_root) finalize_backward(run);
  training_state = TrainingState::Idle;
}

void FsdpState::finalize_backward(RunContext& run) {
  for (auto it = all_states.rbegin(); it != all_states.rend(); ++it)
    for (auto g = (*it)->groups.rbegin(); g != (*it)->groups.rend(); ++g)
      if ((*g)->post_backward_pending()) (*g)->post_backward(run);
  if (!is_last_backward) return;
  // Every RS finished and accumulated before the optimizer reads the grad shards.
  ctx->ring.drain(mesh.device(), run.compute, ctx->events);
  // ...and what followed them on the RS stream (accumulation, optimizer in backward).
  if (ctx->rs_work_after_ring) {
    Device& d = mesh.device();
    const Event rs_done = ctx->events.acquire();
    d.record_event(rs_done, ctx->reduce_scatter_stream);
    d.wait_event(run.compute, rs_done);
    ctx->events.release(rs_done);
    ctx->rs_work_after_ring = false;
  }
  for (FsdpState* s : all_states)
    for (auto& g : s->groups) g->materialize_zero_grad(run.compute);
  FSDP_CHECK(ctx->ring.size() == 0, "RS ring not empty after finalize");
  ctx->log("finalize", unit_label, "finalize");
  ctx->post_forward_order.clear();
}

}  // namespace fsdp::core
