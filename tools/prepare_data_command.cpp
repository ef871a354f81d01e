// `fsdp prepare-data`: text in, llm.c token files out, with a tokenizer trained on the text
// (Note [Tokenizer settings] in prepare_data_train.cpp) or a model's own (src/tokenizer/).
//
// Note [Document boundaries]
// Each file part (a file's train or val share) is encoded with the tokenizer's own special
// tokens, as Hugging Face's `tokenizer(text)` does: <s> first for SentencePiece (ours, Llama 2,
// Mistral), the post-processor template's tokens for a tokenizer.json (Llama 3:
// <|begin_of_text|> first), the way llm.c's scripts start documents. A tokenizer that adds
// none (Qwen2.5) gets its eos_token after each part instead, so documents stay apart; one
// with neither is refused.
#include "prepare_data_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "fsdp/data.h"
#include "fsdp/error.h"
#include "io/file_io.h"
#include "tokenizer/tokenizer.h"
#include "tools/cli_validators.h"

namespace fsdp::tools {

CLI::App* add_prepare_data_command(CLI::App& app, PrepareDataOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("prepare-data",
                         "tokenize text files into llm.c token files, with a SentencePiece BPE "
                         "trained on them (--vocab) or a model's own tokenizer (--tokenizer)");
  cmd->add_option("--input", o.inputs, "UTF-8 text files (each one document)")->required();
  cmd->add_option("--out", o.out_dir, "output directory (created if missing)")->required();
  CLI::Option* vocab =
      cmd->add_option("--vocab", o.vocab, "train a tokenizer of this many pieces, 260..65536");
  CLI::Option* tokenizer =
      cmd->add_option("--tokenizer", o.tokenizer,
                      "use a model's tokenizer: a tokenizer.json (Hugging Face), a "
                      "SentencePiece tokenizer.model, or a directory holding one");
  cmd->add_option("--token-dtype", o.token_dtype,
                  "token files' layout: uint16, uint32 (llm.c's Llama 3 layout), or auto: "
                  "uint16 when every id fits (vocabulary <= 65536)")
      ->check(CLI::IsMember({"auto", "uint16", "uint32"}))
      ->capture_default_str();
  cmd->add_option("--val-fraction", o.val_fraction,
                  "share of each file (its last lines) that goes to val.bin, 0..0.5")
      ->capture_default_str();
  CLI::Option* seed = cmd->add_option("--seed", o.seed, "seed of the tokenizer's line sampling")
                          ->check(uint64_text())
                          ->capture_default_str();
  CLI::Option* lines = cmd->add_option("--max-training-lines", o.max_training_lines,
                                       "the tokenizer trains on at most this many lines (sampled)")
                           ->capture_default_str();
  // Training settings mean nothing with a given tokenizer: refused, not ignored.
  tokenizer->excludes(vocab)->excludes(seed)->excludes(lines);
  cmd->add_flag("--quiet", o.quiet, "no progress lines");
  return cmd;
}

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Tokens = std::vector<uint32_t>;

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
PrepareDocument split_document(std::string text, double fraction) {
  PrepareDocument d;
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
  // A file of our own, made here: never one that was there (a FIFO would block the open, a
  // symlink would truncate what it names; Note [Output paths]).
  const std::string probe = (fs::path(dir) / ".prepare-data-probe-").string() + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    FSDP_USER_FAIL("prepare-data: --out ", dir, " is not writable: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  io::write_file_atomic(path.string(), bytes);  // Note [Atomic files], Note [Output paths]
}

data::TokenDtype choose_dtype(const std::string& flag, int64_t vocab) {
  if (flag == "uint32") return data::TokenDtype::kUint32;
  if (flag == "uint16") {
    FSDP_USER_CHECK(vocab <= data::kMaxTokenFileVocab,
                    "prepare-data: --token-dtype uint16 "
                    "cannot hold the ids of a vocabulary of ",
                    vocab, " (at most ", data::kMaxTokenFileVocab, "); use uint32 or auto");
    return data::TokenDtype::kUint16;
  }
  return data::token_dtype_for_vocab(vocab);
}

// How each part is marked (Note [Document boundaries]).
struct PartMarks {
  Tokens end;  // after the part: the eos_token when the tokenizer adds no tokens itself
};

PartMarks part_marks(const tokenizer::Tokenizer& tok, const std::string& name) {
  if (!tok.encode("", true).empty()) return {};
  const std::optional<uint32_t> eos = tok.eos_id();
  FSDP_USER_CHECK(eos.has_value(), "prepare-data: ", name,
                  " adds no special tokens to a text "
                  "and names no eos_token (for a tokenizer.json: in tokenizer_config.json "
                  "beside it), so the documents would run together unmarked");
  return {{*eos}};
}

// One part's tokens (Note [Document boundaries]); nothing for an empty part.
Tokens encode_part(const tokenizer::Tokenizer& tok, const PartMarks& marks,
                   const std::string& text) {
  if (text.empty()) return {};
  Tokens out = tok.encode(text, true);
  out.insert(out.end(), marks.end.begin(), marks.end.end());
  return out;
}

struct EncodedParts {
  std::vector<Tokens> train, val;
};

// Encodes every document on all cores (Tokenizer::encode is safe from several threads), each
// thread taking documents i, i + threads, ...; the results keep the documents' order.
EncodedParts encode_documents(const tokenizer::Tokenizer& tok, const PartMarks& marks,
                              const std::vector<PrepareDocument>& docs,
                              const std::vector<std::string>& paths, const Progress& progress) {
  EncodedParts parts{std::vector<Tokens>(docs.size()), std::vector<Tokens>(docs.size())};
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  std::atomic<size_t> done{0};
  std::mutex error_mutex;
  std::string error;
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      size_t i = t;
      try {
        for (; i < docs.size(); i += threads) {
          parts.train[i] = encode_part(tok, marks, docs[i].train);
          parts.val[i] = encode_part(tok, marks, docs[i].val);
          const size_t n = ++done;
          // Ten progress lines at most, printed by whichever thread crosses each tenth.
          if (n < docs.size() && n * 10 / docs.size() != (n - 1) * 10 / docs.size())
            progress("encoding: ", n, " of ", docs.size(), " files");
        }
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (error.empty()) error = "prepare-data: input " + paths[i] + ": " + e.what();
      }
    });
  for (std::thread& t : pool) t.join();
  if (!error.empty()) throw UserError(error);
  return parts;
}

