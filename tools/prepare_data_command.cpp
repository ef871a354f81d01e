// `fsdp prepare-data`: text in, tokenizer and llm.c token files out (docs/data.md).
//
// Note [Tokenizer settings]
// SentencePiece BPE, set up so that decoding gives back the exact text: identity
// normalization, whitespace kept as it is (no extra-space removal, no dummy prefix), byte
// fallback for characters outside the vocabulary, and "\n" as a user-defined piece, so a whole
// file encodes in one call with its line breaks. Each file part (its train or val share)
// starts with <s>, which marks document boundaries the way llm.c's scripts use EOT.
#include "prepare_data_command.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>

#include "fsdp/data.h"
#include "fsdp/error.h"
#include "io/file_io.h"

#ifdef FSDP_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace fsdp::tools {

CLI::App* add_prepare_data_command(CLI::App& app, PrepareDataOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "prepare-data", "train a SentencePiece BPE tokenizer on text files and write llm.c token "
                      "files (tokenizer.model, train.bin, val.bin, meta.json)");
  cmd->add_option("--input", o.inputs, "UTF-8 text files (each one document)")->required();
  cmd->add_option("--out", o.out_dir, "output directory (created if missing)")->required();
  cmd->add_option("--vocab", o.vocab, "vocabulary size, 260..65536 (uint16 tokens)")->required();
  cmd->add_option("--val-fraction", o.val_fraction,
                  "share of each file (its last lines) that goes to val.bin, 0..0.5")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed of the tokenizer's line sampling")->capture_default_str();
  cmd->add_option("--max-training-lines", o.max_training_lines,
                  "the tokenizer trains on at most this many lines (sampled)")
      ->capture_default_str();
  cmd->add_flag("--quiet", o.quiet, "no progress lines");
  return cmd;
}

#ifndef FSDP_WITH_SENTENCEPIECE

int run_prepare_data(const PrepareDataOptions&) {
  FSDP_USER_FAIL("prepare-data is not in this build: SentencePiece was not found when it was "
            "configured (install libsentencepiece-dev and re-run cmake)");
}

#else

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Document {
  std::string train, val;
};

// Prints a progress line (stdout, flushed so long steps show as they happen).
struct Progress {
  bool quiet;
  template <typename... Parts>
  void operator()(const Parts&... parts) const {
    if (quiet) return;
    std::printf("prepare-data: %s\n", detail::concat(parts...).c_str());
    std::fflush(stdout);
  }
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fixed(double value, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string megabytes(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  return buf;
}

// Inputs are read whole (the tokenizer trains on their lines): regular files (Note [Reading
// files]) of at most 16 GiB each.
constexpr uint64_t kMaxInputBytes = uint64_t{16} << 30;

std::string read_input(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) FSDP_USER_FAIL("prepare-data: input ", path, " does not exist");
  if (fs::is_directory(path, ec)) FSDP_USER_FAIL("prepare-data: input ", path, " is a directory");
  try {
    return io::read_bounded_file(path, kMaxInputBytes, "an input of prepare-data");
  } catch (const UserError& e) {
    FSDP_USER_FAIL("prepare-data: ", e.what());
  }
}

// The last `fraction` of a file, cut at the first line break at or after that point.
Document split_document(std::string text, double fraction) {
  Document d;
  if (fraction > 0) {
    const size_t target =
        static_cast<size_t>(std::floor(static_cast<double>(text.size()) * (1.0 - fraction)));
    const size_t newline = text.find('\n', target == 0 ? 0 : target - 1);
    if (newline != std::string::npos && newline + 1 < text.size()) {
      d.val = text.substr(newline + 1);
      text.resize(newline + 1);
    }
  }
  d.train = std::move(text);
  return d;
}

// Creates `dir` and proves it writable before the long work starts.
void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    FSDP_USER_FAIL("prepare-data: --out ", dir, " exists and is not a directory");
  fs::create_directories(dir, ec);
  if (ec) FSDP_USER_FAIL("prepare-data: cannot create --out ", dir, ": ", ec.message());
  const fs::path probe = fs::path(dir) / ".prepare-data-probe";
  std::ofstream out(probe);
  if (!out) FSDP_USER_FAIL("prepare-data: --out ", dir, " is not writable");
  out.close();
  fs::remove(probe, ec);
}

// Non-empty lines of the train parts, for the tokenizer's trainer.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<Document>& docs) : docs_(docs) { advance(); }
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
  const std::vector<Document>& docs_;
  size_t doc_ = 0, pos_ = 0;
  std::string line_;
};

void check_status(const sentencepiece::util::Status& s, const char* what) {
  if (!s.ok()) {
    std::string msg = s.ToString();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    FSDP_USER_FAIL("prepare-data: ", what, ": ", msg);
  }
}

std::string train_tokenizer(const std::vector<Document>& docs, const PrepareDataOptions& o) {
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
  check_status(sentencepiece::SentencePieceTrainer::Train(args, &lines, &model),
               "SentencePiece could not train the tokenizer");
  return model;
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  io::write_file_atomic(path.string(), bytes);  // Note [Atomic files], Note [Output paths]
}

// One part's tokens, <s> first; nothing for an empty part.
std::vector<uint16_t> encode_part(const sentencepiece::SentencePieceProcessor& sp,
                                  const std::string& text) {
  std::vector<uint16_t> out;
  if (text.empty()) return out;
  std::vector<int> ids;
  check_status(sp.Encode(text, &ids), "SentencePiece could not encode the text");
  out.reserve(ids.size() + 1);
  out.push_back(static_cast<uint16_t>(sp.bos_id()));
  for (int id : ids) out.push_back(static_cast<uint16_t>(id));
  return out;
}

struct EncodedParts {
  std::vector<std::vector<uint16_t>> train, val;
};

