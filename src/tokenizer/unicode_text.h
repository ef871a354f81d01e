// UTF-8 checks and Unicode normalization for the tokenizer.json reader, through utf8proc.
#pragma once

#include <string>
#include <string_view>

namespace fsdp::tokenizer {

// The offset of the first byte that starts no well-formed UTF-8 character, or npos.
// (Declared in tokenizer.h too, for callers outside this folder.)
size_t invalid_utf8_offset(std::string_view text);

// Whether every byte is below 0x80 (such text is its own NFC).
bool is_ascii(std::string_view text);

// `text` (valid UTF-8) in Unicode Normalization Form C.
std::string nfc(std::string_view text);

// The length in bytes of the UTF-8 character that starts with `lead` (1 for a byte that
// starts none, so a scan always moves on).
inline size_t utf8_char_length(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

}  // namespace fsdp::tokenizer
