// The Split pre-tokenizer of a tokenizer.json, through PCRE2 (Debian's libpcre2-dev).
//
// Note [Split regex portability]
// Hugging Face's `tokenizers` runs a Split pattern with Oniguruma; here PCRE2 (UTF and UCP
// mode, JIT-compiled where the platform has it) runs it. The two agree on what Llama 3's and
// Qwen2.5's patterns use: \p{L}, \p{N} and other property classes, \s, \S, \d, \r, \n, \t,
// classes, lookahead and lookbehind, (?i:...), non-capturing groups, quantifiers. Where they
// differ (^ and $ match at every line in Oniguruma; \h is a hex digit there and \v a
// vertical tab; \w, \b and POSIX classes cover other characters; inline m, s and x flags mean
// other things), the pattern is refused in one line naming what it holds, before compiling.
// One known difference remains within the accepted set: PCRE2's \s also matches U+180E
// (MONGOLIAN VOWEL SEPARATOR), which is not white space since Unicode 6.3.
#pragma once

#include <functional>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace fsdp::tokenizer {

// Empty when `pattern` uses only constructs both engines read alike (Note [Split regex
// portability]); otherwise what it holds that they do not, for the message.
std::string unportable_construct(std::string_view pattern);

class RegexSplit {
 public:
  // `where` names the pattern in messages ("tokenizer.json: pre_tokenizer.pretokenizers[0]").
  // literal: a Split {"String": ...} pattern, matched as it is.
  RegexSplit(const std::string& pattern, bool literal, const std::string& where);
  ~RegexSplit();
  RegexSplit(const RegexSplit&) = delete;
  RegexSplit& operator=(const RegexSplit&) = delete;

  // What one thread needs to match (PCRE2's match data, a JIT stack large enough for long
  // runs of one class): made once per encode() call, used by every pattern in turn.
  class Scratch {
   public:
    Scratch();
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class RegexSplit;
    pcre2_real_match_data_8* match_ = nullptr;
    pcre2_real_match_context_8* context_ = nullptr;
    pcre2_real_jit_stack_8* stack_ = nullptr;
  };

  // The "Isolated" split of valid UTF-8 `text`: every match, and every stretch between
  // matches, in order, each non-empty. Empty matches split nothing. Safe from several
  // threads at once, each with its own scratch; `piece` may split again with the same one.
  void split(std::string_view text, Scratch& scratch,
             const std::function<void(std::string_view)>& piece) const;

 private:
  pcre2_real_code_8* code_ = nullptr;
  std::string where_;
};

}  // namespace fsdp::tokenizer
