// The public FSDP API: fully_shard() and the FsdpModule handle, with FSDP2's names.
//
//   Mesh world("dp", device, world_comm);  // device, world_comm: from run_cpu_ranks (launch.h)
//   nn::apply_activation_checkpointing(model, {.mode = ActivationCheckpoint::Full});  // optional
//   for (Module* block : model.blocks()) fully_shard(*block, world, {.mp_policy = mp});
//   FsdpModule& root = fully_shard(model, world, {.mp_policy = mp});
//   root.set_reduce_scatter_max_input_buffers(2);
//   Tensor y = model.forward(ctx, x); ... model.backward(ctx, dy); optimizer.step(ctx.compute);
//   zero_sharded_grads(root);
// examples/custom_model.cpp and examples/train_loop.cpp are complete programs.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/module.h"

namespace fsdp {

namespace core {
class FsdpState;
class CommContext;
}  // namespace core
namespace optim {
class OptimizerInForward;  // fsdp/optim.h
}  // namespace optim

// A device mesh: the ranks that one param group is sharded over, and their communicator.
// A 1-D mesh shards over all its ranks (FSDP). A 2-D mesh (HSDP, FSDP2's (replicate, shard)
// mesh; make_hsdp_mesh) shards over the shard group and replicates each shard across the
// replicate group: comm(), rank() and size() are the shard group's, replicate_comm() the
// replicas'. Gradients are averaged over all replicate x shard ranks (docs/hsdp.md).
class Mesh {
 public:
  Mesh(std::string name, Device& device, std::shared_ptr<Comm> comm);
  // HSDP: `comm` is this rank's shard group, `replicate` the ranks holding the same shard.
  Mesh(std::string name, Device& device, std::shared_ptr<Comm> comm,
       std::shared_ptr<Comm> replicate);
  const std::string& name() const { return name_; }
  Device& device() const { return *device_; }
  Comm& comm() const { return *comm_; }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  // The replicate group (nullptr on a 1-D mesh) and its extent; size 1 on a 1-D mesh.
  Comm* replicate_comm() const { return replicate_.get(); }
  int replicate_rank() const { return replicate_ ? replicate_->rank() : 0; }
  int replicate_size() const { return replicate_ ? replicate_->size() : 1; }
  // Whether gradients are all-reduced across replicas (a replicate group of more than one).
  bool is_hsdp() const { return replicate_size() > 1; }
  // Every rank that holds a part of the params: replicate x shard.
  int data_parallel_size() const { return size() * replicate_size(); }
  // The stream fully_shard builds sharded state on (made on first use).
  Stream init_stream();

