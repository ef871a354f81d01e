// The validation loss during training (Note [Evaluation]).
#pragma once

#include <cstdint>

#include "fsdp/comm.h"
#include "fsdp/nn/model.h"
#include "runtime/batch_source.h"

namespace fsdp::runtime {

// Note [Evaluation]
// The validation loss is a forward pass per fixed batch, with no backward: FSDP gathers each
// unit and reshards it after forward as in training, and the next training step's root
// pre-forward starts a new step as usual. Each batch's loss is averaged over the ranks, then
// over the batches, on the device; the host waits once, for the mean. `step` is the training
// step it follows, for an error (Note [Unreadable steps]).
float evaluate(Device& device, Comm& world, RunContext& ctx, nn::Model& model,
               BatchSource& source, int64_t batches, int64_t first_row, int64_t rows, int step);

}  // namespace fsdp::runtime
