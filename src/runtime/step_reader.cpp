#include "runtime/step_reader.h"

#include <chrono>

#include "fsdp/error.h"

namespace fsdp::runtime {

StepReader::StepReader(Device& device, Stream stream, int grad_count, int extra_count)
    : device_(device), stream_(stream), grad_count_(grad_count), extra_count_(extra_count) {
  const size_t bytes = static_cast<size_t>(1 + grad_count_ + extra_count_) * sizeof(float);
  for (Slot& s : slots_) {
    s.device = static_cast<float*>(device_.alloc(bytes, stream_, MemTag::Other));
    device_.fill(stream_, s.device, DType::F32, 1 + grad_count_ + extra_count_, 0.0f);
    s.host = static_cast<float*>(device_.alloc_host(bytes));
    s.done = device_.create_event();
  }
}

StepReader::~StepReader() {
  synchronize_in_destructor(device_);
  for (Slot& s : slots_) {
    device_.free(s.device, stream_);
    device_.free_host(s.host);
    device_.destroy_event(s.done);
  }
}

float* StepReader::begin(int step) {
  FSDP_CHECK(pending() < 2, "StepReader: two steps are unread; pop() one first");
  current_ = (current_ + 1) % 2;
  Slot& s = slots_[current_];
  s.step = step;
  device_.set_label("loss");
  device_.fill(stream_, s.device, DType::F32, 1, 0.0f);
  return s.device;
}

float* StepReader::extras() const {
  FSDP_CHECK(current_ >= 0, "StepReader: extras() before begin()");
  return slots_[current_].device + 1 + grad_count_;
}

void StepReader::end(const float* grad_squares) {
  Slot& s = slots_[current_];
  s.has_grads = grad_squares != nullptr && grad_count_ > 0;
  if (s.has_grads)
    device_.copy(stream_, s.device + 1, grad_squares, grad_count_ * sizeof(float));
  // Only what was written: the loss, the grad squares when there are any, the extras.
  const size_t bytes =
      (1 + (s.has_grads || extra_count_ > 0 ? grad_count_ : 0) + extra_count_) * sizeof(float);
  device_.copy_to_host(stream_, s.host, s.device, bytes);
  device_.record_event(s.done, stream_);
  queue_.push_back(current_);
}

StepValues StepReader::pop() {
  FSDP_CHECK(!queue_.empty(), "StepReader: no step to read");
  Slot& s = slots_[queue_.front()];
  queue_.pop_front();
  device_.synchronize_event(s.done);
  StepValues v;
  v.done_ms = std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now().time_since_epoch()).count();
  v.step = s.step;
  v.loss = s.host[0];
  if (s.has_grads) v.grad_squares.assign(s.host + 1, s.host + 1 + grad_count_);
  v.extras.assign(s.host + 1 + grad_count_, s.host + 1 + grad_count_ + extra_count_);
  return v;
}

}  // namespace fsdp::runtime
