// Reading each step's loss and gradient norms without stopping the device.
//
// Note [Asynchronous step read]
// A step's loss (averaged over ranks and micro-batches on the device) and its per-tensor grad
// squares are copied into a host buffer behind an event at the end of the step. The host reads
// them one step later, after it has issued the next step, so steps run back to back with no
// host synchronization between them; the device never waits for the host. The step line
// therefore lags one step behind the work. Two slots suffice: slot s is written again only by
// step n + 2, issued after step n was read.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "fsdp/device.h"

namespace fsdp::runtime {

struct StepValues {
  int step = 0;
  float loss = 0;
  std::vector<float> grad_squares;  // empty when the step had no grad norm
  std::vector<float> extras;        // the step's extra values (StepReader's extra_count)
  double done_ms = 0;               // host clock when the values were seen
};

class StepReader {
 public:
  // extra_count: more values per step that the caller copies into extras() before end()
  // (the MoE layers' loads), read with the loss.
  StepReader(Device& device, Stream stream, int grad_count, int extra_count = 0);
  ~StepReader();
  StepReader(const StepReader&) = delete;
  StepReader& operator=(const StepReader&) = delete;

  // Zeroes step `step`'s loss on the device; returns where its micro-batch losses add up.
  float* begin(int step);
  // After the step's work: its grad squares (device, grad_count floats; null: none) join the
  // loss in the slot, the slot goes to the host, an event marks it.
  void end(const float* grad_squares);
  // The current step's extra values on the device (extra_count floats), between begin and end.
  float* extras() const;
  int pending() const { return static_cast<int>(queue_.size()); }
  // Waits for the oldest pushed step and returns its values.
  StepValues pop();

 private:
  struct Slot {
    float* device = nullptr;  // [loss, grad squares..., extras...]
    float* host = nullptr;
    Event done;
    int step = -1;
    bool has_grads = false;
  };
  Device& device_;
  Stream stream_;
  int grad_count_, extra_count_;
  Slot slots_[2];
  int current_ = -1;
  std::deque<int> queue_;  // slot indices, oldest first
};

}  // namespace fsdp::runtime
