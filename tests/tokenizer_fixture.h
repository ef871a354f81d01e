// The tokenizer.json fixtures of tests/fixtures/tokenizer (make_fixture.py made them) and the
// ids expected of them (expected_ids.json: make_expected.py writes it from Hugging Face's
// `tokenizers`), for the tokenizer tests.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace fsdp::testing {

inline std::string fixture_path(const std::string& name) {
  return std::string(FSDP_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + name;
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream out;
  out << in.rdbuf();
  return std::move(out).str();
}

// "llama3_like" or "qwen2_like", with its tokenizer_config.json.
inline std::unique_ptr<tokenizer::Tokenizer> fixture_tokenizer(const std::string& variant) {
  return tokenizer::tokenizer_from_json(
      read_text_file(fixture_path(variant + "/tokenizer.json")),
      read_text_file(fixture_path(variant + "/tokenizer_config.json")),
      variant + "/tokenizer.json");
}

inline const nlohmann::json& expected_ids() {
  static const nlohmann::json j =
      nlohmann::json::parse(read_text_file(fixture_path("expected_ids.json")));
  return j;
}

}  // namespace fsdp::testing
