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
  // A 1-D group inside an HSDP module would never average its grads across the replicas.
  FSDP_CHECK(target.is_hsdp() || !module_mesh.is_hsdp(), "param '", owner.fqn(), ".",
             param.name(), "' is placed on 1-D mesh '", target.name(), "' inside HSDP mesh '",
             module_mesh.name(), "': its grads would never be averaged across replicas; place "
             "it on an HSDP mesh");
}

// Note [Post-forward mesh]
// reshard_after_forward=N (an int, FSDP2's form) keeps, after forward, this rank's 1/N of the
// unsharded group: the ranks of the shard group form groups of N consecutive ranks (FSDP2's
// mesh.view(-1, N), so a group lies within one node when the shard group spans nodes), and
// rank s keeps chunk s % N of the [W][shard_numel] all-gather output: W / N consecutive rank
// slots. The backward all-gather runs on that group of N and rebuilds the same buffer. FSDP2's
// rules: N must divide the shard group's size; N equal to it means true. FSDP2 warns on N = 1
// and treats it as false; we reject it with an error instead (say false).
void check_post_forward_size(const std::optional<std::variant<bool, int>>& option,
                             const Mesh& mesh, const Module& module) {
  if (!option) return;
  const int* n = std::get_if<int>(&*option);
  if (!n) return;
  const std::string where = module.fqn().empty() ? "the root" : "module '" + module.fqn() + "'";
  FSDP_CHECK(*n != 1, "reshard_after_forward=1 for ", where,
             " would keep every param whole on each rank: pass false instead");
  FSDP_CHECK(*n >= 2 && *n <= mesh.size() && mesh.size() % *n == 0, "reshard_after_forward=", *n,
             " for ", where, " must divide the shard group size ", mesh.size(), " of mesh '",
             mesh.name(), "' (an int from 2 to ", mesh.size(), ")");
}

std::string module_name(const Module& m) {
  return m.fqn().empty() ? "the root module" : "module '" + m.fqn() + "'";
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
    check_post_forward_size(options.reshard_after_forward, *target, m);
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
  // The FSDP states below this one (fully_shard'ed before it) get their parent.
  std::vector<FsdpState*> below;
  for (const auto& c : m.children()) collect_states(*c, below);
  for (FsdpState* s : below)
    if (!s->parent) s->parent = this;
  for (ParamHome& h : homes) {
    h.param->release_init_values();
    ParamGroup* group = h.group;
    const int index = h.index;
    h.param->grad_sink = [group, index](RunContext& ctx, Param&, Tensor g) {
      group->on_grad(ctx, index, std::move(g));
    };
  }
}

// Note [FSDP teardown]
// A Module destroys its FSDP state (Module::owned_hooks, its last member) before its params
// and children, so the state can still unhook the params it manages. A root's children, and
// their states, outlive the root's state: the CommContext they use is shared by every
// ParamGroup of the tree and goes with the last of them. No destruction order is assumed
// beyond what the members' declarations guarantee.
FsdpState::~FsdpState() {
  for (ParamHome& h : homes) h.param->grad_sink = nullptr;
  groups.clear();
}

void FsdpState::lazy_init(Stream stream) {
  // The first state to run forward (or the top of the tree an explicit unshard is in)
  // becomes the root of every state below it.
  is_root = true;
  root = this;
  compute = stream;
  shared_ctx_ = std::make_shared<CommContext>(mesh.device());
  ctx = shared_ctx_.get();
  collect_states(module, all_states);
  int k = 1;
  int ordinal = 0;
  for (FsdpState* s : all_states) {
    FSDP_USER_CHECK(s == this || !s->is_root, module_name(s->module),
                    " was initialized on its own (by its forward or unshard()) before ",
                    module_name(module), " that holds it: fully_shard every module, then run "
                    "the root's forward (or unshard) first");
    s->root = this;
    s->ctx = ctx;
    s->compute = stream;
    s->unit_label = s->module.fqn().empty() ? "root" : s->module.fqn();
    k = std::max(k, s->reduce_scatter_max_input_buffers);
    ctx->separate_reduce_scatter_group |= s->separate_reduce_scatter_group;
    for (auto& g : s->groups) {
      std::string label = s->unit_label;
      if (s->groups.size() > 1) label += "[" + g->mesh().name() + "]";
      g->lazy_init(shared_ctx_, label, ordinal++);
    }
  }
  ctx->ring.set_capacity(k);
  ctx->ring.set_policy(rs_policy);
  ctx->event_log = event_log;
  ctx->optimizer_in_backward = optimizer_in_backward;
  ctx->grad_shard_ready = grad_shard_ready;
  ctx->optimizer_in_forward = optimizer_in_forward;
  ctx->offload_hooks = offload_hooks;
  if (ctx->separate_reduce_scatter_group)
    for (FsdpState* s : all_states)
      for (auto& g : s->groups) ctx->create_separate_comm(g->mesh());
  // Every rank runs the same states in the same order, so the splits below match up.
  for (FsdpState* s : all_states)
    for (auto& g : s->groups) {
      if (g->mesh().is_hsdp()) ctx->ensure_all_reduce_stream();
      if (const int n = s->post_forward_size(g->mesh())) ctx->create_post_forward_comm(g->mesh(), n);
    }
  optimizer_done_ = mesh.device().create_event();
  setup_fp8_amax();
}

