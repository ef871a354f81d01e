// `fsdp prepare-data --input FILE... --out DIR (--vocab N | --tokenizer FILE)`: trains a
// SentencePiece BPE tokenizer on the text (--vocab) or takes a model's own (--tokenizer: a
// tokenizer.json or a tokenizer.model), and writes DIR/train.bin and DIR/val.bin (llm.c token
// files, uint16 or uint32), the tokenizer's files and DIR/meta.json (docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace fsdp::tools {

struct PrepareDataOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  int64_t vocab = 0;      // train a tokenizer of this many pieces; 0 with --tokenizer
  std::string tokenizer;  // a model's own tokenizer instead
  std::string token_dtype = "auto";  // auto | uint16 | uint32
  double val_fraction = 0.1;
  uint64_t seed = 1;
  // The tokenizer trains on at most this many lines, sampled with the seed.
  int64_t max_training_lines = 2'000'000;
  bool quiet = false;
};

// The smallest vocabulary prepare-data trains: 256 byte pieces (every character can fall back
// to UTF-8 bytes), <unk>, <s>, </s> and the newline piece. The corpus's characters need more;
// SentencePiece's own message then says how many.
inline constexpr int64_t kMinPrepareVocab = 260;

// One input file, split into its train share and its val share (its last lines).
struct PrepareDocument {
  std::string train, val;
};

CLI::App* add_prepare_data_command(CLI::App& app, PrepareDataOptions& options);
int run_prepare_data(const PrepareDataOptions& options);

// Trains the SentencePiece BPE of Note [Tokenizer settings] on the train shares; the
// serialized model. Fails in one line in a build without SentencePiece.
std::string train_sentencepiece(const std::vector<PrepareDocument>& docs,
                                const PrepareDataOptions& options);

}  // namespace fsdp::tools
