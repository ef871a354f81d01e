// tokenizer_config.json, read beside a tokenizer.json: the bos_token and eos_token that the
// `transformers` library takes from it, and the settings there that would change the ids
// (checked against tokenizer.json, or refused). The rest (chat_template, model_max_length,
// padding and decoding options) does not touch the encoding of a text and is not read.
#include <algorithm>

#include "fsdp/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/json_object.h"

namespace fsdp::tokenizer {

namespace {

using namespace json_reading;

// A token named in the config: null, "text", or an AddedToken object {"content": "text", ...}.
std::optional<uint32_t> named_token(const json& config, const char* key, const HfTokenizerParts& p,
                                    const std::string& name) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    text = (*it)["content"].get<std::string>();
  } else {
    FSDP_USER_FAIL(name, ": ", key, " is ", it->dump(), ", not a token");
  }
  if (const auto a = p.added_ids.find(text); a != p.added_ids.end()) return a->second;
  std::string bytes;
  if (byte_level_to_bytes(text, bytes))
    if (const int64_t id = p.bpe.find(bytes); id >= 0) return static_cast<uint32_t>(id);
  if (const auto o = p.other_vocab.find(text); o != p.other_vocab.end()) return o->second;
  FSDP_USER_FAIL(name, ": ", key, " \"", text, "\" is not a token of ", p.name);
}

bool contains(const std::vector<uint32_t>& ids, std::optional<uint32_t> id) {
  return id && std::find(ids.begin(), ids.end(), *id) != ids.end();
}

}  // namespace

void read_tokenizer_config(std::string_view text, HfTokenizerParts& p) {
  const std::string name = p.name + "'s tokenizer_config.json";
  if (static_cast<int64_t>(text.size()) > kMaxTokenizerConfigBytes)
    FSDP_USER_FAIL(name, ": ", text.size(), " bytes, more than the ", kMaxTokenizerConfigBytes,
                   " this reader takes");
  const json config = parse_bounded(text, name);
  if (!config.is_object()) FSDP_USER_FAIL(name, ": not a JSON object");
  p.bos = named_token(config, "bos_token", p, name);
  p.eos = named_token(config, "eos_token", p, name);
  // `transformers` rebuilds the template from these for some tokenizer classes: they must
  // say what tokenizer.json's post-processor already does.
  const auto flag = [&](const char* key) -> std::optional<bool> {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean())
      FSDP_USER_FAIL(name, ": ", key, " is ", it->dump(), ", not true or false");
    return it->get<bool>();
  };
  if (const auto add = flag("add_bos_token"); add && *add != contains(p.prefix, p.bos))
    FSDP_USER_FAIL(
        name, ": add_bos_token is ", *add ? "true" : "false", " but ", p.name, "'s post-processor ",
        *add ? "does not put" : "puts",
        " the bos_token first; this reader follows tokenizer.json and refuses the mismatch");
  if (const auto add = flag("add_eos_token"); add && *add != contains(p.suffix, p.eos))
    FSDP_USER_FAIL(
        name, ": add_eos_token is ", *add ? "true" : "false", " but ", p.name, "'s post-processor ",
        *add ? "does not put" : "puts",
        " the eos_token last; this reader follows tokenizer.json and refuses the mismatch");
  if (flag("split_special_tokens").value_or(false))
    FSDP_USER_FAIL(name,
                   ": split_special_tokens is true (special tokens in the text would be "
                   "encoded as text); this reader does not support it");
  if (flag("add_prefix_space").value_or(false))
    FSDP_USER_FAIL(name,
                   ": add_prefix_space is true (a space before the text); this reader "
                   "does not support it");
  // Tokens the config adds must be the file's own (transformers would add the others).
  if (const auto it = config.find("added_tokens_decoder"); it != config.end() && !it->is_null()) {
    if (!it->is_object() || static_cast<int64_t>(it->size()) > kMaxTokenizerVocab)
      FSDP_USER_FAIL(name, ": added_tokens_decoder is not an object of at most ",
                     kMaxTokenizerVocab, " tokens");
    for (const auto& [id_text, token] : it->items()) {
      const std::string content =
          token.is_object() && token.contains("content") && token["content"].is_string()
              ? token["content"].get<std::string>()
              : std::string();
      for (const char* key : {"single_word", "lstrip", "rstrip"})
        if (token.is_object() && token.contains(key) && token[key] != false)
          FSDP_USER_FAIL(name, ": added_tokens_decoder[\"", id_text, "\"].", key,
                         " is not false; this reader does not support it");
      const auto found = p.added_ids.find(content);
      if (found == p.added_ids.end() || std::to_string(found->second) != id_text)
        FSDP_USER_FAIL(name, ": added_tokens_decoder[\"", id_text, "\"] (\"", content,
                       "\") is not an added token of ", p.name, " with that id");
    }
  }
}

bool reads_tokenizer_json() {
  return true;
}

std::unique_ptr<Tokenizer> tokenizer_from_json(std::string_view json_text, std::string_view config,
                                               const std::string& name) {
  return std::make_unique<HfTokenizer>(read_tokenizer_json(json_text, config, name));
}

}  // namespace fsdp::tokenizer
