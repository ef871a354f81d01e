// The optimizer in forward's one owner (Note [Optimizer in forward's owner], fsdp/optim.h).
#include <algorithm>

#include "fsdp/error.h"
#include "fsdp/optim.h"

namespace fsdp::optim {

OptimizerInForward::OptimizerInForward(Optimizer& optimizer, Stream stream)
    : optimizer_(optimizer), device_(optimizer.device_) {
  const size_t sums = std::max<size_t>(optimizer.sq_names_.size(), 1);
  scalars_ = static_cast<StepScalars*>(device_.alloc(sizeof(StepScalars), stream, MemTag::Other));
  sums_ = static_cast<float*>(device_.alloc(sums * sizeof(float), stream, MemTag::Other));
  pending_.assign(optimizer.tensors_.size(), false);
  ready_ = device_.create_event();
  joined_ = device_.create_event();
}

OptimizerInForward::~OptimizerInForward() {
  synchronize_in_destructor(device_);
  device_.free(scalars_, Stream{0});
  device_.free(sums_, Stream{0});
  device_.destroy_event(ready_);
  device_.destroy_event(joined_);
}

void OptimizerInForward::defer(Stream s, const std::vector<bool>& may_wait) {
  FSDP_CHECK(pending_count_ == 0, "the optimizer in forward closed a step before every part of "
             "the previous one ran");
  FSDP_CHECK(may_wait.size() == pending_.size(), "defer: ", may_wait.size(), " groups for ",
             pending_.size(), " optimizer tensors");
  Optimizer& o = optimizer_;
  if (!o.begun_) o.begin_step(s, o.config_.base_lr());
  o.end_step();
  device_.set_label("optimizer deferred");
  device_.copy(s, scalars_, o.scalars_, sizeof(StepScalars));
  sum_count_ = o.grad_sq_valid_ ? static_cast<int>(o.sq_names_.size()) : 0;
  if (sum_count_ > 0)
    device_.copy(s, sums_, o.grad_sq_, static_cast<size_t>(sum_count_) * sizeof(float));
  device_.record_event(ready_, s);
  ready_stream_ = s;
  for (size_t g = 0; g < pending_.size(); ++g) {
    if (may_wait[g]) {
      pending_[g] = true;
      ++pending_count_;
    } else {
      launch_part(s, static_cast<int>(g), nullptr, DType::F32);
    }
  }
  left_by_defer_ = pending_count_;
}

void OptimizerInForward::forward_begins(Stream compute) {
  if (pending_count_ == 0) return;
  device_.record_event(ready_, compute);
  ready_stream_ = compute;
}

void OptimizerInForward::run(Stream s, int group, void* param_copy, DType copy_dtype) {
  FSDP_CHECK(pending(group), "group ", group, " has no pending optimizer step");
  if (!(s == ready_stream_)) {
    device_.wait_event(s, ready_);
    if (std::find(ran_elsewhere_.begin(), ran_elsewhere_.end(), s) == ran_elsewhere_.end())
      ran_elsewhere_.push_back(s);
  }
  launch_part(s, group, param_copy, copy_dtype);
  pending_[static_cast<size_t>(group)] = false;
  --pending_count_;
}

void OptimizerInForward::run_all(Stream s) {
  for (size_t g = 0; g < pending_.size(); ++g)
    if (pending_[g]) run(s, static_cast<int>(g));
  // Whoever reads the shards on s (a checkpoint, say) must follow the parts that ran on the
  // all-gather stream too.
  for (const Stream other : ran_elsewhere_) {
    if (other == s) continue;
    device_.record_event(joined_, other);
    device_.wait_event(s, joined_);
  }
  ran_elsewhere_.clear();
}

void OptimizerInForward::launch_part(Stream s, int group, void* param_copy, DType copy_dtype) {
  OptimTensor t = optimizer_.tensors_.at(static_cast<size_t>(group));
  FSDP_CHECK(t.grad, "optimizer tensor ", group, " has no grad shard to step with");
  t.param_copy = param_copy;
  t.param_copy_dtype = copy_dtype;
  optimizer_.launch(s, &t, 1, scalars_, GradSquares{sums_, sum_count_});
  ++parts_run_;
}

}  // namespace fsdp::optim
