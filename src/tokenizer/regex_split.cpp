// The Split pre-tokenizer through PCRE2 (Note [Split regex portability] in regex_split.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <pcre2.h>

#include <cctype>

#include "fsdp/error.h"
#include "tokenizer/unicode_text.h"

namespace fsdp::tokenizer {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// The escapes both engines read alike: classes \s \S \d \D, \p{..} \P{..}, and characters
// \r \n \t \f \e \a and \x.. (hex).
bool portable_escape(char c) {
  return std::string_view("sSdDpPrntfeax").find(c) != std::string_view::npos;
}

}  // namespace

std::string unportable_construct(std::string_view p) {
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return "a trailing backslash";
      const char e = p[i + 1];
      if (std::isalnum(static_cast<unsigned char>(e)) && !portable_escape(e))
        return std::string("the escape \\") + e;
      ++i;
      continue;
    }
    if (in_class) {
      if (c == '[') return "'[' inside a character class (a nested class or a POSIX class)";
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&')
        return "'&&' inside a character class (an intersection in Oniguruma)";
      if (c == ']' && i > class_start) in_class = false;
      continue;
    }
    if (c == '[') {
      in_class = true;
      class_start = i + 1;
      if (class_start < p.size() && p[class_start] == '^') ++class_start;
      if (class_start < p.size() && p[class_start] == ']')
        return "a character class that starts with ']'";
      continue;
    }
    if (c == '^' || c == '$')
      return std::string("the anchor '") + c + "' (line anchors in Oniguruma)";
    if (c == '(' && i + 1 < p.size() && p[i + 1] == '?') {
      const std::string_view rest = p.substr(i + 2);
      if (rest.starts_with(":") || rest.starts_with("=") || rest.starts_with("!") ||
          rest.starts_with(">") || rest.starts_with("<=") || rest.starts_with("<!"))
        continue;
      if (rest.starts_with("i:") || rest.starts_with("i)") || rest.starts_with("-i:") ||
          rest.starts_with("-i)"))
        continue;
      return "the group '(?" + std::string(rest.substr(0, 3)) +
             "...' (only (?:, (?=, (?!, (?<=, (?<!, (?> and (?i are read alike)";
    }
  }
  if (in_class) return "an unterminated character class";
  return "";
}

RegexSplit::RegexSplit(const std::string& pattern, bool literal, const std::string& where)
    : where_(where) {
  FSDP_USER_CHECK(static_cast<int64_t>(pattern.size()) <= 8192, where, ": the pattern has ",
                  pattern.size(), " bytes, more than the 8192 this reader takes");
  FSDP_USER_CHECK(invalid_utf8_offset(pattern) == std::string_view::npos, where,
                  ": the pattern is not valid UTF-8");
  if (!literal) {
    const std::string bad = unportable_construct(pattern);
    FSDP_USER_CHECK(bad.empty(), where, ": the pattern holds ", bad,
                    ", which PCRE2 and Oniguruma (the `tokenizers` library's engine) read "
                    "differently; this reader refuses it");
  }
  int error = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                        &error, &offset, nullptr);
  if (code_ == nullptr)
    FSDP_USER_FAIL(where, ": PCRE2 cannot compile the pattern: ", pcre2_message(error),
                   " at offset ", offset);
  // JIT where the platform has it; the interpreter otherwise gives the same matches.
  (void)pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

RegexSplit::~RegexSplit() {
  pcre2_code_free(code_);
}

RegexSplit::Scratch::Scratch()
    : match_(pcre2_match_data_create(1, nullptr)),  // one pair: the whole match is enough
      context_(pcre2_match_context_create(nullptr)),
      stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
  FSDP_CHECK(match_ != nullptr && context_ != nullptr, "PCRE2 could not allocate its match data");
  if (stack_ != nullptr) pcre2_jit_stack_assign(context_, nullptr, stack_);
}

RegexSplit::Scratch::~Scratch() {
  pcre2_jit_stack_free(stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(match_);
}

void RegexSplit::split(std::string_view text, Scratch& scratch,
                       const std::function<void(std::string_view)>& piece) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t from = 0, last = 0;
  while (from <= text.size()) {
    // The text is valid UTF-8 (checked once by the caller), so PCRE2 need not check it again
    // at every match.
    const int rc = pcre2_match(code_, subject, text.size(), from, PCRE2_NO_UTF_CHECK,
                               scratch.match_, scratch.context_);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      FSDP_USER_FAIL(where_, ": the pattern failed on the text at byte ", from, ": ",
                     pcre2_message(rc));
    // Copied out before `piece` runs: it may match again with the same scratch.
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.match_);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match splits nothing: look again one character on
      if (begin >= text.size()) break;
      from = begin + utf8_char_length(static_cast<unsigned char>(text[begin]));
      continue;
    }
    if (begin > last) piece(text.substr(last, begin - last));
    piece(text.substr(begin, end - begin));
    last = from = end;
  }
  if (last < text.size()) piece(text.substr(last));
}

}  // namespace fsdp::tokenizer
