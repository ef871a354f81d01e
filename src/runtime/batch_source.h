// Where a training step's inputs come from.
//
// Note [Batch sources]
// The trainer asks a BatchSource for each micro-batch: micro-batch `index` (= step *
// micro_batches + micro-batch) of the global batch, rows [first_row, first_row + rows) of it
// for this rank. Every source must be deterministic in (index, first_row, rows), so that the
// unsharded reference, which asks for all ranks' rows at once, sees the same data. The
// synthetic sources make their data on the device; a file source (token files) reads its
// slice on the host and uploads it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "fsdp/device.h"
#include "fsdp/module.h"
#include "fsdp/nn/model.h"

namespace fsdp::runtime {

struct DeviceBatch {
  Tensor x;       // the model's input: features [rows, dim] in the activation dtype, or ids
  Tensor labels;  // int32 storage, one per row; undefined when the loss needs none
  int64_t tokens = 0;  // tokens this micro-batch trains on (for tokens/s)
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual DeviceBatch make(Device& device, Stream s, int64_t index, int64_t first_row,
                           int64_t rows, DType act_dtype) = 0;
};

// Makes a rank's source: rank and world of the data-parallel mesh.
using BatchSourceFactory = std::function<std::unique_ptr<BatchSource>(int rank, int world)>;

// The synthetic features of nn/model.h (Uniform rows made on the device, labels made on
// the device by Device::synthetic_labels when the model has classes).
std::unique_ptr<BatchSource> make_synthetic_features(const nn::ModelConfig& model, uint64_t seed);
// The transformer's synthetic token sequences (nn::make_token_batch).
std::unique_ptr<BatchSource> make_synthetic_tokens(const nn::ModelConfig& model, uint64_t seed);

}  // namespace fsdp::runtime