void FsdpState::root_pre_forward(RunContext& run) {
  if (!ctx) lazy_init(run.compute);
  // Explicit unshard/reshard of any module use the stream the last forward ran on.
  for (FsdpState* s : all_states) s->compute = run.compute;
  compute_known = true;
  Device& d = mesh.device();
  // The all-gathers read the shards the optimizer wrote on the compute stream.
  d.record_event(optimizer_done_, run.compute);
  d.wait_event(ctx->all_gather_stream, optimizer_done_);
  precompute_fp8_amax();  // Note [Float8 all-gather]: before the first all-gather
  // Note [Optimizer in forward]: compute is past the deferral here; a captured step's
  // updates then wait for an event recorded inside the capture.
  if (ctx->optimizer_in_forward) ctx->optimizer_in_forward->forward_begins(run.compute);
  ctx->forget_compute_started();
  ctx->post_forward_order.clear();
  ctx->forward_hooks.clear();
  ctx->backward_plan.clear();
  ctx->backward_cursor = 0;
  ctx->backward_planned = false;
  for (FsdpState* s : all_states) {
    s->ran_forward = false;
    s->own_free_valid = false;
    for (auto& g : s->groups) {
      g->reset_backward();
      // A post-forward shard left by a forward without backward (evaluation) predates the
      // optimizer step that may have run since: gather from the fp32 shards instead.
      if (g->is_sharded_post_forward()) g->reshard(run.compute);
    }
  }
}

void FsdpState::defer_updates(Stream s) {
  FSDP_USER_CHECK(is_root && ctx,
                  "defer_shard_updates: call it on the root, after its first forward");
  optim::OptimizerInForward* updates = ctx->optimizer_in_forward;
  FSDP_USER_CHECK(updates,
                  "defer_shard_updates needs set_optimizer_in_forward before the first forward");
  FSDP_USER_CHECK(updates->pending_count() == 0,
                  "defer_shard_updates: the previous step's updates have not all run (a forward "
                  "runs them, or apply_pending_shard_updates)");
  // A group that is gathered, or holds a post-forward shard, is updated now: those copies
  // predate the step either way, as with the step after backward; only the shard changes.
  std::vector<bool> may_wait;
  for (FsdpState* st : all_states)
    for (auto& g : st->groups) {
      FSDP_CHECK(g->ordinal() == static_cast<int>(may_wait.size()), "group ", g->label(),
                 " is out of order");
      may_wait.push_back(g->is_sharded());
    }
  updates->defer(s, may_wait);
}

void FsdpState::apply_pending_updates(Stream s) {
  if (ctx && ctx->optimizer_in_forward) ctx->optimizer_in_forward->run_all(s);
  if (ctx && ctx->offload_hooks.before_shard_read) ctx->offload_hooks.before_shard_read(s);
}

void FsdpState::unshard(const char* phase) {
  bool issued = false;
  for (auto& g : groups) {
    if (!g->is_unsharded() && !g->is_gathering()) {
      if (!issued && !holds_all_gather) {
        ctx->order_all_gather();
        if (own_free_valid) mesh.device().wait_event(ctx->all_gather_stream, own_free);
        holds_all_gather = true;
      }
      issued = true;
      g->unshard();
    }
  }
  if (issued) ctx->log("unshard", unit_label, phase);
}