 private:
  std::string name_;
  Stream init_stream_;
  Device* device_;
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<Comm> replicate_;
};

// The HSDP mesh of `world` as FSDP2's init_device_mesh((replicate, shard)) lays it out: world
// rank r is replica r / shard, shard rank r % shard, so a shard group is `shard` consecutive
// ranks (one node, typically). Collective over `world`; replicate x shard must equal its size.
Mesh make_hsdp_mesh(std::string name, Device& device, Comm& world, int replicate, int shard);

struct MixedPrecisionPolicy {
  DType param_dtype = DType::F32;   // unsharded params, activations, unsharded grads
  DType reduce_dtype = DType::F32;  // reduce-scatter input and output
  // Params marked Fp8Recipe::Tensorwise (Param::fp8) are all-gathered as E4M3 with scales from
  // one all-reduced amax per step (Note [Float8 all-gather]); false: in param_dtype, and the
  // Linear casts after the all-gather (the same values, twice the all-gather bytes).
  bool fp8_all_gather = true;
};

struct FullyShardOptions {
  // nullopt: FSDP2's default, true for every module but the root. An int N (FSDP2's int form)
  // reshards after forward to groups of N consecutive ranks of the shard group, e.g. one node:
  // the backward all-gather then runs on that smaller group. N must divide the shard group's
  // size and be > 1; N equal to the shard size means true (Note [Post-forward mesh]).
  std::optional<std::variant<bool, int>> reshard_after_forward;
  MixedPrecisionPolicy mp_policy;
  // Per-param mesh: return the mesh a param shards over, or nullptr for the module's mesh.
  // Params on different meshes form different param groups (one AG and one RS each).
  std::function<Mesh*(const Module& owner, const Param& param)> shard_placement_fn;
};

// Note [Optimizer in backward]
// The optimizer step of one param group's shard, run right after the group's reduce-scatter
// on the RS stream: the optimizer's memory traffic runs under the rest of backward, and the
// grad shard lives only between the two (it is never kept). Each reduce-scatter of a group is
// one optimizer step for it. The grad comes in the reduce dtype when the reduce-scatter's
// output is the grad as is (an average in bf16: the optimizer reads it without an fp32 copy,
// which would cost 6 bytes of traffic per element), else in fp32.
using ShardStepFn = std::function<void(Stream rs_stream, int group_ordinal, float* param,
                                       const void* grad, DType grad_dtype, int64_t numel)>;

// Note [Optimizer in forward]
// The optimizer step of each param group runs in the next forward, on the all-gather stream,
// just before the group's all-gather, instead of all at once after backward on the compute
// stream. The step's memory traffic (AdamW reads and writes 28 bytes per fp32 param) then
// runs under the compute of the units before it, and the step also writes the new param,
// rounded to the param dtype, straight into the all-gather's input: that is the copy-in, so
// the shard is not read a second time. Every element's math is unchanged, so the params are
// bitwise those of the plain step.
// The root's defer_shard_updates(s), after the step's clipping sums, closes the step and marks
// every sharded group's update pending (one that is not sharded then, say the root kept
// unsharded, runs at once on s). A pending update runs exactly once, on the first of:
// - the group's next all-gather from its shards (forward, evaluation, explicit unshard);
// - the next backward's first hook (the update must read its grad shard before the next
//   reduce-scatter writes it), for a group the forward did not gather;
// - apply_pending_shard_updates(s), which whoever reads the shards or the optimizer state
//   calls first (checkpoints, gather_full_params, the end of training).
// Each update waits for the work issued on the defer stream before defer_shard_updates; that
// step's scalars and sums are kept aside, so the next step's begin_step cannot change them.
// Graph replays assume every group pending at the start of the step (Note [Captured steps]).
// All of this state has one owner, optim::OptimizerInForward, which the core calls into at
// these points (Note [Optimizer in forward's owner], fsdp/optim.h).

// Note [Early grad norm]
// Called once a group's fp32 grad shard is final for the step (its reduce-scatter, with HSDP
// its replica all-reduce, and any accumulation done), on the stream that wrote it, so work the
// callee enqueues there reads the final shard. The trainer sums the shard's squares there
// (optim::Optimizer::add_grad_square): the global grad norm is then computed under the rest of
// backward, leaving only a small all-reduce after it. Each sum is the same kernel over the same
// tiles as the whole-list sum, so the norm is bitwise the same.
using GradShardReadyFn =
    std::function<void(Stream s, int group_ordinal, const float* grad, int64_t numel)>;

// Note [Optimizer offload hooks]
// With the optimizer on the host (optim::OptimizerOffload, fsdp/optim_offload.h) a group's
// fp32 shard is rewritten by an upload on a stream of the offload's own, after the host
// step; the schedule itself is unchanged, and only these points reach the offload:
// - before_all_gather(all-gather stream, group): just before a group's copy-in from its fp32
//   shard (not before a gather from a post-forward shard, which that step's forward made);
//   the all-gather stream waits for the group's upload there, and only for that group's;
// - before_shard_read(s): in apply_pending_shard_updates(s), which whoever reads the shards or
//   the optimizer state outside the schedule calls first (checkpoints, gather_full_params,
//   the end of training): s waits for every host step and upload;
// - the grad shard's end of a step is the Note [Early grad norm] hook (set_on_grad_shard_ready):
//   the gradient goes down to the host from there.
struct ShardOffloadHooks {
  std::function<void(Stream all_gather_stream, int group_ordinal)> before_all_gather;
  std::function<void(Stream s)> before_shard_read;
};

// Test hook: how the RS ring reclaims buffers. Only tests use Fsdp2_12LastGroupDrains, which
// reproduces FSDP2 2.12's hook-order-dependent drain (docs/design.md) so the bound test
// can be seen to fail.
enum class RsReclaimPolicy : uint8_t { BoundedRing, Fsdp2_12LastGroupDrains };

// One record of the schedule's event log (set_event_log), for order tests.
struct ScheduleEvent {
  std::string op;     // "unshard", "reshard", "post_backward", "reduce_scatter"
  std::string unit;   // the FSDP module's fqn ("" is the root), with ":group" for groups > 0
  std::string phase;  // "forward", "pre_backward", "post_backward", "finalize"
  friend bool operator==(const ScheduleEvent&, const ScheduleEvent&) = default;
};
std::string to_string(const ScheduleEvent& e);

// The rule for FsdpModule::set_reduce_scatter_max_input_buffers's k (k >= 1): an OptionError
// naming reduce_scatter_max_input_buffers otherwise (Note [Options checked once]).
void check_reduce_scatter_max_input_buffers(int k);

// The handle fully_shard returns (FSDP2's FSDPModule).
class FsdpModule {
 public:
  explicit FsdpModule(core::FsdpState& state) : state_(&state) {}