Tokens concatenated(const std::vector<Tokens>& parts) {
  size_t n = 0;
  for (const Tokens& p : parts) n += p.size();
  Tokens all;
  all.reserve(n);
  for (const Tokens& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// The marks, readable: "<|begin_of_text|> first" / "<|endoftext|> last".
std::string describe_marks(const tokenizer::Tokenizer& tok, const PartMarks& marks) {
  const Tokens specials = tok.encode("", true);
  if (!specials.empty()) return "the tokenizer's own '" + tok.decode(specials) + "' in each part";
  return "'" + tok.decode(marks.end) + "' after each part";
}

}  // namespace

int run_prepare_data(const PrepareDataOptions& o) {
  const Progress progress{o.quiet};
  const bool train = o.tokenizer.empty();
  if (train && o.vocab == 0)
    FSDP_USER_FAIL(
        "prepare-data: give --vocab N (train a tokenizer on the text) or --tokenizer "
        "FILE (a model's tokenizer.json or tokenizer.model)");
  if (train && (o.vocab < kMinPrepareVocab || o.vocab > data::kMaxTokenFileVocab))
    FSDP_USER_FAIL("prepare-data: --vocab ", o.vocab, " is outside ", kMinPrepareVocab, "..",
                   data::kMaxTokenFileVocab, " (256 byte pieces + 4 special need ",
                   kMinPrepareVocab, "; a trained tokenizer's ids are uint16)");
  if (!(o.val_fraction >= 0 && o.val_fraction <= 0.5))
    FSDP_USER_FAIL("prepare-data: --val-fraction ", o.val_fraction, " is outside 0..0.5");
  if (o.max_training_lines < 1)
    FSDP_USER_FAIL("prepare-data: --max-training-lines must be at least 1");
  // A given tokenizer is read (and refused, if it must be) before the long work.
  tokenizer::LoadedTokenizer loaded;
  PartMarks marks;
  if (!train) {
    loaded = tokenizer::load_tokenizer(o.tokenizer);
    marks = part_marks(*loaded.tokenizer, o.tokenizer);
    choose_dtype(o.token_dtype, loaded.tokenizer->vocab_size());
  }
  prepare_out_dir(o.out_dir);

  std::vector<PrepareDocument> docs;
  size_t train_bytes = 0, val_bytes = 0;
  for (const std::string& path : o.inputs) {
    std::string text = read_input(path);
    if (loaded.is_tokenizer_json)
      if (const size_t bad = tokenizer::invalid_utf8_offset(text); bad != std::string::npos)
        FSDP_USER_FAIL("prepare-data: input ", path, " is not UTF-8: byte ", bad,
                       " starts no character (a tokenizer.json tokenizer reads UTF-8 text)");
    docs.push_back(split_document(std::move(text), o.val_fraction));
    train_bytes += docs.back().train.size();
    val_bytes += docs.back().val.size();
  }
  const bool all_blank = std::all_of(docs.begin(), docs.end(), [](const PrepareDocument& d) {
    return (d.train + d.val).find_first_not_of(" \t\r\n") == std::string::npos;
  });
  if (all_blank)
    FSDP_USER_FAIL("prepare-data: the corpus is empty (", o.inputs.size(), " files with no text)");
  if (o.val_fraction > 0 && val_bytes == 0)
    FSDP_USER_FAIL("prepare-data: --val-fraction ", o.val_fraction,
                   " leaves no validation text (the files have too few lines)");
  progress("read ", o.inputs.size(), " files, ", megabytes(train_bytes + val_bytes), " (train ",
           megabytes(train_bytes), ", val ", megabytes(val_bytes), ")");

  const fs::path dir(o.out_dir);
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::string tokenizer_file;
  if (train) {
    const auto t0 = Clock::now();
    progress("training a SentencePiece BPE tokenizer of ", o.vocab, " pieces on the train text");
    const std::string model = train_sentencepiece(docs, o);
    progress("tokenizer trained in ", fixed(seconds_since(t0), 1), " s");
    write_bytes(dir / "tokenizer.model", model);
    tok = tokenizer::tokenizer_from_sentencepiece(model, "the trained tokenizer");
    FSDP_USER_CHECK(tok->vocab_size() == o.vocab, "the tokenizer has ", tok->vocab_size(),
                    " pieces, not ", o.vocab);
    tokenizer_file = "tokenizer.model";
  } else {
    tok = std::move(loaded.tokenizer);
    for (const auto& [name, bytes] : loaded.files) write_bytes(dir / name, bytes);
    tokenizer_file = loaded.files.front().first;
  }
  const int64_t vocab = tok->vocab_size();
  const data::TokenDtype dtype = choose_dtype(o.token_dtype, vocab);
  if (train) marks = part_marks(*tok, "the trained tokenizer");
  if (!train)
    progress("tokenizer ", o.tokenizer, ": ", tok->description(), ", ", vocab, " ids; ",
             describe_marks(*tok, marks));

  const auto t0 = Clock::now();
  const EncodedParts parts = encode_documents(*tok, marks, docs, o.inputs, progress);
  const Tokens train_ids = concatenated(parts.train), val_ids = concatenated(parts.val);
  progress("encoded in ", fixed(seconds_since(t0), 1), " s: ", train_ids.size(), " train tokens, ",
           val_ids.size(), " val tokens (",
           fixed(static_cast<double>(train_bytes + val_bytes) /
                     static_cast<double>(train_ids.size() + val_ids.size()),
                 2),
           " bytes per token), ", data::token_dtype_name(dtype), " token files");
  data::write_token_file((dir / "train.bin").string(), train_ids, dtype);
  data::write_token_file((dir / "val.bin").string(), val_ids, dtype);

  Tokens all = train_ids;
  all.insert(all.end(), val_ids.begin(), val_ids.end());
  data::CorpusMeta meta;
  meta.vocab = vocab;
  meta.train_tokens = static_cast<int64_t>(train_ids.size());
  meta.val_tokens = static_cast<int64_t>(val_ids.size());
  meta.unigram_entropy_nats = data::unigram_entropy_nats(all, vocab);
  meta.unigram_entropy_bits = meta.unigram_entropy_nats / std::log(2.0);
  meta.val_unigram_cross_entropy_nats = data::unigram_cross_entropy_nats(train_ids, val_ids, vocab);
  meta.token_dtype = dtype;
  meta.tokenizer = tokenizer_file;
  data::write_corpus_meta((dir / "meta.json").string(), meta);
  progress("unigram entropy of the corpus: ", fixed(meta.unigram_entropy_nats, 4), " nats (",
           fixed(meta.unigram_entropy_bits, 4), " bits) per token; val under the train unigram: ",
           fixed(meta.val_unigram_cross_entropy_nats, 4), " nats");
  std::string written;
  if (train) written = "tokenizer.model, ";
  for (const auto& f : loaded.files) written += f.first + ", ";
  progress("wrote ", (dir / "train.bin").string(), ", val.bin, ", written, "meta.json");
  return 0;
}

}  // namespace fsdp::tools
