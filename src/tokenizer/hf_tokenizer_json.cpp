// Reading a Hugging Face tokenizer.json (and its tokenizer_config.json) into the parts of a
// byte-level BPE tokenizer. Every component, key and value is checked; what this reader does
// not run is refused in one line naming it (Note [Tokenizer files are refused, not guessed]).
#include <algorithm>
#include <set>

#include "fsdp/error.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/json_object.h"
#include "tokenizer/unicode_text.h"

namespace fsdp::tokenizer {

void read_tokenizer_config(std::string_view config, HfTokenizerParts& p);

namespace {

using namespace json_reading;

void check_token_text(const std::string& text, const std::string& where, const std::string& name) {
  if (text.size() > static_cast<size_t>(kMaxTokenBytes))
    FSDP_USER_FAIL(name, ": ", where, " is ", text.size(), " bytes long, more than the ",
                   kMaxTokenBytes, " this reader takes for one token");
}

uint32_t token_id(const json& v, int64_t limit, const std::string& where, const std::string& name) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= limit)
    FSDP_USER_FAIL(name, ": ", where, " is ", v.dump(), ", not an id in 0..", limit - 1);
  return static_cast<uint32_t>(v.get<int64_t>());
}

// model: {"type": "BPE", "vocab": {...}, "merges": [...], flags}.
void read_model(const json& v, HfTokenizerParts& p) {
  Object m(v, "model", p.name);
  const std::string type = m.string("type");
  if (type != "BPE")
    m.fail_key("type", "is \"", type, "\"; this reader runs byte-level BPE models only");
  if (const json* d = m.get("dropout");
      d != nullptr && !d->is_null() && !(d->is_number() && d->get<double>() == 0.0))
    m.fail_key("dropout", "is ", d->dump(), ": dropout makes encoding random; use null");
  // Every byte is a token (checked below), so no character is ever unknown: unk_token,
  // fuse_unk and byte_fallback cannot change an id.
  m.ignore("unk_token");
  m.ignore("fuse_unk");
  m.ignore("byte_fallback");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* s = m.get(key);
        s != nullptr && !s->is_null() && !(s->is_string() && s->get<std::string>().empty()))
      m.fail_key(key, "is ", s->dump(), "; this reader supports only none (null or \"\")");
  p.bpe.set_ignore_merges(m.boolean("ignore_merges", false));

  const json& vocab = m.need("vocab");
  if (!vocab.is_object()) m.fail_key("vocab", "is ", type_name(vocab), ", not an object");
  const int64_t count = static_cast<int64_t>(vocab.size());
  if (count < 256 || count > kMaxTokenizerVocab)
    m.fail_key("vocab", "has ", count, " tokens; a byte-level BPE has 256..", kMaxTokenizerVocab);
  p.decoded.assign(static_cast<size_t>(count), std::string());
  std::vector<bool> seen(static_cast<size_t>(count), false);
  std::string bytes;
  for (const auto& [text, id_value] : vocab.items()) {
    check_token_text(text, "a token of model.vocab", p.name);
    const uint32_t id = token_id(id_value, count, "model.vocab[\"" + text + "\"]", p.name);
    if (seen[id])
      m.fail_key("vocab", "gives id ", id, " twice; the ids must be 0..", count - 1, ", each once");
    seen[id] = true;
    if (byte_level_to_bytes(text, bytes)) {
      p.decoded[id] = bytes;
      p.bpe.add_token(bytes, id);
    } else {
      p.decoded[id] = text;  // not byte-level: decodes as its own text, as in `tokenizers`
      p.other_vocab.emplace(text, id);
    }
  }
  int missing = 0;
  if (!p.bpe.finish(missing))
    m.fail_key("vocab", "has no token for the byte 0x", std::hex, missing, std::dec, " ('",
               bytes_to_byte_level(std::string(1, static_cast<char>(missing))),
               "'); a byte-level BPE has one for each of the 256 bytes");

  const json& merges = m.need("merges");
  if (!merges.is_array()) m.fail_key("merges", "is ", type_name(merges), ", not an array");
  if (static_cast<int64_t>(merges.size()) > kMaxTokenizerVocab)
    m.fail_key("merges", "has ", merges.size(), " merges, more than the ", kMaxTokenizerVocab,
               " this reader takes");
  auto id_of = [&](const std::string& text, size_t rank, const char* what) {
    check_token_text(text, "a token of model.merges", p.name);
    const auto it = vocab.find(text);
    if (it == vocab.end())
      m.fail_item("merges", rank, ": ", what, " \"", text, "\" is not in model.vocab");
    return static_cast<uint32_t>(it->get<int64_t>());
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& e = merges[rank];
    std::string a, b;
    if (e.is_string()) {  // "a b": the two tokens, one space between
      const std::string s = e.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        m.fail_item("merges", rank, " is \"", s, "\", not two tokens with one space between");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      m.fail_item("merges", rank, " is ", type_name(e), ", neither \"a b\" nor [\"a\", \"b\"]");
    }
    const uint32_t left = id_of(a, rank, "the left token"),
                   right = id_of(b, rank, "the right token");
    const uint32_t merged = id_of(a + b, rank, "the merged token");
    p.bpe.add_merge(left, right, merged, static_cast<uint32_t>(rank));
  }
  m.done();
}

