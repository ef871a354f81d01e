// The batch sampler and the validation batches (Note [Batch sampler] in include/fsdp/data.h).
#include <cmath>
#include <limits>
#include <numeric>

#include "fsdp/data.h"
#include "fsdp/error.h"

namespace fsdp::data {

uint64_t splitmix64_next(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ull;
  uint64_t z = state;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<uint32_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n) {
  FSDP_CHECK(n >= 0 && n <= std::numeric_limits<uint32_t>::max(), "window count ", n,
             " out of range");
  std::vector<uint32_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0u);
  // Each epoch's stream starts from its own state; the odd multiplier spreads the epochs.
  uint64_t state = seed ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull);
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t j = splitmix64_next(state) % static_cast<uint64_t>(i + 1);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

void copy_window(const TokenFile& file, int64_t window, int64_t seq_len, int32_t* inputs,
                 int32_t* labels) {
  FSDP_CHECK(window >= 0 && (window + 1) * seq_len < file.size(), "window ", window, " of ",
             seq_len, " + 1 tokens is outside ", file.path(), "'s ", file.size());
  std::vector<uint32_t> src(static_cast<size_t>(seq_len + 1));
  file.read(window * seq_len, seq_len + 1, src.data());
  for (int64_t t = 0; t < seq_len; ++t) {  // ids < vocab <= 2^31 (checked on every read): fit int32
    inputs[t] = static_cast<int32_t>(src[t]);
    labels[t] = static_cast<int32_t>(src[t + 1]);
  }
}

namespace {

void check_shape(const BatchShape& s) {
  FSDP_CHECK(s.batch >= 1 && s.seq_len >= 1 && s.world_size >= 1,
             "batch shape needs batch, seq_len and world_size >= 1 (got ", s.batch, ", ",
             s.seq_len, ", ", s.world_size, ")");
}

void check_slice(const BatchShape& s, int rank, std::span<int32_t> inputs,
                 std::span<int32_t> labels) {
  FSDP_CHECK(rank >= 0 && rank < s.world_size, "rank ", rank, " outside world of ",
             s.world_size);
  const size_t n = static_cast<size_t>(s.batch * s.seq_len);
  FSDP_CHECK(inputs.size() == n && labels.size() == n, "batch buffers hold ", inputs.size(),
             " and ", labels.size(), " tokens, expected ", n);
}

// Windows of T + 1 tokens at stride T; a file shorter than one window has none.
int64_t window_count(const TokenFile& file, int64_t seq_len) {
  return file.size() >= 1 ? (file.size() - 1) / seq_len : 0;
}

std::string batch_description(const BatchShape& s) {
  return detail::concat("one global batch (", s.world_size, " ranks x ", s.batch,
                        " sequences x ", s.seq_len, " tokens, + 1)");
}

}  // namespace

BatchSampler::BatchSampler(std::shared_ptr<const TokenFile> file, const BatchShape& shape,
                           uint64_t seed)
    : file_(std::move(file)), shape_(shape), seed_(seed) {
  check_shape(shape_);
  windows_ = window_count(*file_, shape_.seq_len);
  steps_per_epoch_ = windows_ / shape_.global_sequences();
  if (steps_per_epoch_ < 1)
    FSDP_USER_FAIL(file_->path(), ": ", file_->size(), " tokens, fewer than the ",
              shape_.global_sequences() * shape_.seq_len + 1, " that ", batch_description(shape_),
              " needs");
}

std::shared_ptr<const std::vector<uint32_t>> BatchSampler::permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (epoch != cached_epoch_) {
    cached_permutation_ = std::make_shared<const std::vector<uint32_t>>(
        epoch_permutation(seed_, epoch, windows_));
    cached_epoch_ = epoch;
  }
  return cached_permutation_;
}

std::vector<int64_t> BatchSampler::global_windows(int64_t step) const {
  FSDP_CHECK(step >= 0, "step ", step, " is negative");
  const int64_t g = shape_.global_sequences();
  const auto perm = permutation(step / steps_per_epoch_);
  const int64_t first = (step % steps_per_epoch_) * g;
  return std::vector<int64_t>(perm->begin() + first, perm->begin() + first + g);
}

void BatchSampler::fill(int64_t step, int rank, std::span<int32_t> inputs,
                        std::span<int32_t> labels) const {
  check_slice(shape_, rank, inputs, labels);
  FSDP_CHECK(step >= 0, "step ", step, " is negative");
  const auto perm = permutation(step / steps_per_epoch_);
  const int64_t first =
      (step % steps_per_epoch_) * shape_.global_sequences() + rank * shape_.batch;
  for (int64_t b = 0; b < shape_.batch; ++b)
    copy_window(*file_, (*perm)[static_cast<size_t>(first + b)], shape_.seq_len,
                inputs.data() + b * shape_.seq_len, labels.data() + b * shape_.seq_len);
}

