// What the tokenizer.json reader refuses (Note [Tokenizer files are refused, not guessed]):
// each unknown component, key or setting that would change the ids, each bad size or value,
// in one line naming it; and the file checks before anything is read. Built only with PCRE2
// and utf8proc (CMakeLists.txt).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <functional>

#include "fsdp/error.h"
#include "tokenizer/regex_split.h"
#include "tokenizer_fixture.h"

namespace {

namespace fs = std::filesystem;
using fsdp::testing::fixture_path;
using fsdp::testing::read_text_file;
using json = nlohmann::json;

json llama_fixture() {
  return json::parse(read_text_file(fixture_path("llama3_like/tokenizer.json")));
}
json llama_config() {
  return json::parse(read_text_file(fixture_path("llama3_like/tokenizer_config.json")));
}

// The one-line error of reading `text` (and `config`), named "t.json".
std::string refusal(const std::string& text, const std::string& config = "") {
  try {
    fsdp::tokenizer::tokenizer_from_json(text, config, "t.json");
  } catch (const fsdp::UserError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    EXPECT_EQ(msg.rfind("t.json", 0), 0u) << "does not start with the file's name: " << msg;
    return msg;
  }
  return "(accepted)";
}

struct Case {
  const char* what;
  std::function<void(json&)> change;
  std::string message;
};

TEST(TokenizerJsonRefusals, EachUnsupportedSettingIsNamedInOneLine) {
  const Case cases[] = {
      {"model type", [](json& j) { j["model"]["type"] = "WordPiece"; },
       "t.json: model.type is \"WordPiece\"; this reader runs byte-level BPE models only"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; },
       "t.json: model.dropout is 0.1: dropout makes encoding random; use null"},
      {"prefix", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "t.json: model.continuing_subword_prefix is \"##\"; this reader supports only none"},
      {"suffix", [](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; },
       "t.json: model.end_of_word_suffix is \"</w>\""},
      {"missing byte",
       [](json& j) {
         json& v = j["model"]["vocab"];
         v["not a byte"] = v["\xc4\x80"];  // 'Ā', byte 0, keeps its id under another name
         v.erase("\xc4\x80");
       },
       "t.json: model.vocab has no token for the byte 0x0 ('\xc4\x80')"},
      {"id twice", [](json& j) { j["model"]["vocab"]["zz"] = 5; },
       "t.json: model.vocab gives id 5 twice; the ids must be 0..659, each once"},
      {"id outside", [](json& j) { j["model"]["vocab"]["zz"] = 7000; },
       "model.vocab[\"zz\"] is 7000, not an id in 0..659"},
      {"id not a number", [](json& j) { j["model"]["vocab"]["zz"] = "1"; },
       "model.vocab[\"zz\"] is \"1\", not an id in 0..659"},
      {"long token", [](json& j) { j["model"]["vocab"][std::string(5000, 'a')] = 659; },
       "t.json: a token of model.vocab is 5000 bytes long, more than the 4096 this reader takes"},
      {"merge shape", [](json& j) { j["model"]["merges"][0] = "a b c"; },
       "t.json: model.merges[0] is \"a b c\", not two tokens with one space between"},
      {"merge type", [](json& j) { j["model"]["merges"][1] = 5; },
       "t.json: model.merges[1] is number, neither \"a b\" nor [\"a\", \"b\"]"},
      {"merge part", [](json& j) { j["model"]["merges"].push_back("\xc4\xa0 nosuch"); },
       "t.json: model.merges[400]: the right token \"nosuch\" is not in model.vocab"},
      {"merged token", [](json& j) { j["model"]["merges"].push_back("\xc4\x80 \xc4\x80"); },
       "t.json: model.merges[400]: the merged token \"\xc4\x80\xc4\x80\" is not in model.vocab"},
      {"model key", [](json& j) { j["model"]["bar"] = 1; },
       "t.json: model has the key \"bar\", which this reader does not know"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       "t.json: normalizer.type is \"NFKC\"; this reader supports no normalizer (null) or NFC"},
      {"lowercase",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type is \"Lowercase\""},
      {"pre-tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "t.json: pre_tokenizer.type is \"Whitespace\"; this reader supports Sequence [Split..., "
       "ByteLevel]"},
      {"behaviour", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "t.json: pre_tokenizer.pretokenizers[0].behavior is \"Removed\"; this reader supports "
       "Isolated"},
      {"invert", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "pre_tokenizer.pretokenizers[0].invert is true, which this reader does not support"},
      {"anchor",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "^\\s+"; },
       "the pattern holds the anchor '^' (line anchors in Oniguruma)"},
      {"\\w", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; },
       "the pattern holds the escape \\w, which PCRE2 and Oniguruma"},
      {"\\h", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[\\h]"; },
       "the pattern holds the escape \\h"},
      {"inline flag",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(?m)x"; },
       "the pattern holds the group '(?m)x...'"},
      {"POSIX class",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[[:alpha:]]"; },
       "'[' inside a character class"},
      {"bad regex",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; },
       "t.json: pre_tokenizer.pretokenizers[0].pattern: PCRE2 cannot compile the pattern: missing "
       "closing parenthesis at offset 2"},
      {"pattern kind",
       [](json& j) {
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", 1}};
       },
       "pre_tokenizer.pretokenizers[0].pattern is not {\"Regex\": \"...\"} or {\"String\": "
       "\"...\"}"},
      {"prefix space",
       [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "pre_tokenizer.pretokenizers[1].add_prefix_space is true, which this reader does not "
       "support"},
      {"GPT-2 regex", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; },
       "pre_tokenizer.pretokenizers[1].use_regex is true"},
      {"no ByteLevel", [](json& j) { j["pre_tokenizer"]["pretokenizers"].erase(1); },
       "pre_tokenizer.pretokenizers[0] is Split; the last pre-tokenizer must be ByteLevel"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "t.json: decoder.type is \"WordPiece\"; this reader supports ByteLevel"},
      {"no decoder", [](json& j) { j["decoder"] = nullptr; }, "t.json: decoder is null"},
      {"post-processor",
       [](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "t.json: post_processor.type is \"BertProcessing\""},
      {"template token",
       [](json& j) {
         j["post_processor"]["processors"][1]["single"][0]["SpecialToken"]["id"] = "<s>";
       },
       "names \"<s>\", which special_tokens does not hold"},
      {"lstrip", [](json& j) { j["added_tokens"][0]["lstrip"] = true; },
       "t.json: added_tokens[0].lstrip is true, which this reader does not support (it changes "
       "which text the token matches)"},
      {"added id", [](json& j) { j["added_tokens"][0]["id"] = 700; },
       "t.json: added token \"<|end_of_text|>\" has id 660 but would get 659 from the `tokenizers` "
       "library"},
      {"added twice",
       [](json& j) {
         j["added_tokens"].push_back(j["added_tokens"][3]);
         j["added_tokens"][4]["id"] = 663;
       },
       "t.json: added_tokens has \"<|eot_id|>\" twice"},
      {"added key", [](json& j) { j["added_tokens"][2]["foo"] = false; },
       "t.json: added_tokens[2] has the key \"foo\""},
      {"truncation",
       [](json& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       "t.json: truncation is set; this reader encodes whole texts (it must be null)"},
      {"top key", [](json& j) { j["foo"] = 1; },
       "t.json: the file has the key \"foo\", which this reader does not know"},
      {"version", [](json& j) { j["version"] = "2.0"; },
       "t.json: version is \"2.0\"; this reader knows version \"1.0\""},
  };
  for (const Case& c : cases) {
    json j = llama_fixture();
    c.change(j);
    const std::string msg = refusal(j.dump());
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": " << msg;
  }
}