// added_tokens: [{"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}].
// Ids as `tokenizers` gives them: a token already in the vocabulary keeps its id, the others
// follow the vocabulary in id order.
void read_added_tokens(const json& v, HfTokenizerParts& p) {
  if (v.is_null()) return;
  if (!v.is_array()) FSDP_USER_FAIL(p.name, ": added_tokens is ", type_name(v), ", not an array");
  if (static_cast<int64_t>(v.size()) > kMaxTokenizerVocab)
    FSDP_USER_FAIL(p.name, ": added_tokens has ", v.size(), " tokens, more than the ",
                   kMaxTokenizerVocab, " this reader takes");
  struct Added {
    uint32_t id;
    std::string content;
    bool normalized, special;
  };
  std::vector<Added> added;
  const int64_t model_count = static_cast<int64_t>(p.decoded.size());
  for (size_t i = 0; i < v.size(); ++i) {
    Object t(v[i], "added_tokens[" + std::to_string(i) + "]", p.name);
    Added a;
    a.content = t.string("content");
    check_token_text(a.content, t.at("content"), p.name);
    if (a.content.empty()) t.fail_key("content", "is empty");
    a.id = token_id(t.need("id"), model_count + kMaxTokenizerVocab, t.at("id"), p.name);
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      t.require_bool(key, false, "it changes which text the token matches");
    a.normalized = t.boolean("normalized", true);
    a.special = t.boolean("special", false);
    t.done();
    added.push_back(std::move(a));
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const Added& x, const Added& y) { return x.id < y.id; });
  int64_t next = model_count;
  std::string bytes;
  for (const Added& a : added) {
    if (p.added_ids.count(a.content))
      FSDP_USER_FAIL(p.name, ": added_tokens has \"", a.content, "\" twice");
    int64_t in_vocab = byte_level_to_bytes(a.content, bytes) ? p.bpe.find(bytes) : -1;
    if (const auto it = p.other_vocab.find(a.content); it != p.other_vocab.end())
      in_vocab = it->second;
    const int64_t want = in_vocab >= 0 ? in_vocab : next;
    if (a.id != want)
      FSDP_USER_FAIL(p.name, ": added token \"", a.content, "\" has id ", a.id, " but would get ",
                     want, " from the `tokenizers` library (",
                     in_vocab >= 0
                         ? "its id in model.vocab"
                         : "the next id after the vocabulary and the added tokens before it",
                     ")");
    if (in_vocab < 0) {  // a new id, after the vocabulary
      ++next;
      p.decoded.emplace_back();
      p.special.push_back(false);
    }
    p.decoded[a.id] = a.content;
    p.special[a.id] = a.special;
    p.added_ids.emplace(a.content, a.id);
  }
  // Normalized added tokens match the normalized text: their own normalized form.
  for (const Added& a : added) {
    if (!a.normalized)
      p.raw_added.add(a.content, a.id);
    else
      p.normalized_added.add(p.nfc ? nfc(a.content) : a.content, a.id);
  }
  p.raw_added.finish();
  p.normalized_added.finish();
}