void BatchSampler::next(int rank, std::span<int32_t> inputs, std::span<int32_t> labels) {
  fill(step_, rank, inputs, labels);
  ++step_;
}

SamplerState BatchSampler::state() const { return {step_, step_ / steps_per_epoch_}; }

void BatchSampler::restore(const SamplerState& state) {
  FSDP_CHECK(state.step >= 0, "sampler state has a negative step ", state.step);
  if (state.epoch != state.step / steps_per_epoch_)
    FSDP_USER_FAIL("sampler state (step ", state.step, ", epoch ", state.epoch,
              ") does not match ", file_->path(), " with this batch shape (",
              steps_per_epoch_, " steps per epoch): the data or the batch shape changed");
  step_ = state.step;
}

ValidationBatches::ValidationBatches(std::shared_ptr<const TokenFile> file,
                                     const BatchShape& shape, int64_t max_batches)
    : file_(std::move(file)), shape_(shape) {
  check_shape(shape_);
  FSDP_CHECK(max_batches >= 1, "validation needs at least one batch (got ", max_batches, ")");
  const int64_t available = window_count(*file_, shape_.seq_len) / shape_.global_sequences();
  if (available < 1)
    FSDP_USER_FAIL(file_->path(), ": ", file_->size(), " tokens, fewer than the ",
              shape_.global_sequences() * shape_.seq_len + 1, " that ", batch_description(shape_),
              " needs");
  count_ = std::min(max_batches, available);
}

void ValidationBatches::fill(int64_t k, int rank, std::span<int32_t> inputs,
                             std::span<int32_t> labels) const {
  check_slice(shape_, rank, inputs, labels);
  FSDP_CHECK(k >= 0 && k < count_, "validation batch ", k, " outside [0, ", count_, ")");
  const int64_t first = k * shape_.global_sequences() + rank * shape_.batch;
  for (int64_t b = 0; b < shape_.batch; ++b)
    copy_window(*file_, first + b, shape_.seq_len, inputs.data() + b * shape_.seq_len,
                labels.data() + b * shape_.seq_len);
}

namespace {

template <typename T>
double entropy_of(std::span<const T> tokens, int64_t vocab) {
  FSDP_CHECK(vocab >= 1 && vocab <= kMaxVocab, "vocab ", vocab, " out of range");
  if (tokens.empty()) return 0;
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (T t : tokens) {
    FSDP_CHECK(static_cast<int64_t>(t) < vocab, "token ", t, " >= vocab ", vocab);
    ++counts[t];
  }
  const double n = static_cast<double>(tokens.size());
  double h = 0;
  for (int64_t c : counts)
    if (c > 0) h -= (c / n) * std::log(c / n);
  return h;
}

template <typename T>
double cross_entropy_of(std::span<const T> fit, std::span<const T> eval, int64_t vocab) {
  FSDP_CHECK(vocab >= 1 && vocab <= kMaxVocab, "vocab ", vocab, " out of range");
  if (eval.empty()) return 0;
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  for (T t : fit) {
    FSDP_CHECK(static_cast<int64_t>(t) < vocab, "token ", t, " >= vocab ", vocab);
    ++counts[t];
  }
  const double denom = static_cast<double>(fit.size() + vocab);
  double h = 0;
  for (T t : eval) {
    FSDP_CHECK(static_cast<int64_t>(t) < vocab, "token ", t, " >= vocab ", vocab);
    h -= std::log((counts[t] + 1) / denom);
  }
  return h / static_cast<double>(eval.size());
}

}  // namespace

double unigram_entropy_nats(std::span<const uint16_t> tokens) {
  return entropy_of(tokens, kMaxTokenFileVocab);
}

double unigram_entropy_nats(std::span<const uint32_t> tokens, int64_t vocab) {
  return entropy_of(tokens, vocab);
}

double unigram_cross_entropy_nats(std::span<const uint16_t> fit, std::span<const uint16_t> eval,
                                  int64_t vocab) {
  return cross_entropy_of(fit, eval, vocab);
}

double unigram_cross_entropy_nats(std::span<const uint32_t> fit, std::span<const uint32_t> eval,
                                  int64_t vocab) {
  return cross_entropy_of(fit, eval, vocab);
}

}  // namespace fsdp::data