// Note [Unshard before forward]
// FSDP2 allows unshard() before any forward and initializes lazily there; so does
// FsdpModule::unshard. The top of the module's tree (the state that no fully_shard'ed
// ancestor holds) becomes the root, as its first forward would have made it. Until that
// forward FSDP does not know the compute stream, so the all-gather follows all the work
// issued so far on the device (the host waits for it: nothing of a step is in flight yet),
// and a synchronous unshard copies out on the mesh's init stream and waits for it on the
// host, so the params are ready on every stream. The root's forward then gives every module
// its compute stream.
void FsdpState::explicit_unshard(bool async_op) {
  if (!ctx) {
    FsdpState* top = this;
    while (top->parent) top = top->parent;
    top->lazy_init(top->mesh.init_stream());
    FSDP_CHECK(ctx, "module '", module.fqn(), "' is not below the state initialized for it");
  }
  Device& d = mesh.device();
  const bool before_forward = !root->compute_known;
  if (before_forward) {
    d.synchronize();
  } else {
    // As in the root's pre-forward: the shards may have just been written by the optimizer.
    const Event issued = ctx->events.acquire();
    d.record_event(issued, compute);
    d.wait_event(ctx->all_gather_stream, issued);
    ctx->events.release(issued);
  }
  root->precompute_fp8_amax();
  unshard("explicit");
  if (async_op) return;
  wait_for_unshard(compute);
  if (before_forward) d.synchronize_stream(compute);
}

void FsdpState::note_all_gather_freed(Stream s) {
  if (!holds_all_gather) return;
  for (auto& g : groups)
    if (g->holds_all_gather_buffer()) return;
  holds_all_gather = false;
  if (!own_free.valid()) own_free = ctx->events.acquire();  // kept for good
  mesh.device().record_event(own_free, s);
  own_free_valid = true;
}

void FsdpState::wait_for_unshard(Stream s) {
  for (auto& g : groups) g->wait_for_unshard(s);
  note_all_gather_freed(s);  // a copy-out frees the all-gather's buffer at once
  ctx->note_compute_started(s);
}

void FsdpState::reshard(Stream s, const char* phase, bool post_forward) {
  bool any = false;
  for (auto& g : groups) {
    any |= g->is_unsharded() || g->is_gathering();
    g->reshard(s, post_forward);
  }
  note_all_gather_freed(s);
  if (any) ctx->log("reshard", unit_label, phase);
}

void FsdpState::prefetch(const std::vector<FsdpState*>& targets, const char* phase) {
  for (FsdpState* t : targets) t->unshard(phase);
}

void FsdpState::pre_forward(RunContext& run) {
  if (!ctx || (is_root && training_state == TrainingState::Idle)) root_pre_forward(run);
  training_state = TrainingState::Forward;
  ctx->forward_hooks.push_back({this, true});
  ran_forward = true;
  unshard("forward");
  wait_for_unshard(run.compute);
  if (forward_prefetch_set) prefetch(forward_prefetch, "forward");
}

void FsdpState::post_forward(RunContext& run) {
  if (effective_reshard_after_forward()) reshard(run.compute, "forward", /*post_forward=*/true);
  ctx->post_forward_order.push_back(this);
  ctx->forward_hooks.push_back({this, false});
  training_state = TrainingState::Idle;
}

// Note [Symmetric collectives]
// Every rank must issue the same collectives in the same order, whatever its backward hooks
// did: a unit may get no gradient on one rank (a branch taken on some ranks only, an expert
// no token chose), so its hooks do not run there. Forward must be the same on every rank.
// Backward is expected to visit the units in the reverse of forward's hook order (each
// post-forward becomes a pre-backward, each pre-forward a post-backward), which is the order
// a chain of modules runs its backward in. When a hook runs, every expected hook before it
// that did not run is run first, in order, as the ranks that used those units run them: the
// pre-backward all-gathers (and prefetches) and the post-backward reduce-scatters zeros for
// the grads this rank did not produce, then reshards. So a unit that ran forward is
// reduce-scattered in every backward, used or not (FSDP2 with reduce-scatter of unused
// params on); its grads on a rank that skipped it are zeros. A group that got no grad at
// all in a unit whose backward did run (unused on every rank, or its grads are deferred
// past the unit's backward, MoeGradOrder::ExpertsDeferred) reduce-scatters when its grads
// complete, or zeros at the root's finalize; so a group may lack grads on some ranks only
// if its whole unit's backward is skipped there. A hook that is not expected
// (a model whose backward visits units in another order) runs as it comes: its unit is
// reduce-scattered again, which is still correct and still the same on every rank that runs
// the same model. The root's post-backward is the last expected hook, so nothing is left
// behind at finalize.
void FsdpState::catch_up_backward(RunContext& run, bool pre) {
  CommContext& c = *ctx;
  if (!c.backward_planned) {
    // Note [Optimizer in forward]: an update the forward did not run must read its grad
    // shard before this backward's reduce-scatters write it.
    if (c.optimizer_in_forward && c.optimizer_in_forward->pending_count() > 0)
      root->apply_pending_updates(run.compute);
    c.backward_planned = true;
    c.backward_plan.clear();
    for (auto it = c.forward_hooks.rbegin(); it != c.forward_hooks.rend(); ++it)
      c.backward_plan.push_back({it->state, !it->pre});
    c.backward_cursor = 0;
  }
  size_t p = c.backward_cursor;
  while (p < c.backward_plan.size() &&
         !(c.backward_plan[p].state == this && c.backward_plan[p].pre == pre))
    ++p;
  if (p == c.backward_plan.size()) return;  // not expected here: run it as it comes
  while (c.backward_cursor < p) {
    const CommContext::HookCall skipped = c.backward_plan[c.backward_cursor++];
    if (skipped.pre) {
      skipped.state->run_pre_backward(run, /*skipped=*/true);
    } else {
      skipped.state->run_post_backward(run, /*skipped=*/true);
      skipped.state->training_state = TrainingState::Idle;
    }
  }
  c.backward_cursor = p + 1;
}

