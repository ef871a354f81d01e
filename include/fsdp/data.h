// Training data: llm.c token files, validated at open and read by windows, and the batch
// sampler that gives each rank its slice of each global batch (docs/data.md).
//
// Note [Batch sampler]
// A token file of N tokens holds n = (N - 1) / T windows of T + 1 tokens, window w starting at
// token w * T (inputs are its first T tokens, labels its last T). A global batch is
// G = world_size * B windows. Epoch e visits every window once in a seeded random order
// (Fisher-Yates driven by splitmix64, seeded from the seed and e); its steps take G windows at
// a time and drop the n % G left over. Step s is in epoch s / (n / G), so a batch depends on
// the seed and the step alone, and the same global batch comes out for any split of
// world_size * B. Rank r takes windows [r * B, (r + 1) * B) of the global batch.
// bench/llm_data.py (bench/torch_llama.py's reader) implements the same algorithm, bit for
// bit; docs/data.md spells it out.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace fsdp::data {

// llm.c's layouts (its dev/data/data_common.py): 256 little-endian int32 (magic, version, token
// count, then zeros), then the tokens. Two kinds, told apart by the magic:
//   uint16 tokens: magic 20240520, version 1 (GPT-2's layout; vocabularies up to 65,536)
//   uint32 tokens: magic 20240801, version 7 (Llama 3's layout; larger vocabularies)
inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int32_t kTokenFile32Magic = 20240801;
inline constexpr int32_t kTokenFile32Version = 7;
inline constexpr int64_t kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;
// uint16 tokens: a vocabulary of at most this many entries fits them.
inline constexpr int64_t kMaxTokenFileVocab = 65536;
// Any token file: batches hold int32 ids, so a vocabulary has at most 2^31 entries.
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;

enum class TokenDtype { kUint16, kUint32 };
// "uint16" / "uint32".
const char* token_dtype_name(TokenDtype dtype);
// The layout prepare-data writes by default: uint16 when every id fits (vocab <= 65,536).
TokenDtype token_dtype_for_vocab(int64_t vocab);

// Writes `tokens` to `path` in llm.c's uint16 layout (through a temporary file renamed at the
// end, so a failed write never leaves a valid-looking file). One-line error when it cannot.
void write_token_file(const std::string& path, std::span<const uint16_t> tokens);
// The same in the layout `dtype`; a token that does not fit uint16 is an internal error
// (the caller picks the layout from the vocabulary, token_dtype_for_vocab).
void write_token_file(const std::string& path, std::span<const uint32_t> tokens, TokenDtype dtype);

// A token file of either layout, open for reading. The constructor validates it; every failure
// is one line naming the file and the problem: not a regular file (Note [Reading files]), not
// a token file (magic), a version that does not go with the magic, truncated or overlong
// (size != header + token bytes * count), a token >= vocab, fewer than min_tokens tokens.
// Reads are preads, not a mapping: a file truncated while training would make a read of its
// mapping a SIGBUS, with no message; a pread that comes up short is a one-line error naming
// the file and its sizes, and every token read is checked against the vocabulary again (a
// file rewritten in place).
class TokenFile {
 public:
  // vocab: tokens must be below it (1..2^31). min_tokens: the fewest tokens a use needs
  // (one batch: B * T + 1); `purpose` names that use in the message ("one batch of 8 x 256").
  TokenFile(const std::string& path, int64_t vocab, int64_t min_tokens = 0,
            const std::string& purpose = "");
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }
  int64_t vocab() const { return vocab_; }
  TokenDtype dtype() const { return dtype_; }
  // Tokens [first, first + count) into `out`, of either layout; safe from any thread.
  void read(int64_t first, int64_t count, uint32_t* out) const;
  std::vector<uint32_t> read_all() const;
  uint32_t token(int64_t i) const;  // one read: for checks, not for loops

 private:
  std::string path_;
  int64_t vocab_ = 0;
  int64_t count_ = 0;
  TokenDtype dtype_ = TokenDtype::kUint16;
  struct Handle;  // the open file
  std::unique_ptr<Handle> handle_;
};

// The largest token in `tokens` (0 when empty). A branch-free max over the array, which the
// compiler vectorizes: one pass at memory bandwidth, used to check token < vocab at open.
uint16_t max_token(std::span<const uint16_t> tokens);
uint32_t max_token(std::span<const uint32_t> tokens);

// Where a sampler is: all a checkpoint needs to resume it. `epoch` is redundant with `step`
// (epoch = step / steps_per_epoch) and is kept so a resume on different data or batch shape
// is caught instead of silently reading other batches.
struct SamplerState {
  int64_t step = 0;
  int64_t epoch = 0;
};

