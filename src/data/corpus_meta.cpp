// DIR/meta.json of `fsdp prepare-data`: the vocabulary, the token counts and the unigram
// entropy that training prints beside its validation loss.
#include <nlohmann/json.hpp>

#include "fsdp/data.h"
#include "fsdp/error.h"
#include "io/checked_json.h"
#include "io/file_io.h"

namespace fsdp::data {

namespace {
constexpr uint64_t kMaxCorpusMetaBytes = 1 << 20;  // ours are ~250 bytes
}  // namespace

void write_corpus_meta(const std::string& path, const CorpusMeta& m) {
  nlohmann::ordered_json j;
  j["vocab"] = m.vocab;
  j["train_tokens"] = m.train_tokens;
  j["val_tokens"] = m.val_tokens;
  j["unigram_entropy_nats"] = m.unigram_entropy_nats;
  j["unigram_entropy_bits"] = m.unigram_entropy_bits;
  j["val_unigram_cross_entropy_nats"] = m.val_unigram_cross_entropy_nats;
  io::write_file_atomic(path, j.dump(2) + "\n");  // Note [Atomic files], Note [Output paths]
}

CorpusMeta read_corpus_meta(const std::string& path) {
  // Note [Reading files], Note [Checked JSON].
  const io::JsonDocument doc =
      io::parse_json(io::read_bounded_file(path, kMaxCorpusMetaBytes, "a corpus's meta.json"), path);
  const io::JsonField j = doc.root();
  if (!j.is_object()) j.fail("must be an object (the corpus metadata of `fsdp prepare-data`)");
  constexpr int64_t kMaxTokens = int64_t{1} << 40;
  CorpusMeta m;
  m.vocab = j["vocab"].integer(1, kMaxTokenFileVocab);
  m.train_tokens = j["train_tokens"].integer(0, kMaxTokens);
  m.val_tokens = j["val_tokens"].integer(0, kMaxTokens);
  m.unigram_entropy_nats = j["unigram_entropy_nats"].number();
  m.unigram_entropy_bits = j["unigram_entropy_bits"].number();
  m.val_unigram_cross_entropy_nats = j["val_unigram_cross_entropy_nats"].number();
  return m;
}

}  // namespace fsdp::data