void FsdpState::pre_backward(RunContext& run) {
  catch_up_backward(run, /*pre=*/true);
  run_pre_backward(run, /*skipped=*/false);
}

void FsdpState::run_pre_backward(RunContext& run, bool skipped) {
  training_state = TrainingState::PreBackward;
  for (auto& g : groups) g->reset_backward();
  unshard("pre_backward");
  // A skipped unit computes nothing: its all-gather only keeps the ranks in step.
  if (!skipped) wait_for_unshard(run.compute);
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
  catch_up_backward(run, /*pre=*/false);
  run_post_backward(run, /*skipped=*/false);
  if (is_root) finalize_backward(run);
  training_state = TrainingState::Idle;
}

void FsdpState::run_post_backward(RunContext& run, bool skipped) {
  training_state = TrainingState::PostBackward;
  // Groups with some but not all grads (unused params) reduce-scatter now, zeros for what is
  // missing; in a unit this rank skipped, every group does. A group with no grad yet in a
  // unit that ran backward waits: its grads may come later (deferred weight grads), or
  // finalize reduce-scatters zeros (Note [Symmetric collectives]).
  for (auto it = groups.rbegin(); it != groups.rend(); ++it)
    if (skipped ? !(*it)->fired_this_backward() : (*it)->post_backward_pending())
      (*it)->post_backward(run);
  if (reshard_after_backward) reshard(run.compute, "post_backward");
}

void FsdpState::finalize_backward(RunContext& run) {
  // Groups of units that ran forward and are still waiting for grads reduce-scatter what
  // they have, zeros if nothing (Note [Symmetric collectives]).
  for (auto it = all_states.rbegin(); it != all_states.rend(); ++it)
    for (auto g = (*it)->groups.rbegin(); g != (*it)->groups.rend(); ++g)
      if ((*it)->ran_forward && !(*g)->fired_this_backward()) (*g)->post_backward(run);
  // A unit gathered again after its post-backward (a backward prefetch of a unit whose
  // backward already ran) must not carry its gathered params into the next step: the
  // optimizer is about to change its shards. FSDP2's final callback reshards it too.
  for (FsdpState* s : all_states)
    if (s->reshard_after_backward) s->reshard(run.compute, "finalize");
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
  // ...and, with HSDP, the all-reduces and the grad-shard writes that follow them.
  if (ctx->all_reduce_pending) {
    Device& d = mesh.device();
    const Event ar_done = ctx->events.acquire();
    d.record_event(ar_done, ctx->all_reduce_stream);
    d.wait_event(run.compute, ar_done);
    ctx->events.release(ar_done);
    ctx->all_reduce_pending = false;
  }
  for (FsdpState* s : all_states)
    for (auto& g : s->groups) g->materialize_zero_grad(run.compute);
  FSDP_CHECK(ctx->ring.size() == 0, "RS ring not empty after finalize");
  ++ctx->fp8_amax_generation;  // the optimizer is about to change the shards
  ctx->log("finalize", unit_label, "finalize");
  ctx->post_forward_order.clear();
}

}  // namespace fsdp::core
