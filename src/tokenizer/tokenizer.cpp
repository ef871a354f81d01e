// Loading a tokenizer from its files (src/tokenizer/tokenizer.h): the file checks, and the
// choice between tokenizer.json and a SentencePiece model.
#include "tokenizer/tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "fsdp/error.h"

namespace fsdp::tokenizer {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Closes the descriptor on every way out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_bounded_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    FSDP_USER_FAIL(what, " ", path, ": cannot open: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) FSDP_USER_FAIL(what, " ", path, ": not a regular file");
  if (st.st_size > max_bytes)
    FSDP_USER_FAIL(what, " ", path, ": ", st.st_size, " bytes, more than the ", max_bytes,
                   " this reader takes");
  const Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) FSDP_USER_FAIL(what, " ", path, ": cannot open: ", std::strerror(errno));
  // The size again, of what was opened (the path may have changed in between).
  if (::fstat(file.fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > max_bytes)
    FSDP_USER_FAIL(what, " ", path, ": changed while it was opened");
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(file.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) FSDP_USER_FAIL(what, " ", path, ": cannot read: ", std::strerror(errno));
    if (n == 0) FSDP_USER_FAIL(what, " ", path, ": shorter than its size while it was read");
    done += static_cast<size_t>(n);
  }
  return bytes;
}

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
      FSDP_USER_FAIL("--tokenizer ", given,
                     " is a directory with neither tokenizer.json nor "
                     "tokenizer.model");
    }
  }
  LoadedTokenizer out;
  if (ends_with(path, ".json")) {
    if (!reads_tokenizer_json())
      FSDP_USER_FAIL("--tokenizer ", path,
                     ": this build does not read tokenizer.json files "
                     "(PCRE2 or utf8proc was not found when it was configured; install "
                     "libpcre2-dev and libutf8proc-dev and re-run cmake)");
    const std::string json = read_bounded_file(path, kMaxTokenizerFileBytes, "--tokenizer");
    // Hugging Face keeps bos_token and eos_token in tokenizer_config.json, beside it.
    const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
    std::string config;
    if (fs::exists(config_path, ec))
      config = read_bounded_file(config_path.string(), kMaxTokenizerConfigBytes,
                                 "the tokenizer's config");
    out.tokenizer = tokenizer_from_json(json, config, path);
    out.files.emplace_back("tokenizer.json", json);
    if (!config.empty()) out.files.emplace_back("tokenizer_config.json", config);
    out.is_tokenizer_json = true;
  } else if (ends_with(path, ".model")) {
    if (!reads_sentencepiece())
      FSDP_USER_FAIL("--tokenizer ", path,
                     ": this build does not read SentencePiece models "
                     "(SentencePiece was not found when it was configured; install "
                     "libsentencepiece-dev and re-run cmake)");
    std::string model = read_bounded_file(path, kMaxTokenizerFileBytes, "--tokenizer");
    out.tokenizer = tokenizer_from_sentencepiece(model, path);
    out.files.emplace_back("tokenizer.model", std::move(model));
  } else {
    FSDP_USER_FAIL("--tokenizer ", path,
                   ": expected a Hugging Face tokenizer.json (a name "
                   "ending in .json) or a SentencePiece model (ending in .model)");
  }
  return out;
}

}  // namespace fsdp::tokenizer
