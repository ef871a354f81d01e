// `fsdp prepare-data --input FILE... --out DIR --vocab N [--val-fraction F]`: trains a
// SentencePiece BPE tokenizer on the text and writes DIR/tokenizer.model, DIR/train.bin,
// DIR/val.bin (llm.c token files) and DIR/meta.json (docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace fsdp::tools {

struct PrepareDataOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  int64_t vocab = 0;
  double val_fraction = 0.1;
  uint64_t seed = 1;
  // The tokenizer trains on at most this many lines, sampled with the seed.
  int64_t max_training_lines = 2'000'000;
  bool quiet = false;
};

// The smallest vocabulary prepare-data takes: 256 byte pieces (every character can fall back
// to UTF-8 bytes), <unk>, <s>, </s> and the newline piece. The corpus's characters need more;
// SentencePiece's own message then says how many.
inline constexpr int64_t kMinPrepareVocab = 260;

CLI::App* add_prepare_data_command(CLI::App& app, PrepareDataOptions& options);
int run_prepare_data(const PrepareDataOptions& options);

}  // namespace fsdp::tools
