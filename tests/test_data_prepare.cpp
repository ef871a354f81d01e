// `fsdp prepare-data` end to end on a small generated corpus: the files load, decode back to
// the text exactly, and meta.json's entropy is the one of the files; bad input fails in one
// line. Built only with SentencePiece (CMakeLists.txt).
#include <gtest/gtest.h>

#include <sentencepiece_processor.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "command_util.h"
#include "fsdp/data.h"

namespace {

namespace fs = std::filesystem;
using fsdp::testing::CommandResult;
using fsdp::testing::run_fsdp_command;

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "prepare_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A few KB of English-like lines from a seeded generator, with what a tokenizer must keep
// exactly: runs of spaces, a tab, a non-ASCII letter, digits, blank lines.
std::string generated_text(uint32_t seed, int lines) {
  static const char* words[] = {"the", "river", "ran", "past", "an", "old", "mill", "and",
                                "children", "watched", "boats", "drift", "slowly", "toward",
                                "evening", "while", "café", "lights", "came", "on"};
  std::mt19937 rng(seed);
  std::ostringstream out;
  for (int l = 0; l < lines; ++l) {
    const int n = 4 + static_cast<int>(rng() % 9);
    for (int w = 0; w < n; ++w) {
      if (w > 0) out << (rng() % 17 == 0 ? "  " : " ");
      out << words[rng() % 20];
    }
    out << (l % 7 == 3 ? ", in 1907.\n" : ".\n");
    if (l % 11 == 5) out << "\n\tIndented, after a blank line.\n";
  }
  return out.str();
}

// Splits a token stream into its parts (each starts with <s>) and decodes each.
std::vector<std::string> decode_parts(const sentencepiece::SentencePieceProcessor& sp,
                                      std::span<const uint16_t> tokens) {
  std::vector<std::string> parts;
  std::vector<int> ids;
  auto flush = [&] {
    std::string text;
    EXPECT_TRUE(sp.Decode(ids, &text).ok());
    parts.push_back(text);
    ids.clear();
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == sp.bos_id()) {
      if (i > 0) flush();
      continue;
    }
    EXPECT_GT(i, 0u) << "a part must start with <s>";
    ids.push_back(tokens[i]);
  }
  if (!tokens.empty()) flush();
  return parts;
}

TEST(DataPrepare, SmallCorpusRoundTripsThroughTheTokenFiles) {
  const std::string dir = temp_dir("round_trip");
  const std::vector<std::string> texts = {generated_text(1, 60), generated_text(2, 40)};
  write_text(dir + "/a.txt", texts[0]);
  write_text(dir + "/b.txt", texts[1]);
  const CommandResult r =
      run_fsdp_command("prepare-data --input " + dir + "/a.txt " + dir + "/b.txt --out " + dir +
                       "/out --vocab 320 --val-fraction 0.2");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("prepare-data: training a SentencePiece BPE tokenizer of 320"),
            std::string::npos) << r.output;

  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(dir + "/out/tokenizer.model").ok());
  EXPECT_EQ(sp.GetPieceSize(), 320);
  fsdp::data::TokenFile train(dir + "/out/train.bin", 320);
  fsdp::data::TokenFile val(dir + "/out/val.bin", 320);
  const std::vector<uint32_t> train_wide = train.read_all(), val_wide = val.read_all();
  const std::vector<uint16_t> train_tokens(train_wide.begin(), train_wide.end());
  const std::vector<uint16_t> val_tokens(val_wide.begin(), val_wide.end());
  const std::vector<std::string> train_parts = decode_parts(sp, train_tokens);
  const std::vector<std::string> val_parts = decode_parts(sp, val_tokens);
  ASSERT_EQ(train_parts.size(), 2u);
  ASSERT_EQ(val_parts.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(train_parts[i] + val_parts[i], texts[i]) << i;  // exact, byte for byte
    // The val share is the file's last ~20%, cut at a line break.
    const double share = static_cast<double>(val_parts[i].size()) / texts[i].size();
    EXPECT_GT(share, 0.1) << i;
    EXPECT_LE(share, 0.2) << i;
    EXPECT_EQ(train_parts[i].back(), '\n') << i;
  }

  fsdp::data::CorpusMeta meta = fsdp::data::read_corpus_meta(dir + "/out/meta.json");
  EXPECT_EQ(meta.vocab, 320);
  EXPECT_EQ(meta.train_tokens, train.size());
  EXPECT_EQ(meta.val_tokens, val.size());
  std::vector<uint16_t> all = train_tokens;
  all.insert(all.end(), val_tokens.begin(), val_tokens.end());
  EXPECT_DOUBLE_EQ(meta.unigram_entropy_nats, fsdp::data::unigram_entropy_nats(all));
  EXPECT_NEAR(meta.unigram_entropy_bits, meta.unigram_entropy_nats / std::log(2.0), 1e-12);
  EXPECT_GT(meta.unigram_entropy_nats, 1.0);
  EXPECT_LT(meta.unigram_entropy_nats, std::log(320.0));
}

TEST(DataPrepare, SameInputAndSeedGiveTheSameFiles) {
  const std::string dir = temp_dir("determinism");
  write_text(dir + "/a.txt", generated_text(3, 50));
  for (const char* out : {"/one", "/two"})
    ASSERT_EQ(run_fsdp_command("prepare-data --quiet --input " + dir + "/a.txt --out " + dir +
                               out + " --vocab 300").code, 0);
  for (const char* file : {"/tokenizer.model", "/train.bin", "/val.bin"}) {
    std::ifstream a(dir + "/one" + file, std::ios::binary), b(dir + "/two" + file, std::ios::binary);
    std::stringstream sa, sb;
    sa << a.rdbuf();
    sb << b.rdbuf();
    EXPECT_EQ(sa.str(), sb.str()) << file;
  }
}

TEST(DataPrepare, BadInputFailsInOneLine) {
  const std::string dir = temp_dir("errors");
  write_text(dir + "/text.txt", generated_text(4, 30));
  write_text(dir + "/blank.txt", "  \n\n\t\n");
  write_text(dir + "/a_file", "x");
  const std::string text = " --input " + dir + "/text.txt";
  const struct {
    std::string args, message;
  } cases[] = {
      {"--input " + dir + "/missing.txt --out " + dir + "/o --vocab 300",
       "input " + dir + "/missing.txt does not exist"},
      {"--input " + dir + "/blank.txt --out " + dir + "/o --vocab 300", "the corpus is empty"},
      {text + " --out " + dir + "/o --vocab 100", "--vocab 100 is outside 260..65536"},
      {text + " --out " + dir + "/o --vocab 70000", "--vocab 70000 is outside 260..65536"},
      {text + " --out " + dir + "/o --vocab 30000", "SentencePiece could not train"},
      {text + " --out " + dir + "/a_file/sub --vocab 300", "cannot create --out"},
      {text + " --out " + dir + "/a_file --vocab 300", "exists and is not a directory"},
      {text + " --out " + dir + "/o --vocab 300 --val-fraction 0.9", "--val-fraction 0.9"},
  };
  for (const auto& c : cases) {
    const CommandResult r = run_fsdp_command("prepare-data --quiet " + c.args);
    EXPECT_EQ(r.code, 1) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "not one line: " << r.output;
    EXPECT_NE(r.output.find("fsdp: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
