// `fsdp prepare-data --vocab N`: the SentencePiece BPE that it trains on the text.
//
// Note [Tokenizer settings]
// SentencePiece BPE, set up so that decoding gives back the exact text: identity
// normalization, whitespace kept as it is (no extra-space removal, no dummy prefix), byte
// fallback for characters outside the vocabulary, and "\n" as a user-defined piece, so a whole
// file encodes in one call with its line breaks. Each file part (its train or val share)
// starts with <s>, which marks document boundaries the way llm.c's scripts use EOT.
#include <algorithm>
#include <thread>
#include <unordered_map>

#include "fsdp/error.h"
#include "tools/prepare_data_command.h"

#ifdef FSDP_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace fsdp::tools {

#ifndef FSDP_WITH_SENTENCEPIECE

std::string train_sentencepiece(const std::vector<PrepareDocument>&, const PrepareDataOptions&) {
  FSDP_USER_FAIL(
      "prepare-data: training a tokenizer (--vocab) is not in this build: "
      "SentencePiece was not found when it was configured (install "
      "libsentencepiece-dev and re-run cmake), or give a model's --tokenizer");
}

#else

namespace {

// Non-empty lines of the train parts, for the tokenizer's trainer.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<PrepareDocument>& docs) : docs_(docs) { advance(); }
  bool done() const override { return doc_ >= docs_.size(); }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (doc_ < docs_.size()) {
      const std::string& text = docs_[doc_].train;
      if (pos_ >= text.size()) {
        ++doc_;
        pos_ = 0;
        continue;
      }
      size_t end = text.find('\n', pos_);
      if (end == std::string::npos) end = text.size();
      line_.assign(text, pos_, end - pos_);
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
  }
  const std::vector<PrepareDocument>& docs_;
  size_t doc_ = 0, pos_ = 0;
  std::string line_;
};

}  // namespace

std::string train_sentencepiece(const std::vector<PrepareDocument>& docs,
                                const PrepareDataOptions& o) {
  const unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  // Note [Tokenizer settings].
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(o.vocab)},
      {"character_coverage", "0.9999"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"user_defined_symbols", "\n"},
      {"input_sentence_size", std::to_string(o.max_training_lines)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", "16384"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "2"},  // SentencePiece's own INFO lines; ours say what is going on
  };
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(o.seed % 0xFFFFFFFFull));
  LineIterator lines(docs);
  std::string model;
  const sentencepiece::util::Status s =
      sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!s.ok()) {
    std::string msg = s.ToString();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    FSDP_USER_FAIL("prepare-data: SentencePiece could not train the tokenizer: ", msg);
  }
  return model;
}

#endif  // FSDP_WITH_SENTENCEPIECE

}  // namespace fsdp::tools
