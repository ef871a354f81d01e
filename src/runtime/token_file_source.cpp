#include "runtime/token_file_source.h"

#include <mutex>
#include <vector>

#include "fsdp/data.h"
#include "fsdp/error.h"

namespace fsdp::runtime {

namespace {

// A rank's rows [first_row, first_row + rows) are sequences of the global batch: rank
// first_row / rows of a world whose every rank holds rows / seq_len sequences.
data::BatchShape shape_of(const nn::ModelConfig& model, int64_t rows, int world) {
  FSDP_USER_CHECK(rows % model.seq_len == 0, "tokens per rank (", rows,
                  ") must be a whole number of sequences of seq_len ", model.seq_len);
  return {rows / model.seq_len, model.seq_len, world};
}

DeviceBatch upload(Device& d, Stream s, const std::vector<int32_t>& ids,
                   const std::vector<int32_t>& labels) {
  DeviceBatch out;
  out.tokens = static_cast<int64_t>(ids.size());
  out.x = empty_tensor(d, s, DType::I32, out.tokens, 1, MemTag::Activation);
  out.labels = empty_tensor(d, s, DType::I32, out.tokens, 1, MemTag::Activation);
  d.set_label("data");
  d.copy_from_host(s, out.x.data, ids.data(), out.x.bytes());
  d.copy_from_host(s, out.labels.data, labels.data(), out.labels.bytes());
  return out;
}

class TrainingBatches final : public BatchSource {
 public:
  TrainingBatches(std::shared_ptr<const data::TokenFile> file, nn::ModelConfig model,
                  uint64_t seed, int world)
      : file_(std::move(file)), model_(std::move(model)), seed_(seed), world_(world) {}

  DeviceBatch make(Device& d, Stream s, int64_t index, int64_t first_row, int64_t rows,
                   DType) override {
    if (!sampler_ || sampler_->shape().batch * model_.seq_len != rows)
      sampler_ = std::make_unique<data::BatchSampler>(file_, shape_of(model_, rows, world_), seed_);
    std::vector<int32_t> ids(static_cast<size_t>(rows)), labels(ids.size());
    sampler_->fill(index, static_cast<int>(first_row / rows), ids, labels);
    return upload(d, s, ids, labels);
  }

 private:
  std::shared_ptr<const data::TokenFile> file_;
  nn::ModelConfig model_;
  uint64_t seed_;
  int world_;
  std::unique_ptr<data::BatchSampler> sampler_;
};

class FixedValidationBatches final : public BatchSource {
 public:
  FixedValidationBatches(std::shared_ptr<const data::TokenFile> file, nn::ModelConfig model,
                         int world)
      : file_(std::move(file)), model_(std::move(model)), world_(world) {}

  DeviceBatch make(Device& d, Stream s, int64_t index, int64_t first_row, int64_t rows,
                   DType) override {
    data::ValidationBatches batches(file_, shape_of(model_, rows, world_), index + 1);
    FSDP_USER_CHECK(index < batches.count(), file_->path(), ": holds ", batches.count(),
                    " validation batches of this shape, batch ", index + 1, " was asked for");
    std::vector<int32_t> ids(static_cast<size_t>(rows)), labels(ids.size());
    batches.fill(index, static_cast<int>(first_row / rows), ids, labels);
    return upload(d, s, ids, labels);
  }

 private:
  std::shared_ptr<const data::TokenFile> file_;
  nn::ModelConfig model_;
  int world_;
};

// Rank threads of one launch share one mapping of each file.
std::shared_ptr<const data::TokenFile> open_shared(const std::string& path, int64_t vocab,
                                                   const std::string& purpose) {
  static std::mutex mutex;
  static std::vector<std::weak_ptr<const data::TokenFile>> open;
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& w : open)
    if (auto f = w.lock(); f && f->path() == path && f->vocab() == vocab) return f;
  auto f = std::make_shared<const data::TokenFile>(path, vocab, 0, purpose);
  open.push_back(f);
  return f;
}

}  // namespace

BatchSourceFactory token_file_batches(const std::string& path, const nn::ModelConfig& model,
                                      uint64_t seed) {
  auto file = open_shared(path, model.vocab, "training");
  return [file, model, seed](int, int world) -> std::unique_ptr<BatchSource> {
    return std::make_unique<TrainingBatches>(file, model, seed, world);
  };
}

BatchSourceFactory validation_batches(const std::string& path, const nn::ModelConfig& model) {
  auto file = open_shared(path, model.vocab, "validation");
  return [file, model](int, int world) -> std::unique_ptr<BatchSource> {
    return std::make_unique<FixedValidationBatches>(file, model, world);
  };
}

int64_t validation_batch_count(const std::string& path, const nn::ModelConfig& model,
                               int64_t sequences_per_rank, int world_size, int64_t max_batches) {
  auto file = open_shared(path, model.vocab, "validation");
  return data::ValidationBatches(file, {sequences_per_rank, model.seq_len, world_size}, max_batches)
      .count();
}

}  // namespace fsdp::runtime
