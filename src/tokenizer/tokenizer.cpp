// Loading a tokenizer from its files (src/tokenizer/tokenizer.h): the file checks, and the
// choice between tokenizer.json and a SentencePiece model.
#include "tokenizer/tokenizer.h"

#include <filesystem>

#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::tokenizer {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

LoadedTokenizer load_tokenizer(const std::string& given) {
  std::error_code ec;
  std::string path = given;
  if (fs::is_directory(path, ec)) {
    // A model's directory: its tokenizer.json, else its tokenizer.model.
    const fs::path dir(path);
    if (fs::exists(dir / "tokenizer.json", ec)) {
      path = (dir / "tokenizer.json").string();
    } else if (fs::exists(dir / "tokenizer.model", ec)) {
      path = (dir / "tokenizer.model").string();
    } else {
      FSDP_USER_FAIL("tokenizer directory ", given, " holds neither tokenizer.json nor "
                     "tokenizer.model");
    }
  }
  LoadedTokenizer out;
  if (ends_with(path, ".json")) {
    if (!reads_tokenizer_json())
      FSDP_USER_FAIL("tokenizer ", path,
                     ": this build does not read tokenizer.json files "
                     "(PCRE2 or utf8proc was not found when it was configured; install "
                     "libpcre2-dev and libutf8proc-dev and re-run cmake)");
    const std::string json = io::read_bounded_file(path, uint64_t{kMaxTokenizerFileBytes}, "a tokenizer file");
    // Hugging Face keeps bos_token and eos_token in tokenizer_config.json, beside it.
    const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
    std::string config;
    if (fs::exists(config_path, ec))
      config = io::read_bounded_file(config_path.string(), uint64_t{kMaxTokenizerConfigBytes},
                                 "the tokenizer's config");
    out.tokenizer = tokenizer_from_json(json, config, path);
    out.files.emplace_back("tokenizer.json", json);
    if (!config.empty()) out.files.emplace_back("tokenizer_config.json", config);
    out.is_tokenizer_json = true;
  } else if (ends_with(path, ".model")) {
    if (!reads_sentencepiece())
      FSDP_USER_FAIL("tokenizer ", path,
                     ": this build does not read SentencePiece models "
                     "(SentencePiece was not found when it was configured; install "
                     "libsentencepiece-dev and re-run cmake)");
    std::string model = io::read_bounded_file(path, uint64_t{kMaxTokenizerFileBytes}, "a tokenizer file");
    out.tokenizer = tokenizer_from_sentencepiece(model, path);
    out.files.emplace_back("tokenizer.model", std::move(model));
  } else {
    FSDP_USER_FAIL("tokenizer ", path,
                   ": expected a Hugging Face tokenizer.json (a name "
                   "ending in .json) or a SentencePiece model (ending in .model)");
  }
  return out;
}

}  // namespace fsdp::tokenizer