  Module& module() const;
  const std::string& fqn() const;

  void set_reshard_after_forward(bool reshard, bool recurse = true);
  void set_reshard_after_backward(bool reshard, bool recurse = true);
  // false: no reduce-scatter and no all-reduce; grads accumulate unsharded (micro-batches).
  void set_requires_gradient_sync(bool sync, bool recurse = true);
  // HSDP only: false skips the all-reduce across replicas; the reduce-scattered grad
  // accumulates in a partial buffer until a backward with the all-reduce on (FSDP2's name).
  // Gradient sync off implies no all-reduce either.
  void set_requires_all_reduce(bool all_reduce, bool recurse = true);
  void set_is_last_backward(bool last);  // root only
  // Most RS input buffers alive at once for this root (FSDP2 #186000), k >= 1. Per-module
  // values resolve to the maximum over the root's modules at lazy init, as in FSDP2; a call
  // after it (on any module of the tree) re-resolves k for the next reduce-scatter.
  void set_reduce_scatter_max_input_buffers(int k, bool recurse = true);
  // RS on its own communicator (one per distinct rank set), so it overlaps AG (#186335).
  void set_separate_reduce_scatter_group(bool enable, bool recurse = true);
  // Note [Gradient divide factor]
  // By default a group's reduce-scatter averages over its mesh: the grad of the mean of the
  // ranks' losses when every rank of the mesh saw its own data. A group whose mesh is not the
  // data-parallel one needs another divisor: an expert sharded over efsdp = dp / ep ranks
  // already sums the grads of its whole ep group's tokens (the all-to-all brought them), so
  // its grad of the global mean loss is sum over efsdp / dp, not the efsdp average
  // (docs/moe.md). With a factor F set, the RS sums and scales by 1 / F (FSDP2's
  // set_gradient_divide_factor); a group whose mesh's data-parallel size (replicate x shard)
  // equals F keeps the plain average.
  void set_gradient_divide_factor(double factor, bool recurse = true);
  void set_modules_to_forward_prefetch(const std::vector<FsdpModule*>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FsdpModule*>& modules);
  // Explicit unshard/reshard (not recursive), as FSDP2's FSDPModule.unshard()/reshard().
  // The all-gather follows all work issued so far on the compute stream. With async_op the
  // compute stream does not wait for it here (the module's pre-forward does): a training loop
  // prefetches the first unit of the next step this way, so its all-gather runs while the
  // host is between steps. Before the first forward, unshard initializes FSDP lazily, as
  // FSDP2 does; the all-gather then follows all work issued on the device (Note [Unshard
  // before forward]).
  void unshard(bool async_op = false);
  void reshard();

