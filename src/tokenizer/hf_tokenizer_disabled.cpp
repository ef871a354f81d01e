// tokenizer.json support in a build without PCRE2 or utf8proc: each entry point fails in one
// line saying what to install (CMakeLists.txt compiles this file instead of hf_*.cpp).
#include "fsdp/error.h"
#include "tokenizer/tokenizer.h"

namespace fsdp::tokenizer {

bool reads_tokenizer_json() {
  return false;
}

std::unique_ptr<Tokenizer> tokenizer_from_json(std::string_view, std::string_view,
                                               const std::string& name) {
  FSDP_USER_FAIL(name,
                 ": this build does not read tokenizer.json files (PCRE2 or utf8proc was "
                 "not found when it was configured; install libpcre2-dev and libutf8proc-dev "
                 "and re-run cmake)");
}

size_t invalid_utf8_offset(std::string_view) {
  FSDP_FAIL("invalid_utf8_offset needs utf8proc, which this build lacks");
}

}  // namespace fsdp::tokenizer
