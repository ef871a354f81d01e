// The optimizer on the host (FSDP2's CPUOffloadPolicy, ZeRO-Offload): fp32 master weights and
// the optimizer's state in host memory (page-locked on CUDA), the gradients passing through two
// host buffers, the step run on the host, threaded. docs/memory.md, "Optimizer offload".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/optim.h"

namespace fsdp::optim {

struct OffloadOptions {
  // Host bytes the offloaded state may take, for all ranks_sharing_host ranks together;
  // 0: /proc/meminfo's MemAvailable.
  int64_t host_memory_limit = 0;
  // Ranks whose offloaded state the same host holds (every CPU rank of a process; the GPUs of
  // one node): the check counts this rank's state that many times. 0: 1 here; the trainer
  // reads it as every rank of the world.
  int ranks_sharing_host = 0;
  // Threads of each rank's host step; 0: the host's cores / ranks_sharing_host, at least 1.
  int threads = 0;
  // The host is simulated (Device::computes_values false): only host_memory_limit applies,
  // not this machine's MemAvailable.
  bool simulated_host = false;
  // Test hook: true leaves out the all-gather's wait for the group's upload, so a test can see
  // the schedule go wrong without it (the copy-in then races the upload).
  bool drop_upload_wait_for_testing = false;
};

// The host buffers the grads come down into, used in turn (Note [Optimizer offload]).
constexpr int kOffloadGradSlots = 2;

// Host bytes one rank's offloaded state takes: per element the fp32 master and the optimizer's
// states, and kOffloadGradSlots fp32 grads of the largest group.
int64_t offload_host_bytes(const std::vector<ParamSpan>& params, const OptimizerConfig& config);
// MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read.
int64_t available_host_memory();
// A UserError in one line when ranks_sharing_host ranks' state will not fit the host (the
// limit, or MemAvailable): bytes needed vs available. Before anything is allocated.
void check_offload_host_memory(const std::vector<ParamSpan>& params, const OptimizerConfig& config,
                               const OffloadOptions& options);

// Note [Optimizer offload]
// Per param group g (tensor g of the optimizer, group ordinal g of the root), every step:
//   D2H stream:  waits for g's grad shard (the Note [Early grad norm] hook's stream, or the
//                step's compute stream for a group the hook did not reach), copies it down
//                into one of kOffloadGradSlots host buffers (the j-th group issued takes
//                slot j % slots, so a group always gets the same one) once the host step that
//                read that slot last is done: the host holds no grad per group;
//   host stream: waits for that, (clipping) for the grad sums, runs the step of g on the host;
//   H2D stream:  waits for that, copies the new fp32 master up into g's device shard;
//   all-gather:  g's next copy-in waits for the upload (before_all_gather), and only g's.
// The groups are issued in the reverse of their ordinals, the order backward reduce-scatters
// them, so a stream never waits for a later group while an earlier one is ready. Each buffer's
// next writer waits for its last reader: a D2H for the host step that read its slot last,
// the next host step of g for g's upload (the master), the next backward (before_backward on
// compute) for every D2H (the device grad, which the reduce-scatters overwrite); the device
// shard's readers before an upload (g's copy-in) come before g's next reduce-scatter, which
// that upload follows. The step's math is the CPU backend's optimizer kernel, element for
// element, so the params are bitwise those of the device step there.
class OptimizerOffload {
 public:
  // `optimizer` holds its state on the host (StatePlacement::Host) over the groups' device
  // shards; the masters start as copies of those shards (read on `stream`, synchronized).
  OptimizerOffload(Optimizer& optimizer, Stream stream, const OffloadOptions& options);
  ~OptimizerOffload();
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  // The root's hooks (FsdpModule::set_shard_offload_hooks), which call into this object.
  ShardOffloadHooks hooks();
  // Group g's grad shard is final for the step, after the work issued on s (Note [Early grad
  // norm]).
  void grad_ready(Stream s, int group);
  // Before a backward that may reduce-scatter: compute waits until the grads are down.
  void before_backward(Stream compute);
  // The step after backward, in place of Optimizer::step (compute_grad_squares first when
  // clipping): issues every group's transfer down, host step and upload; returns at once.
  void step(Stream compute);
  // s waits for every host step and upload issued so far (before_shard_read).
  void wait_all(Stream s);
  // The masters from the device shards again (after a checkpoint loaded them), on s.
  void pull_masters(Stream s);

  int64_t host_bytes() const { return host_bytes_; }
  int threads() const;
  int64_t steps_issued() const { return steps_issued_; }

 private:
  struct Group;
  class Threads;
  void host_step(int group, const StepScalars& scalars, int sum_count);

  Optimizer& optimizer_;
  Device& device_;
  Stream down_, host_, up_;
  std::vector<Group> groups_;
  float* sums_ = nullptr;  // host copy of the optimizer's grad sums (clipping)
  std::vector<float*> grad_slots_;  // kOffloadGradSlots host grads of the largest group's size
  std::vector<Event> slot_free_;    // per slot: after the host step that read it last
  Event step_begun_;  // on compute at step(): for groups the grad hook did not reach
  std::unique_ptr<Threads> threads_;
  int64_t host_bytes_ = 0;
  bool drop_upload_wait_ = false;
  int64_t steps_issued_ = 0;
};

}  // namespace fsdp::optim
