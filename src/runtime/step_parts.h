// The pieces of a training step that the trainer and the unsharded reference share.
#pragma once

#include <memory>
#include <vector>

#include "fsdp/nn/model.h"
#include "runtime/batch_source.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

// Loss of y and its gradient; the loss lands in `loss` (device fp32).
Tensor loss_and_grad(Device& d, Stream s, const nn::Model& model, const Tensor& y,
                     const DeviceBatch& batch, float* loss);
// Scales the loss gradient of one of `n` micro-batches by 1/n (TrainConfig::micro_batches);
// `scale` holds 1/n per row, made on first use.
void scale_for_micro_batches(Device& d, Stream s, Tensor& dy, int n, Tensor& scale);
// The config's batches: its batch_source, or the synthetic batches of its model's kind.
std::unique_ptr<BatchSource> make_source(const TrainConfig& c, int rank, int world);
// Note [Unreadable steps]: the batch `index` of step `step` (0-based), or a StepError naming
// the step when the source cannot read it.
DeviceBatch make_step_batch(BatchSource& source, int step, Device& device, Stream s, int64_t index,
                            int64_t first_row, int64_t rows, DType act_dtype);
// The global norm from per-tensor grad squares; -1 with none.
float global_norm(const std::vector<float>& squares);

}  // namespace fsdp::runtime