TEST(TokenizerJsonRefusals, BadJsonAndBadConfigsAreNamedInOneLine) {
  EXPECT_NE(refusal("{").find("t.json: not valid JSON: "), std::string::npos);
  EXPECT_NE(refusal("[]").find("t.json: the file is array, not an object"), std::string::npos);
  EXPECT_EQ(refusal(std::string(1000, '[') + std::string(1000, ']')),
            "t.json: JSON nested deeper than 64 levels");
  const std::string text = llama_fixture().dump();
  const struct {
    std::function<void(json&)> change;
    std::string message;
  } cases[] = {
      {[](json& c) { c["eos_token"] = "<|nope|>"; },
       "t.json's tokenizer_config.json: eos_token \"<|nope|>\" is not a token of t.json"},
      {[](json& c) {
         c["bos_token"] = {{"content", 3}};
       },
       "t.json's tokenizer_config.json: bos_token is {\"content\":3}, not a token"},
      {[](json& c) { c["add_bos_token"] = false; },
       "add_bos_token is false but t.json's post-processor puts the bos_token first"},
      {[](json& c) { c["add_eos_token"] = true; },
       "add_eos_token is true but t.json's post-processor does not put the eos_token last"},
      {[](json& c) { c["split_special_tokens"] = true; }, "split_special_tokens is true"},
      {[](json& c) { c["add_prefix_space"] = true; }, "add_prefix_space is true"},
      {[](json& c) {
         c["added_tokens_decoder"]["700"] = {{"content", "<|new|>"}};
       },
       "added_tokens_decoder[\"700\"] (\"<|new|>\") is not an added token of t.json with that id"},
      {[](json& c) { c["added_tokens_decoder"]["659"]["rstrip"] = true; },
       "added_tokens_decoder[\"659\"].rstrip is not false"},
  };
  for (const auto& c : cases) {
    json config = llama_config();
    c.change(config);
    const std::string msg = refusal(text, config.dump());
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
  }
  EXPECT_NE(refusal(text, "{oops").find("t.json's tokenizer_config.json: not valid JSON"),
            std::string::npos);
  EXPECT_EQ(refusal(text, llama_config().dump()), "(accepted)");
}

