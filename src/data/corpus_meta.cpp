// DIR/meta.json of `fsdp prepare-data`: the vocabulary, the token counts and the unigram
// entropy that training prints beside its validation loss.
#include <fstream>

#include <nlohmann/json.hpp>

#include "fsdp/data.h"
#include "fsdp/error.h"

namespace fsdp::data {

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
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) FSDP_USER_FAIL("cannot write ", path);
}

CorpusMeta read_corpus_meta(const std::string& path) {
  std::ifstream in(path);
  if (!in) FSDP_USER_FAIL(path, ": cannot open (prepare-data writes it beside train.bin)");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) FSDP_USER_FAIL(path, ": not a JSON object");
  CorpusMeta m;
  try {
    m.vocab = j.at("vocab").get<int64_t>();
    m.train_tokens = j.at("train_tokens").get<int64_t>();
    m.val_tokens = j.at("val_tokens").get<int64_t>();
    m.unigram_entropy_nats = j.at("unigram_entropy_nats").get<double>();
    m.unigram_entropy_bits = j.at("unigram_entropy_bits").get<double>();
    m.val_unigram_cross_entropy_nats = j.at("val_unigram_cross_entropy_nats").get<double>();
    // Absent in a meta.json from before uint32 files and model tokenizers: uint16 and
    // tokenizer.model, which is what such a directory holds.
    const std::string dtype = j.value("token_dtype", std::string("uint16"));
    if (dtype == "uint16") {
      m.token_dtype = TokenDtype::kUint16;
    } else if (dtype == "uint32") {
      m.token_dtype = TokenDtype::kUint32;
    } else {
      FSDP_USER_FAIL(path, ": token_dtype '", dtype, "' is neither uint16 nor uint32");
    }
    m.tokenizer = j.value("tokenizer", std::string("tokenizer.model"));
  } catch (const nlohmann::json::exception& e) {
    FSDP_USER_FAIL(path, ": bad corpus metadata: ", e.what());
  }
  FSDP_USER_CHECK(m.vocab >= 1 && m.vocab <= kMaxVocab, path, ": vocab ", m.vocab,
                  " is outside 1..", kMaxVocab);
  return m;
}

}  // namespace fsdp::data
