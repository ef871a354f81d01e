#include "runtime/batch_source.h"

namespace fsdp::runtime {

namespace {

class SyntheticFeatures final : public BatchSource {
 public:
  SyntheticFeatures(const nn::ModelConfig& model, uint64_t seed) : model_(model), seed_(seed) {}

  DeviceBatch make(Device& d, Stream s, int64_t index, int64_t first_row, int64_t rows,
                   DType t) override {
    DeviceBatch out;
    out.tokens = rows;
    out.x = empty_tensor(d, s, t, rows, model_.dim, MemTag::Activation);
    d.set_label("data");
    d.synthetic_batch(s, out.x.data, t, rows, model_.dim, seed_, index, first_row, nn::kDataBound);
    if (model_.classes > 0) {  // on the device: no host work per row
      out.labels = empty_tensor(d, s, DType::I32, rows, 1, MemTag::Activation);
      d.synthetic_labels(s, static_cast<int32_t*>(out.labels.data), rows,
                         nn::label_width(model_), seed_, index, first_row, nn::kDataBound);
    }
    return out;
  }

 private:
  nn::ModelConfig model_;
  uint64_t seed_;
};

// The transformer's synthetic tokens (nn::make_token_batch): int32 ids and next-token labels.
class SyntheticTokens final : public BatchSource {
 public:
  SyntheticTokens(const nn::ModelConfig& model, uint64_t seed) : model_(model), seed_(seed) {}

  DeviceBatch make(Device& d, Stream s, int64_t index, int64_t first_row, int64_t rows,
                   DType) override {
    const nn::TokenBatch tokens =
        nn::make_token_batch(model_, seed_, static_cast<int>(index), first_row, rows);
    DeviceBatch out;
    out.tokens = rows;
    out.x = empty_tensor(d, s, DType::I32, rows, 1, MemTag::Activation);
    out.labels = empty_tensor(d, s, DType::I32, rows, 1, MemTag::Activation);
    d.set_label("data");
    d.copy_from_host(s, out.x.data, tokens.ids.data(), out.x.bytes());
    d.copy_from_host(s, out.labels.data, tokens.labels.data(), out.labels.bytes());
    return out;
  }

 private:
  nn::ModelConfig model_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<BatchSource> make_synthetic_tokens(const nn::ModelConfig& model, uint64_t seed) {
  return std::make_unique<SyntheticTokens>(model, seed);
}

std::unique_ptr<BatchSource> make_synthetic_features(const nn::ModelConfig& model, uint64_t seed) {
  return std::make_unique<SyntheticFeatures>(model, seed);
}

}  // namespace fsdp::runtime