struct BatchShape {
  int64_t batch = 1;    // sequences per rank (B)
  int64_t seq_len = 1;  // T
  int world_size = 1;   // W
  int64_t global_sequences() const { return batch * world_size; }
};

// The splitmix64 generator of Note [Batch sampler]: state += golden gamma, then the mix.
uint64_t splitmix64_next(uint64_t& state);
// Epoch e's order of n windows (Note [Batch sampler]).
std::vector<uint32_t> epoch_permutation(uint64_t seed, int64_t epoch, int64_t n);

// Training batches (Note [Batch sampler]). Inputs and labels are int32, [B * T] each, row b =
// sequence b. fill() and global_windows() are safe to call from several rank threads at once
// (the cached epoch permutation is shared under a lock); next() and restore() change the
// sampler's own position, so each rank thread that uses them needs its own sampler.
class BatchSampler {
 public:
  BatchSampler(std::shared_ptr<const TokenFile> file, const BatchShape& shape, uint64_t seed);

  int64_t windows() const { return windows_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  const BatchShape& shape() const { return shape_; }

  // The G window indices of global batch `step`, in order (rank r owns [r*B, (r+1)*B)).
  std::vector<int64_t> global_windows(int64_t step) const;
  // Rank `rank`'s inputs and labels of global batch `step`.
  void fill(int64_t step, int rank, std::span<int32_t> inputs, std::span<int32_t> labels) const;

  // Sequential use: fill the batch at state().step for `rank`, then advance.
  void next(int rank, std::span<int32_t> inputs, std::span<int32_t> labels);
  SamplerState state() const;
  // Resumes at state.step; fails (one line) when state.epoch does not match this data.
  void restore(const SamplerState& state);

 private:
  std::shared_ptr<const std::vector<uint32_t>> permutation(int64_t epoch) const;

  std::shared_ptr<const TokenFile> file_;
  BatchShape shape_;
  uint64_t seed_;
  int64_t windows_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t step_ = 0;
  mutable std::mutex cache_mutex_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::shared_ptr<const std::vector<uint32_t>> cached_permutation_;
};

// Validation batches: fixed, the first count() * G windows of the file in order (batch k is
// windows [k*G, (k+1)*G), rank r's slice as in training). count() = min(max_batches, n / G).
class ValidationBatches {
 public:
  ValidationBatches(std::shared_ptr<const TokenFile> file, const BatchShape& shape,
                    int64_t max_batches);
  int64_t count() const { return count_; }
  void fill(int64_t k, int rank, std::span<int32_t> inputs, std::span<int32_t> labels) const;

 private:
  std::shared_ptr<const TokenFile> file_;
  BatchShape shape_;
  int64_t count_ = 0;
};

// Copies window `w` (tokens [w*T, w*T + T + 1)) as inputs (first T) and labels (last T).
void copy_window(const TokenFile& file, int64_t window, int64_t seq_len, int32_t* inputs,
                 int32_t* labels);

// Unigram entropy of a token stream: H = -sum_v p_v ln p_v with p_v = count_v / N, in nats
// per token (divide by ln 2 for bits). The loss a model that ignores context can reach.
double unigram_entropy_nats(std::span<const uint16_t> tokens);
// The same for uint32 ids, every one < vocab.
double unigram_entropy_nats(std::span<const uint32_t> tokens, int64_t vocab);
// Cross-entropy of `eval` under the unigram distribution of `fit` (add-one smoothed over
// `vocab` entries so unseen tokens cost a finite amount), in nats per token.
double unigram_cross_entropy_nats(std::span<const uint16_t> fit, std::span<const uint16_t> eval,
                                  int64_t vocab);
double unigram_cross_entropy_nats(std::span<const uint32_t> fit, std::span<const uint32_t> eval,
                                  int64_t vocab);

// DIR/meta.json written by `fsdp prepare-data`.
struct CorpusMeta {
  int64_t vocab = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  double unigram_entropy_nats = 0, unigram_entropy_bits = 0;
  double val_unigram_cross_entropy_nats = 0;
  // The token files' layout and the tokenizer file beside them ("tokenizer.model",
  // "tokenizer.json"); a meta.json written before these keys existed reads as uint16 and
  // tokenizer.model, which is what it had.
  TokenDtype token_dtype = TokenDtype::kUint16;
  std::string tokenizer = "tokenizer.model";
};
void write_corpus_meta(const std::string& path, const CorpusMeta& meta);
CorpusMeta read_corpus_meta(const std::string& path);

}  // namespace fsdp::data