// Encodes every document on all cores (SentencePieceProcessor::Encode is const), each thread
// taking documents i, i + threads, ...; the results keep the documents' order.
EncodedParts encode_documents(const sentencepiece::SentencePieceProcessor& sp,
                              const std::vector<Document>& docs, const Progress& progress) {
  EncodedParts parts{std::vector<std::vector<uint16_t>>(docs.size()),
                     std::vector<std::vector<uint16_t>>(docs.size())};
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  std::atomic<size_t> done{0};
  std::mutex error_mutex;
  std::string error;
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (size_t i = t; i < docs.size(); i += threads) {
          parts.train[i] = encode_part(sp, docs[i].train);
          parts.val[i] = encode_part(sp, docs[i].val);
          const size_t n = ++done;
          // Ten progress lines at most, printed by whichever thread crosses each tenth.
          if (n < docs.size() && n * 10 / docs.size() != (n - 1) * 10 / docs.size())
            progress("encoding: ", n, " of ", docs.size(), " files");
        }
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.empty()) error = e.what();
      }
    });
  for (std::thread& t : pool) t.join();
  if (!error.empty()) throw Error(error);
  return parts;
}

}  // namespace

int run_prepare_data(const PrepareDataOptions& o) {
  const Progress progress{o.quiet};
  if (o.vocab < kMinPrepareVocab || o.vocab > data::kMaxTokenFileVocab)
    FSDP_USER_FAIL("prepare-data: --vocab ", o.vocab, " is outside ", kMinPrepareVocab, "..",
              data::kMaxTokenFileVocab, " (256 byte pieces + 4 special need ", kMinPrepareVocab,
              "; tokens are uint16)");
  if (!(o.val_fraction >= 0 && o.val_fraction <= 0.5))
    FSDP_USER_FAIL("prepare-data: --val-fraction ", o.val_fraction, " is outside 0..0.5");
  if (o.max_training_lines < 1)
    FSDP_USER_FAIL("prepare-data: --max-training-lines must be at least 1");
  prepare_out_dir(o.out_dir);

  std::vector<Document> docs;
  size_t train_bytes = 0, val_bytes = 0;
  for (const std::string& path : o.inputs) {
    docs.push_back(split_document(read_input(path), o.val_fraction));
    train_bytes += docs.back().train.size();
    val_bytes += docs.back().val.size();
  }
  const bool all_blank = std::all_of(docs.begin(), docs.end(), [](const Document& d) {
    return (d.train + d.val).find_first_not_of(" \t\r\n") == std::string::npos;
  });
  if (all_blank)
    FSDP_USER_FAIL("prepare-data: the corpus is empty (", o.inputs.size(), " files with no text)");
  if (o.val_fraction > 0 && val_bytes == 0)
    FSDP_USER_FAIL("prepare-data: --val-fraction ", o.val_fraction,
              " leaves no validation text (the files have too few lines)");
  progress("read ", o.inputs.size(), " files, ", megabytes(train_bytes + val_bytes), " (train ",
           megabytes(train_bytes), ", val ", megabytes(val_bytes), ")");

  auto t0 = Clock::now();
  progress("training a SentencePiece BPE tokenizer of ", o.vocab, " pieces on the train text");
  const std::string model = train_tokenizer(docs, o);
  progress("tokenizer trained in ", fixed(seconds_since(t0), 1), " s");
  const fs::path dir(o.out_dir);
  write_bytes(dir / "tokenizer.model", model);

  sentencepiece::SentencePieceProcessor sp;
  check_status(sp.LoadFromSerializedProto(model), "cannot load the trained tokenizer");
  FSDP_USER_CHECK(sp.GetPieceSize() == o.vocab, "the tokenizer has ", sp.GetPieceSize(),
             " pieces, not ", o.vocab);

  t0 = Clock::now();
  const EncodedParts parts = encode_documents(sp, docs, progress);
  std::vector<uint16_t> train, val;
  for (const std::vector<uint16_t>& p : parts.train) train.insert(train.end(), p.begin(), p.end());
  for (const std::vector<uint16_t>& p : parts.val) val.insert(val.end(), p.begin(), p.end());
  progress("encoded in ", fixed(seconds_since(t0), 1), " s: ", train.size(), " train tokens, ",
           val.size(), " val tokens (", fixed(static_cast<double>(train_bytes + val_bytes) /
           static_cast<double>(train.size() + val.size()), 2), " bytes per token)");
  data::write_token_file((dir / "train.bin").string(), train);
  data::write_token_file((dir / "val.bin").string(), val);

  std::vector<uint16_t> all = train;
  all.insert(all.end(), val.begin(), val.end());
  data::CorpusMeta meta;
  meta.vocab = o.vocab;
  meta.train_tokens = static_cast<int64_t>(train.size());
  meta.val_tokens = static_cast<int64_t>(val.size());
  meta.unigram_entropy_nats = data::unigram_entropy_nats(all);
  meta.unigram_entropy_bits = meta.unigram_entropy_nats / std::log(2.0);
  meta.val_unigram_cross_entropy_nats =
      data::unigram_cross_entropy_nats(train, val, o.vocab);
  data::write_corpus_meta((dir / "meta.json").string(), meta);
  progress("unigram entropy of the corpus: ", fixed(meta.unigram_entropy_nats, 4), " nats (",
           fixed(meta.unigram_entropy_bits, 4), " bits) per token; val under the train unigram: ",
           fixed(meta.val_unigram_cross_entropy_nats, 4), " nats");
  progress("wrote ", (dir / "tokenizer.model").string(), ", train.bin, val.bin, meta.json");
  return 0;
}

#endif  // FSDP_WITH_SENTENCEPIECE

}  // namespace fsdp::tools
