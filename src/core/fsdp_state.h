// One fully_shard() call: its module's hooks, its param groups, its settings (FSDP2's
// FSDPState). The root state (the first to run forward) owns the CommContext and finalizes
// backward.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/comm_context.h"
#include "core/param_group.h"
#include "fsdp/fsdp.h"

namespace fsdp::core {

enum class TrainingState { Idle, Forward, PreBackward, PostBackward };

class FsdpState : public ModuleHooks {
 public:
  FsdpState(Module& module, Mesh& mesh, const FullyShardOptions& options);
  ~FsdpState() override;

  void pre_forward(RunContext& ctx) override;
  void post_forward(RunContext& ctx) override;
  void pre_backward(RunContext& ctx) override;
  void post_backward(RunContext& ctx) override;

  // Unshard: issue the AGs of every group (logged once as "unshard").
  void unshard(const char* phase);
  void wait_for_unshard(Stream compute);
  // post_forward: keep the post-forward shard where reshard_after_forward is an int.
  void reshard(Stream compute, const char* phase, bool post_forward = false);
  // Tells the context once none of this module's all-gather buffers is left (Note [All-gather
  // ordering]).
  void note_all_gather_freed(Stream compute);
  // Root only (Note [Optimizer in forward's owner]): close the step, every sharded group's
  // update pending after the work issued on s; run every pending update on s.
  void defer_updates(Stream s);
  void apply_pending_updates(Stream s);
  // FsdpModule::unshard; before the root's first forward it initializes the tree first
  // (Note [Unshard before forward]).
  void explicit_unshard(bool async_op);
  // Root only, Note [Float8 all-gather] (param_group_fp8.cpp): the meshes' amax buffers (at
  // lazy init), and their amaxes from the current shards, all-reduced once per step.
  void setup_fp8_amax();
  void precompute_fp8_amax();

  Module& module;
  Mesh& mesh;
  FsdpModule handle{*this};
  MixedPrecisionPolicy mp;
  std::vector<std::unique_ptr<ParamGroup>> groups;

  // Settings (FSDP2 names).
  std::optional<std::variant<bool, int>> reshard_after_forward;
  bool reshard_after_backward = true;
  bool requires_gradient_sync = true;
  bool requires_all_reduce = true;  // HSDP: all-reduce across replicas after the RS
  bool is_last_backward = true;  // root only
  int reduce_scatter_max_input_buffers = 1;
  bool separate_reduce_scatter_group = false;
  std::optional<double> gradient_divide_factor;  // Note [Gradient divide factor]
  bool forward_prefetch_set = false, backward_prefetch_set = false;
  std::vector<FsdpState*> forward_prefetch, backward_prefetch;
  RsReclaimPolicy rs_policy = RsReclaimPolicy::BoundedRing;
  std::vector<ScheduleEvent>* event_log = nullptr;
  ShardStepFn optimizer_in_backward;  // root only
  GradShardReadyFn grad_shard_ready;  // root only
  optim::OptimizerInForward* optimizer_in_forward = nullptr;  // root only
  ShardOffloadHooks offload_hooks;  // root only

  // The state of the nearest fully_shard'ed ancestor, set by that ancestor's fully_shard
  // (bottom-up, so it comes after this one); nullptr for the top of a tree.
  FsdpState* parent = nullptr;

  // Set at lazy init.
  bool is_root = false;
  bool compute_known = false;  // root: a forward has given the compute stream
  FsdpState* root = nullptr;
  CommContext* ctx = nullptr;
  std::vector<FsdpState*> all_states;  // root only: every state of its tree, pre-order
  Stream compute;
  std::string unit_label;  // fqn, or "root"
  TrainingState training_state = TrainingState::Idle;
  bool ran_forward = false;  // in this iteration (Note [Symmetric collectives])
  // Note [All-gather ordering]: whether this module's all-gather buffers are allocated, and
  // the compute position where it last freed them in this step (when own_free_valid).
  bool holds_all_gather = false;
  Event own_free;
  bool own_free_valid = false;

  // Which group and index hold each param (for grads and gathers).
  struct ParamHome {
    Param* param;
    ParamGroup* group;
    int index;
  };
  std::vector<ParamHome> homes;

  bool effective_reshard_after_forward() const {
    if (!reshard_after_forward) return !is_root;
    if (const bool* b = std::get_if<bool>(&*reshard_after_forward)) return *b;
    return true;  // an int: reshard, to a smaller group
  }
  // Note [Post-forward mesh]: the size of the group a param group on `m` reshards to after
  // forward; 0 when it reshards fully (or not at all).
  int post_forward_size(const Mesh& m) const {
    if (!reshard_after_forward) return 0;
    const int* n = std::get_if<int>(&*reshard_after_forward);
    return n && *n < m.size() ? *n : 0;
  }

 private:
  void lazy_init(Stream compute);
  void root_pre_forward(RunContext& ctx);
  void finalize_backward(RunContext& ctx);
  // Note [Symmetric collectives]
  void catch_up_backward(RunContext& ctx, bool pre);
  void run_pre_backward(RunContext& ctx, bool skipped);
  void run_post_backward(RunContext& ctx, bool skipped);
  void prefetch(const std::vector<FsdpState*>& targets, const char* phase);

  // Shared with every ParamGroup of the tree (Note [FSDP teardown]).
  std::shared_ptr<CommContext> shared_ctx_;
  Event optimizer_done_;
};

FsdpState* state_of(Module& module);

}  // namespace fsdp::core
