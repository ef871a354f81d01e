// A SentencePiece model behind the Tokenizer interface (data/pydocs-4k/tokenizer.model, the
// one prepare-data trained): the ids, <s> as the special token, decode(encode(s)) == s, and
// `prepare-data --tokenizer tokenizer.model`. Built only with SentencePiece (CMakeLists.txt).
#include <gtest/gtest.h>

#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>

#include "command_util.h"
#include "fsdp/data.h"
#include "fsdp/error.h"
#include "tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Ids = std::vector<uint32_t>;

const std::string kModel = std::string(FSDP_SOURCE_DIR) + "/data/pydocs-4k/tokenizer.model";

TEST(TokenizerSentencePiece, IdsAreSentencePiecesOwnAndDecodingGivesTheTextBack) {
  const fsdp::tokenizer::LoadedTokenizer loaded = fsdp::tokenizer::load_tokenizer(kModel);
  const fsdp::tokenizer::Tokenizer& tok = *loaded.tokenizer;
  EXPECT_FALSE(loaded.is_tokenizer_json);
  ASSERT_EQ(loaded.files.size(), 1u);
  EXPECT_EQ(loaded.files[0].first, "tokenizer.model");
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(tok.bos_id(), std::optional<uint32_t>(1));  // <unk> 0, <s> 1, </s> 2 (docs/data.md)
  EXPECT_EQ(tok.eos_id(), std::optional<uint32_t>(2));
  EXPECT_EQ(tok.token_to_id("<s>"), std::optional<uint32_t>(1));
  EXPECT_EQ(tok.token_to_id("<unk>"), std::optional<uint32_t>(0));
  EXPECT_EQ(tok.token_to_id("no such piece at all"), std::nullopt);
  EXPECT_EQ(tok.encode("", true), Ids{1});

  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(kModel).ok());
  for (const std::string s : {"def main():\n    return 0\n", "The tokenizer's ids.",
                              "café 🙂 中文", "  two  spaces\t\ttabs\n\n", "123456"}) {
    std::vector<int> want;
    ASSERT_TRUE(sp.Encode(s, &want).ok());
    const Ids got = tok.encode(s);
    EXPECT_EQ(got, Ids(want.begin(), want.end())) << s;
    const Ids with = tok.encode(s, true);
    EXPECT_EQ(with.front(), 1u);
    EXPECT_EQ(Ids(with.begin() + 1, with.end()), got);
    EXPECT_EQ(tok.decode(got), s);   // identity normalization, byte fallback
    EXPECT_EQ(tok.decode(with), s);  // <s> decodes to nothing
  }
  try {
    tok.decode(Ids{4096});
    FAIL() << "an id outside the vocabulary was decoded";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(std::string(e.what()), kModel + ": id 4096 is outside the vocabulary of 4096 pieces");
  }
}

TEST(TokenizerSentencePiece, NotAModelIsNamedInOneLine) {
  const std::string path = ::testing::TempDir() + "not_a_model.model";
  std::ofstream(path) << "this is text, not a serialized model";
  try {
    fsdp::tokenizer::load_tokenizer(path);
    FAIL() << "text was loaded as a SentencePiece model";
  } catch (const fsdp::UserError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path + ": not a SentencePiece model: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(TokenizerSentencePiece, PrepareDataWithAModelFileUsesItsIdsAndCopiesIt) {
  const std::string dir = ::testing::TempDir() + "prepare_sp_model";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string text = "A file to tokenize.\nIt has a few lines.\nThe last one.\n";
  std::ofstream(dir + "/a.txt") << text;
  const auto r =
      fsdp::testing::run_fsdp_command("prepare-data --quiet --tokenizer " + kModel + " --input " +
                                      dir + "/a.txt --out " + dir + "/out --val-fraction 0");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto tok = fsdp::tokenizer::load_tokenizer(kModel).tokenizer;
  const fsdp::data::TokenFile train(dir + "/out/train.bin", 4096);
  EXPECT_EQ(train.dtype(), fsdp::data::TokenDtype::kUint16);
  const Ids want = tok->encode(text, true);
  EXPECT_EQ(train.read_all(), want);
  std::ifstream a(kModel, std::ios::binary), b(dir + "/out/tokenizer.model", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
            std::string(std::istreambuf_iterator<char>(b), {}));
  EXPECT_EQ(fsdp::data::read_corpus_meta(dir + "/out/meta.json").tokenizer, "tokenizer.model");
}

}  // namespace