  // ---- observability, mostly for tests
  // Root only, before the first forward (or unshard): Note [Optimizer in backward]. The
  // ordinal of a group is its index in sharded_groups(root).
  void set_optimizer_in_backward(ShardStepFn step);
  // Root only, before the first forward (or unshard): Note [Early grad norm]. Group
  // ordinals as above.
  void set_on_grad_shard_ready(GradShardReadyFn on_ready);
  // Root only, before the first forward (or unshard): Note [Optimizer in forward]. `updates`
  // (made over the optimizer of sharded_groups(root), tensor i for group ordinal i) keeps the
  // deferred step and runs each group's part of it; it must outlive the forwards.
  void set_optimizer_in_forward(optim::OptimizerInForward& updates);
  // Root only, before the first forward (or unshard): Note [Optimizer offload hooks].
  void set_shard_offload_hooks(ShardOffloadHooks hooks);
  // Root only, after the step's clipping sums: closes the optimizer's step; every group's
  // update is pending from now, after the work issued on s.
  void defer_shard_updates(Stream s);
  // Root only: runs every pending update now, on s.
  void apply_pending_shard_updates(Stream s);
  int pending_shard_updates() const;  // groups whose deferred update has not run

  void set_event_log(std::vector<ScheduleEvent>* log);  // root only; nullptr stops logging
  void set_rs_reclaim_policy_for_testing(RsReclaimPolicy policy);  // root only
  int reduce_scatter_max_input_buffers() const;  // the root's resolved k
  bool is_root() const;

  core::FsdpState& state() const { return *state_; }

 private:
  core::FsdpState* state_;
};

// Shards `module`'s params (those not already owned by an FSDP descendant) over `mesh` and
// installs the hooks. Call it bottom-up: blocks first, the root last. Raises fsdp::Error on
// invalid input (a mesh that is not on the module's device, mismatched init shapes, ...).
FsdpModule& fully_shard(Module& module, Mesh& mesh, const FullyShardOptions& options = {});

// The FSDP handle of a module, or nullptr.
FsdpModule* fsdp_module_of(Module& module);

// Every sharded fp32 param/grad of the root's tree, for optimizers: one entry per param
// group, flat over the group's params (padding included: its grad is always zero).
struct ShardedGroupView {
  std::string name;
  float* param = nullptr;
  float* grad = nullptr;
  int64_t numel = 0;
  Mesh* mesh = nullptr;  // the mesh the group shards over
};
// With with_grads, the persistent fp32 grad shards are made (they are not, under an
// optimizer in backward); grad is nullptr otherwise.
std::vector<ShardedGroupView> sharded_groups(FsdpModule& root, bool with_grads = true);
// Note [Lazy zero grad]: marks every grad shard zero without touching memory. The first
// reduce-scatter after it writes the shard directly (no fill, no accumulation pass); the
// root's finalize fills the groups that got none. So read grad shards after a backward.
void zero_sharded_grads(FsdpModule& root);

// Note [Grads set to none]
// FSDP2's optimizer.zero_grad(set_to_none=True): frees every grad shard, stream-ordered on s.
// No grad memory is then held from the optimizer step to each group's next reduce-scatter,
// which makes its shard again (or the root's finalize does, zeroed, for a group that got none):
// in forward and at the loss a rank holds its params and optimizer state only, and the grads
// come back one group at a time through backward. The pointers sharded_groups gave are stale
// after it; grad_shards gives the current ones (after the next backward, every group's).
// The trainer does this unless the step is a CUDA graph (whose addresses are fixed), the
// optimizer is in forward (it reads the grads in the next forward) or offloaded.
void release_sharded_grads(FsdpModule& root, Stream s);
// Each group's grad shard now, in sharded_groups(root) order (nullptr: none made since the
// last release_sharded_grads).
std::vector<float*> grad_shards(FsdpModule& root);

// Gathers the full fp32 value of every param (for checks and checkpoints); collective.
std::vector<std::vector<float>> gather_full_params(FsdpModule& root, Stream compute);

}  // namespace fsdp
