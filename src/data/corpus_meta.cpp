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
  j["token_dtype"] = token_dtype_name(m.token_dtype);
  j["tokenizer"] = m.tokenizer;
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
  m.vocab = j["vocab"].integer(1, kMaxVocab);
  m.train_tokens = j["train_tokens"].integer(0, kMaxTokens);
  m.val_tokens = j["val_tokens"].integer(0, kMaxTokens);
  m.unigram_entropy_nats = j["unigram_entropy_nats"].number();
  m.unigram_entropy_bits = j["unigram_entropy_bits"].number();
  m.val_unigram_cross_entropy_nats = j["val_unigram_cross_entropy_nats"].number();
  // Absent in a meta.json from before uint32 files and model tokenizers: uint16 and
  // tokenizer.model, which is what such a directory holds.
  if (const std::optional<io::JsonField> dtype = j.find("token_dtype")) {
    const std::string name = dtype->string(16);
    if (name == "uint16") {
      m.token_dtype = TokenDtype::kUint16;
    } else if (name == "uint32") {
      m.token_dtype = TokenDtype::kUint32;
    } else {
      dtype->fail("must be \"uint16\" or \"uint32\", not \"" + io::printable(name) + "\"");
    }
  }
  if (const std::optional<io::JsonField> tok = j.find("tokenizer")) {
    // A file beside meta.json, by its name alone.
    m.tokenizer = tok->string(255);
    if (m.tokenizer.empty() || m.tokenizer.find('/') != std::string::npos ||
        m.tokenizer == "." || m.tokenizer == "..")
      tok->fail("must name a file in the corpus directory, not \"" + io::printable(m.tokenizer) +
                "\"");
  }
  return m;
}

}  // namespace fsdp::data