TEST(TokenizerJsonRefusals, RealPatternsArePortableAndOthersAreNot) {
  using fsdp::tokenizer::unportable_construct;
  const json llama = llama_fixture();
  const json qwen = json::parse(read_text_file(fixture_path("qwen2_like/tokenizer.json")));
  EXPECT_EQ(unportable_construct(
                llama["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>()),
            "");
  EXPECT_EQ(unportable_construct(
                qwen["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>()),
            "");
  EXPECT_EQ(unportable_construct("(?i:abc)|(?<=x)y|(?<!x)z|(?>a+)|[\\]a-z]|\\x{41}\\."), "");
  EXPECT_EQ(unportable_construct("a$"), "the anchor '$' (line anchors in Oniguruma)");
  EXPECT_EQ(unportable_construct("\\v"), "the escape \\v");
  EXPECT_EQ(unportable_construct("\\bword"), "the escape \\b");
  EXPECT_EQ(unportable_construct("[a&&b]"),
            "'&&' inside a character class (an intersection in Oniguruma)");
  EXPECT_EQ(unportable_construct("[]a]"), "a character class that starts with ']'");
  EXPECT_EQ(unportable_construct("[abc"), "an unterminated character class");
  EXPECT_EQ(unportable_construct("x\\"), "a trailing backslash");
}

std::string load_error(const std::string& path) {
  try {
    fsdp::tokenizer::load_tokenizer(path);
  } catch (const fsdp::UserError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "(loaded)";
}

TEST(TokenizerJsonRefusals, FilesAreCheckedBeforeTheyAreRead) {
  const std::string dir = ::testing::TempDir() + "tokenizer_files";
  fs::remove_all(dir);
  fs::create_directories(dir + "/empty");
  EXPECT_EQ(load_error(dir + "/none.json"),
            "cannot open '" + dir + "/none.json': No such file or directory");
  EXPECT_EQ(load_error(dir + "/empty"), "tokenizer directory " + dir +
                                            "/empty holds neither tokenizer.json nor "
                                            "tokenizer.model");
  std::ofstream(dir + "/vocab.txt") << "a\n";
  EXPECT_NE(load_error(dir + "/vocab.txt")
                .find("expected a Hugging Face tokenizer.json (a name ending "
                      "in .json) or a SentencePiece model"),
            std::string::npos);
  // Larger than the bound: refused from its size, without reading (the file is sparse).
  { std::ofstream big(dir + "/big.json"); }
  fs::resize_file(dir + "/big.json", (uint64_t{64} << 20) + 1);
  EXPECT_EQ(load_error(dir + "/big.json"), "'" + dir +
                                               "/big.json' holds 67108865 bytes, more than "
                                               "the 67108864 bytes that a tokenizer file may hold");
  ASSERT_EQ(::mkfifo((dir + "/fifo.json").c_str(), 0600), 0);  // would block if opened
  EXPECT_EQ(load_error(dir + "/fifo.json"),
            "cannot read '" + dir + "/fifo.json': it is a FIFO, not a regular file");
  // A model's directory: its tokenizer.json and the tokenizer_config.json beside it.
  const fsdp::tokenizer::LoadedTokenizer t =
      fsdp::tokenizer::load_tokenizer(fixture_path("llama3_like"));
  EXPECT_TRUE(t.is_tokenizer_json);
  ASSERT_EQ(t.files.size(), 2u);
  EXPECT_EQ(t.files[0].first, "tokenizer.json");
  EXPECT_EQ(t.files[1].first, "tokenizer_config.json");
  EXPECT_EQ(t.tokenizer->eos_id(), std::optional<uint32_t>(660));
  fs::remove_all(dir);
}

}  // namespace
