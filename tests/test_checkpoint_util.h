// Helpers of the checkpoint tests: fresh directories, small configs, runs on CPU ranks.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "test_util.h"

namespace fsdp::testing {

inline std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "checkpoint_tests/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Small models with odd sizes, so that rows never split evenly and padding is exercised.
inline runtime::TrainConfig small_config(const std::string& kind) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = 3;
  c.model.dim = 17;
  c.model.hidden = 33;
  c.model.experts = 3;
  c.model.classes = kind == "mlp" ? 0 : 5;
  c.tokens = 6;
  c.steps = 6;
  c.collect_params = true;
  if (kind == "transformer") {
    // Grouped-query attention (3 heads share 1 kv head), head dim 6, an ffn and vocab that
    // split unevenly over 2, 3 or 4 ranks; 6 tokens per rank: 2 sequences of 3.
    c.model.dim = 18;
    c.model.heads = 3;
    c.model.kv_heads = 1;
    c.model.ffn_dim = 21;
    c.model.vocab = 37;
    c.model.seq_len = 3;
  }
  return c;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every file under `dir` and its content: "nothing on disk changed" is equality of two.
inline std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    out[e.path().string()] = e.is_regular_file() ? read_file(e.path().string()) : "<dir>";
  return out;
}

}  // namespace fsdp::testing
