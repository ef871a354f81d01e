// A whole training step recorded once into a CUDA graph and replayed every step after.
//
// Note [Captured steps]
// With TrainConfig::cuda_graph, the trainer runs its first steps eagerly (warm-up: GEMM plans,
// cuDNN plans, NCCL set-up and every lazily made buffer come to exist), then records the next
// step (every micro-batch's forward and backward with their all-gathers and reduce-scatters,
// the root's finalize, the grad norm, clipping and the optimizer) with Device::begin_capture /
// end_capture, and replays that graph for every later step. The host then only does what must
// change from step to step, outside the graph:
// - the batch: made as usual, then copied into fixed device buffers the graph reads (the
//   first staged batch becomes those buffers);
// - the optimizer's StepScalars (lr, bias corrections: Note [Step scalars]), uploaded by
//   Optimizer::begin_step before the replay, so lr schedules need no re-capture;
// - the step's loss: the graph adds it up in a fixed device float, copied into the step
//   reader's slot after the replay (Note [Asynchronous step read] is unchanged).
// Host-side FSDP state (which units are sharded, the RS ring's position) is left as the
// captured step left it, which is also how every replayed step leaves the device. What cannot
// be captured fails in one line before or at the capture (docs/cuda_graphs.md): host routing
// (the MoE transformer's dropless routing; with a capacity factor it routes on the device and
// captures), a host wait inside the step, state allocated in one step and freed in the next
// (--prefetch-next-step is therefore off under graphs).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fsdp/device.h"
#include "runtime/batch_source.h"

namespace fsdp::runtime {

class CapturedStep {
 public:
  CapturedStep(Device& device, Stream stream, int micro_batches);
  ~CapturedStep();
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;

  bool captured() const { return graph_ >= 0; }
  // Puts micro-batch `mb`'s batch where the graph reads it (outside the graph).
  void stage(int mb, DeviceBatch fresh);
  const DeviceBatch& batch(int mb) const { return batches_.at(mb); }
  float* step_loss() const { return step_loss_; }
  // Records `step` (which issues one whole step on the stream) into the graph.
  void capture(const std::function<void()>& step);
  void replay();
  const std::vector<std::string>& streams() const { return streams_; }
  // Whether a replay puts the step's ops on the timeline (Device::graph_has_op_times).
  bool op_times() const { return captured() && device_.graph_has_op_times(graph_); }

 private:
  Device& device_;
  Stream stream_;
  std::vector<DeviceBatch> batches_;
  float* step_loss_ = nullptr;
  int graph_ = -1;
  std::vector<std::string> streams_;
};

}  // namespace fsdp::runtime