void read_normalizer(const json& v, HfTokenizerParts& p) {
  if (v.is_null()) return;
  Object n(v, "normalizer", p.name);
  const std::string type = n.string("type");
  if (type != "NFC")
    n.fail_key("type", "is \"", type, "\"; this reader supports no normalizer (null) or NFC");
  p.nfc = true;
  n.done();
}

void read_byte_level(Object& b, bool is_pre_tokenizer) {
  if (is_pre_tokenizer) {
    b.require_bool("add_prefix_space", false, "it puts a space before the text");
    b.require_bool("use_regex", false, "GPT-2's own split; give the pattern as a Split");
  } else {
    b.ignore("add_prefix_space");  // the decoder and post-processor: offsets only
    b.ignore("use_regex");
  }
  b.ignore("trim_offsets");  // offsets only
  b.done();
}

// pre_tokenizer: Sequence [Split..., ByteLevel], or ByteLevel alone (then no split at all).
void read_pre_tokenizer(const json& v, HfTokenizerParts& p) {
  if (v.is_null())
    FSDP_USER_FAIL(p.name, ": pre_tokenizer is null; a byte-level BPE needs the ByteLevel one");
  Object top(v, "pre_tokenizer", p.name);
  const std::string type = top.string("type");
  if (type == "ByteLevel") return read_byte_level(top, true);
  if (type != "Sequence")
    top.fail_key("type", "is \"", type, "\"; this reader supports Sequence [Split..., ByteLevel]");
  const json& list = top.need("pretokenizers");
  if (!list.is_array() || list.empty() || list.size() > 16)
    top.fail_key("pretokenizers", "is not an array of 1..16 pre-tokenizers");
  top.done();
  for (size_t i = 0; i < list.size(); ++i) {
    Object s(list[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]", p.name);
    const std::string t = s.string("type");
    const bool last = i + 1 == list.size();
    if (t == "ByteLevel" && last) {
      read_byte_level(s, true);
      continue;
    }
    if (t != "Split")
      s.fail_key("type", "is \"", t, "\"",
                 last ? "; the last pre-tokenizer must be ByteLevel"
                      : "; this reader supports Split before ByteLevel");
    if (last) s.fail("is Split; the last pre-tokenizer must be ByteLevel");
    const std::string behavior = s.string("behavior");
    if (behavior != "Isolated")
      s.fail_key("behavior", "is \"", behavior, "\"; this reader supports Isolated");
    s.require_bool("invert", false, "it splits on what the pattern does not match");
    Object pattern(s.need("pattern"), s.at("pattern"), p.name);
    const json* regex = pattern.get("Regex");
    const json* literal = pattern.get("String");
    pattern.done();
    const json* text = regex != nullptr ? regex : literal;
    if (text == nullptr || !text->is_string() || (regex != nullptr && literal != nullptr))
      pattern.fail("is not {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    p.splits.push_back(std::make_unique<RegexSplit>(text->get<std::string>(), regex == nullptr,
                                                    p.name + ": " + pattern.where()));
    s.done();
  }
}

void read_decoder(const json& v, const std::string& name) {
  if (v.is_null()) FSDP_USER_FAIL(name, ": decoder is null; a byte-level BPE needs ByteLevel");
  Object d(v, "decoder", name);
  const std::string type = d.string("type");
  if (type != "ByteLevel") d.fail_key("type", "is \"", type, "\"; this reader supports ByteLevel");
  read_byte_level(d, false);
}

