// `fsdp prepare-data --tokenizer` with a tokenizer.json end to end: the token files hold the
// tokenizer's ids of each file part with its document marks (Note [Document boundaries]), the
// tokenizer's files are copied beside them, the layout is uint32 when the ids need it (or when
// asked), the sampler reads what it wrote; bad combinations fail in one line. Built only with
// PCRE2 and utf8proc (CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "command_util.h"
#include "fsdp/data.h"
#include "fsdp/error.h"
#include "tokenizer/unicode_text.h"
#include "tokenizer_fixture.h"
#include "tools/prepare_data_command.h"

namespace {

namespace fs = std::filesystem;
using fsdp::testing::CommandResult;
using fsdp::testing::fixture_path;
using fsdp::testing::fixture_tokenizer;
using fsdp::testing::read_text_file;
using fsdp::testing::run_fsdp_command;
using Ids = std::vector<uint32_t>;

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "prepare_tok_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

Ids file_ids(const fsdp::data::TokenFile& f) { return f.read_all(); }

// docs/data.md's split: the last `fraction` of a file, cut at the first line break at or
// after that point, is its val share.
std::pair<std::string, std::string> split(const std::string& text, double fraction) {
  const size_t target =
      static_cast<size_t>(std::floor(static_cast<double>(text.size()) * (1 - fraction)));
  const size_t newline = text.find('\n', target == 0 ? 0 : target - 1);
  if (newline == std::string::npos || newline + 1 >= text.size()) return {text, ""};
  return {text.substr(0, newline + 1), text.substr(newline + 1)};
}

// corpus.txt and a second small file, split 80/20 into train and val.
struct Prepared {
  std::string dir;
  std::vector<std::string> train, val;  // each file's shares
};

Prepared prepare(const std::string& name, const std::string& variant,
                 const std::string& extra = "") {
  const std::string dir = temp_dir(name);
  const std::string second = "A second document.\nIt has two lines, and then a third.\nThe end.\n";
  std::ofstream(dir + "/second.txt", std::ios::binary) << second;
  const CommandResult r =
      run_fsdp_command("prepare-data --tokenizer " + fixture_path(variant + "/tokenizer.json") +
                       " --input " + fixture_path("corpus.txt") + " " + dir + "/second.txt --out " +
                       dir + "/out --val-fraction 0.2 " + extra);
  EXPECT_EQ(r.code, 0) << r.output;
  Prepared p{dir + "/out", {}, {}};
  for (const std::string& text : {read_text_file(fixture_path("corpus.txt")), second}) {
    const auto [train, val] = split(text, 0.2);
    EXPECT_FALSE(val.empty());
    p.train.push_back(train);
    p.val.push_back(val);
  }
  return p;
}

// The ids of each share with the document marks (Note [Document boundaries]), one after another.
Ids expected(const fsdp::tokenizer::Tokenizer& tok, const std::vector<std::string>& shares,
             const Ids& end) {
  Ids out;
  for (const std::string& s : shares) {
    const Ids ids = tok.encode(s, true);
    out.insert(out.end(), ids.begin(), ids.end());
    out.insert(out.end(), end.begin(), end.end());
  }
  return out;
}

TEST(PrepareTokenizer, Llama3LikeFilesHoldEachPartAfterItsBeginOfText) {
  const Prepared p = prepare("llama", "llama3_like");
  const auto tok = fixture_tokenizer("llama3_like");
  fsdp::data::TokenFile train(p.dir + "/train.bin", 663), val(p.dir + "/val.bin", 663);
  EXPECT_EQ(train.dtype(), fsdp::data::TokenDtype::kUint16);  // 663 ids fit uint16
  const Ids train_ids = file_ids(train), val_ids = file_ids(val);
  EXPECT_EQ(train_ids, expected(*tok, p.train, {}));
  EXPECT_EQ(val_ids, expected(*tok, p.val, {}));
  EXPECT_EQ(train_ids.front(), 659u);  // <|begin_of_text|>
  // Decoding gives the text back, each part after its <|begin_of_text|>.
  EXPECT_EQ(tok->decode(train_ids),
            "<|begin_of_text|>" + p.train[0] + "<|begin_of_text|>" + p.train[1]);
  EXPECT_EQ(tok->decode(val_ids), "<|begin_of_text|>" + p.val[0] + "<|begin_of_text|>" + p.val[1]);
  // The tokenizer's files, copied as they were; meta.json names them and the layout.
  EXPECT_EQ(read_text_file(p.dir + "/tokenizer.json"),
            read_text_file(fixture_path("llama3_like/tokenizer.json")));
  EXPECT_EQ(read_text_file(p.dir + "/tokenizer_config.json"),
            read_text_file(fixture_path("llama3_like/tokenizer_config.json")));
  EXPECT_FALSE(fs::exists(p.dir + "/tokenizer.model"));
  const fsdp::data::CorpusMeta meta = fsdp::data::read_corpus_meta(p.dir + "/meta.json");
  EXPECT_EQ(meta.vocab, 663);
  EXPECT_EQ(meta.token_dtype, fsdp::data::TokenDtype::kUint16);
  EXPECT_EQ(meta.tokenizer, "tokenizer.json");
  EXPECT_EQ(meta.train_tokens, train.size());
  Ids all = train_ids;
  all.insert(all.end(), val_ids.begin(), val_ids.end());
  EXPECT_DOUBLE_EQ(meta.unigram_entropy_nats, fsdp::data::unigram_entropy_nats(all, 663));
  // The prepared directory is a --tokenizer too.
  EXPECT_EQ(fsdp::tokenizer::load_tokenizer(p.dir).tokenizer->encode("Hello"),
            tok->encode("Hello"));
}

TEST(PrepareTokenizer, Qwen2LikePartsEndWithEndOfTextAndUint32IsKeptWhenAsked) {
  const Prepared p = prepare("qwen", "qwen2_like", "--token-dtype uint32 --quiet");
  const auto tok = fixture_tokenizer("qwen2_like");
  fsdp::data::TokenFile train(p.dir + "/train.bin", 663), val(p.dir + "/val.bin", 663);
  EXPECT_EQ(train.dtype(), fsdp::data::TokenDtype::kUint32);
  EXPECT_EQ(val.dtype(), fsdp::data::TokenDtype::kUint32);
  const Ids train_ids = file_ids(train), val_ids = file_ids(val);
  EXPECT_EQ(train_ids, expected(*tok, p.train, {659}));  // <|endoftext|> after each part
  EXPECT_EQ(val_ids, expected(*tok, p.val, {659}));
  // The corpus holds decomposed accents: NFC is what Qwen2.5's tokenizer encodes.
  EXPECT_EQ(tok->decode(train_ids),
            fsdp::tokenizer::nfc(p.train[0]) + "<|endoftext|>" + p.train[1] + "<|endoftext|>");
  EXPECT_EQ(fsdp::data::read_corpus_meta(p.dir + "/meta.json").token_dtype,
            fsdp::data::TokenDtype::kUint32);
  // The sampler reads the uint32 files.
  fsdp::data::BatchSampler s(
      std::make_shared<const fsdp::data::TokenFile>(p.dir + "/train.bin", 663), {2, 32, 1}, 5);
  std::vector<int32_t> in(64), lab(64);
  s.fill(0, 0, in, lab);
  const std::vector<int64_t> w = s.global_windows(0);
  EXPECT_EQ(in[0], static_cast<int32_t>(train_ids[static_cast<size_t>(w[0] * 32)]));
  EXPECT_EQ(lab[63], static_cast<int32_t>(train_ids[static_cast<size_t>(w[1] * 32 + 32)]));
}

// The error of `prepare-data ARGS`, parsed and run in this process (a process per case would
// cost a second here), or "(accepted)"; the one-line form of errors through main is
// DataPrepare.BadInputFailsInOneLine's.
std::string refusal(const std::string& args, bool quiet = true) {
  CLI::App app;
  fsdp::tools::PrepareDataOptions o;
  fsdp::tools::add_prepare_data_command(app, o);
  try {
    app.parse(std::string("prepare-data ") + (quiet ? "--quiet " : "") + args,
              /*program_name_included=*/false);
    fsdp::tools::run_prepare_data(o);
  } catch (const CLI::ParseError& e) {
    return e.what();
  } catch (const fsdp::UserError& e) {
    return e.what();
  }
  return "(accepted)";
}

// A vocabulary past uint16: generated here, byte tokens then filler up to 70000 ids, and
// <|begin_of_text|> after them as the template's token. (The filler goes into the text of
// the file directly: 69,000 entries through the JSON library would cost a second under ASan.)
std::string wide_tokenizer_json() {
  nlohmann::json j =
      nlohmann::json::parse(read_text_file(fixture_path("llama3_like/tokenizer.json")));
  const int64_t model_tokens = static_cast<int64_t>(j["model"]["vocab"].size());
  for (size_t i = 0; i < j["added_tokens"].size(); ++i) j["added_tokens"][i]["id"] = 70000 + i;
  j["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]["ids"] = {70000};
  std::string text = j.dump();
  std::string filler;
  for (int64_t id = model_tokens; id < 70000; ++id)  // '※': stands for no byte, never encoded
    filler += "\"\xe2\x80\xbb" + std::to_string(id) + "\":" + std::to_string(id) + ",";
  const size_t vocab = text.find("\"vocab\":{");
  EXPECT_NE(vocab, std::string::npos);
  text.insert(vocab + 9, filler);
  return text;
}

TEST(PrepareTokenizer, AVocabularyPastUint16GivesUint32FilesAndUint16IsRefused) {
  const std::string dir = temp_dir("wide");
  fs::create_directories(dir + "/tok");
  std::ofstream(dir + "/tok/tokenizer.json") << wide_tokenizer_json();
  std::ofstream(dir + "/text.txt")
      << "One line of text.\nAnd another one, with 42 in it.\nA third.\nA fourth.\n";
  ::testing::internal::CaptureStdout();
  const std::string accepted = refusal("--tokenizer " + dir + "/tok --input " + dir +
                                           "/text.txt --out " + dir + "/out --val-fraction 0.3",
                                       false);
  const std::string progress = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(accepted, "(accepted)");
  EXPECT_NE(progress.find("70004 ids; the tokenizer's own '<|begin_of_text|>' in each part"),
            std::string::npos)
      << progress;
  EXPECT_NE(progress.find("uint32 token files"), std::string::npos) << progress;
  const fsdp::data::TokenFile train(dir + "/out/train.bin", 70004);
  EXPECT_EQ(train.dtype(), fsdp::data::TokenDtype::kUint32);
  EXPECT_EQ(train.token(0), 70000u);
  const fsdp::data::CorpusMeta meta = fsdp::data::read_corpus_meta(dir + "/out/meta.json");
  EXPECT_EQ(meta.vocab, 70004);
  EXPECT_EQ(meta.token_dtype, fsdp::data::TokenDtype::kUint32);

  EXPECT_EQ(refusal("--tokenizer " + dir + "/tok/tokenizer.json --input " + dir +
                    "/text.txt --out " + dir + "/out16 --token-dtype uint16"),
            "prepare-data: --token-dtype uint16 cannot hold the ids of a vocabulary of 70004 (at "
            "most 65536); use uint32 or auto");
  EXPECT_FALSE(fs::exists(dir + "/out16"));  // refused before --out was made
}

TEST(PrepareTokenizer, BadCombinationsFailInOneLine) {
  const std::string dir = temp_dir("errors");
  std::ofstream(dir + "/text.txt") << "Some text.\nMore text.\n";
  std::ofstream(dir + "/latin1.txt", std::ios::binary) << "caf\xe9 au lait\n";
  fs::create_directories(dir + "/bare");
  fs::copy_file(fixture_path("qwen2_like/tokenizer.json"), dir + "/bare/tokenizer.json");
  const std::string llama = " --tokenizer " + fixture_path("llama3_like/tokenizer.json");
  const std::string in = " --input " + dir + "/text.txt --out " + dir + "/o";
  const struct {
    std::string args, message;
  } cases[] = {
      {llama + in + " --vocab 300", "--vocab excludes --tokenizer"},
      {llama + in + " --seed 3", "--tokenizer excludes --seed"},
      {llama + in + " --max-training-lines 5", "--tokenizer excludes --max-training-lines"},
      {in, "prepare-data: give --vocab N (train a tokenizer on the text) or --tokenizer FILE"},
      {llama + in + " --token-dtype int8", "--token-dtype: int8 not in {auto,uint16,uint32}"},
      {" --tokenizer " + dir + "/text.txt" + in, "expected a Hugging Face tokenizer.json"},
      {llama + " --input " + dir + "/latin1.txt --out " + dir + "/o",
       "prepare-data: input " + dir + "/latin1.txt is not UTF-8: byte 3 starts no character"},
      {" --tokenizer " + dir + "/bare" + in,
       "adds no special tokens to a text and names no eos_token (for a tokenizer.json: in "
       "tokenizer_config.json beside it), so the documents would run together unmarked"},
  };
  for (const auto& c : cases) {
    const std::string msg = refusal(c.args);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    EXPECT_NE(msg.find(c.message), std::string::npos) << c.args << "\n" << msg;
  }
  EXPECT_FALSE(fs::exists(dir + "/o/train.bin"));  // refused before anything was written
}

}  // namespace
