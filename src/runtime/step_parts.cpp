#include "runtime/step_parts.h"

#include <cmath>

#include "fsdp/error.h"
#include "models/model_family.h"

namespace fsdp::runtime {

Tensor loss_and_grad(Device& d, Stream s, const nn::Model& model, const Tensor& y,
                     const DeviceBatch& batch, float* loss) {
  Tensor dy = empty_tensor(d, s, y.dtype, y.rows, y.cols, MemTag::Activation);
  d.set_label("loss");
  if (model.uses_cross_entropy())
    d.cross_entropy_loss(s, y.data, y.dtype, batch.labels.as<int32_t>(), y.rows, y.cols, loss,
                         dy.data);
  else
    d.mean_square_loss(s, y.data, y.dtype, y.numel(), loss, dy.data);
  return dy;
}

void scale_for_micro_batches(Device& d, Stream s, Tensor& dy, int n, Tensor& scale) {
  if (n <= 1) return;
  if (!scale.defined() || scale.rows != dy.rows) {
    scale = empty_tensor(d, s, DType::F32, dy.rows, 1, MemTag::Other);
    d.fill(s, scale.data, DType::F32, dy.rows, 1.0f / static_cast<float>(n));
  }
  d.set_label("micro-batch loss scale");
  d.scale_rows(s, dy.data, dy.data, dy.dtype, scale.as<float>(), 1, dy.rows, dy.cols, false);
}

DeviceBatch make_step_batch(BatchSource& source, int step, Device& device, Stream s, int64_t index,
                            int64_t first_row, int64_t rows, DType act_dtype) {
  try {
    return source.make(device, s, index, first_row, rows, act_dtype);
  } catch (const StepError&) {
    throw;
  } catch (const UserError& e) {
    throw StepError(step, detail::concat("step ", step + 1, ": ", e.what()));
  }
}

std::unique_ptr<BatchSource> make_source(const TrainConfig& c, int rank, int world) {
  if (c.batch_source) return c.batch_source(rank, world);
  return models::family(c.model.kind).batch_kind() == models::BatchKind::Tokens
             ? make_synthetic_tokens(c.model, c.seed)
             : make_synthetic_features(c.model, c.seed);
}

float global_norm(const std::vector<float>& squares) {
  if (squares.empty()) return -1;
  double sum = 0;
  for (float s : squares) sum += s;
  return static_cast<float>(std::sqrt(sum));
}

}  // namespace fsdp::runtime