// TemplateProcessing: the "single" template's special tokens before and after $A.
void read_template(Object& t, HfTokenizerParts& p) {
  t.ignore("pair");  // two-text inputs; prepare-data and generation encode one text
  const json& specials = t.need("special_tokens");
  if (!specials.is_object()) t.fail_key("special_tokens", "is not an object");
  const json& single = t.need("single");
  if (!single.is_array() || single.size() > 64)
    t.fail_key("single", "is not an array of up to 64 items");
  bool seen_a = false;
  for (size_t i = 0; i < single.size(); ++i) {
    Object item(single[i], t.at("single") + "[" + std::to_string(i) + "]", p.name);
    const json* special = item.get("SpecialToken");
    const json* sequence = item.get("Sequence");
    item.done();
    if ((special == nullptr) == (sequence == nullptr))
      item.fail("is neither {\"SpecialToken\": ...} nor {\"Sequence\": ...}");
    if (sequence != nullptr) {
      Object s(*sequence, item.at("Sequence"), p.name);
      if (s.string("id") != "A" || seen_a) s.fail("is not the one sequence A");
      s.ignore("type_id");
      s.done();
      seen_a = true;
      continue;
    }
    Object s(*special, item.at("SpecialToken"), p.name);
    const std::string id = s.string("id");
    s.ignore("type_id");
    s.done();
    const auto it = specials.find(id);
    if (it == specials.end()) s.fail("names \"", id, "\", which special_tokens does not hold");
    Object entry(*it, t.at("special_tokens") + "[\"" + id + "\"]", p.name);
    const json& ids = entry.need("ids");
    entry.ignore("id");
    entry.ignore("tokens");
    entry.done();
    if (!ids.is_array() || ids.size() > 64)
      entry.fail_key("ids", "is not an array of up to 64 ids");
    for (const json& x : ids)
      (seen_a ? p.suffix : p.prefix)
          .push_back(token_id(x, static_cast<int64_t>(p.decoded.size()), entry.at("ids"), p.name));
  }
  if (!seen_a) t.fail_key("single", "has no sequence A");
  t.done();
}

void read_post_processor(const json& v, HfTokenizerParts& p, bool in_sequence = false) {
  if (v.is_null()) return;
  Object pp(v, in_sequence ? "post_processor.processors[]" : "post_processor", p.name);
  const std::string type = pp.string("type");
  if (type == "ByteLevel") return read_byte_level(pp, false);
  if (type == "TemplateProcessing") {
    if (!p.prefix.empty() || !p.suffix.empty()) pp.fail("is a second template");
    return read_template(pp, p);
  }
  if (type == "Sequence" && !in_sequence) {
    const json& list = pp.need("processors");
    if (!list.is_array() || list.size() > 8)
      pp.fail_key("processors", "is not an array of up to 8");
    pp.done();
    for (const json& x : list) read_post_processor(x, p, true);
    return;
  }
  pp.fail_key("type", "is \"", type,
              "\"; this reader supports ByteLevel, TemplateProcessing "
              "and a Sequence of them");
}

}  // namespace

HfTokenizerParts read_tokenizer_json(std::string_view text, std::string_view config,
                                     const std::string& name) {
  if (static_cast<int64_t>(text.size()) > kMaxTokenizerFileBytes)
    FSDP_USER_FAIL(name, ": ", text.size(), " bytes, more than the ", kMaxTokenizerFileBytes,
                   " this reader takes");
  const json doc = parse_bounded(text, name);
  HfTokenizerParts p;
  p.name = name;
  Object top(doc, "", name);
  if (const json* version = top.get("version");
      version != nullptr && !(version->is_string() && *version == "1.0"))
    top.fail_key("version", "is ", version->dump(), "; this reader knows version \"1.0\"");
  for (const char* key : {"truncation", "padding"})
    if (const json* x = top.get(key); x != nullptr && !x->is_null())
      top.fail_key(key, "is set; this reader encodes whole texts (it must be null)");
  read_normalizer(top.need("normalizer"), p);  // first: normalized added tokens need it
  read_model(top.need("model"), p);
  p.special.assign(p.decoded.size(), false);
  read_added_tokens(top.need("added_tokens"), p);
  read_pre_tokenizer(top.need("pre_tokenizer"), p);
  read_post_processor(top.need("post_processor"), p);
  read_decoder(top.need("decoder"), name);
  top.done();
  if (!config.empty()) read_tokenizer_config(config, p);
  return p;
}

}  // namespace fsdp::tokenizer
