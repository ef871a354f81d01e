// The golden fixtures of tests/fixtures/ (made by tests/fixtures/make_golden.py with PyTorch,
// in float64): reading them, and the rule that makes their inputs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp::testing {

inline nlohmann::json golden_fixture(const std::string& name) {
  const std::string path = std::string(FSDP_SOURCE_DIR) + "/tests/fixtures/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

// make_golden.py's input rule: element i of a tensor with `salt` is
// offset + scale * ((splitmix64(salt * 2^32 + i) >> 48) - 32768) / 32768 (exact in fp32 for the
// scales and offsets the fixtures use).
inline std::vector<float> golden_rule_values(uint64_t salt, int64_t n, double scale, double offset) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = ((salt << 32) | static_cast<uint64_t>(i)) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double unit = (static_cast<double>(z >> 48) - 32768.0) / 32768.0;
    out[static_cast<size_t>(i)] = static_cast<float>(offset + scale * unit);
  }
  return out;
}

// |got - want| <= rel * max(|want|, floor), element by element, naming the first miss.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                         double floor, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double bound = rel * std::max(std::fabs(want[i]), floor);
    if (!(std::fabs(got[i] - want[i]) <= bound)) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", PyTorch " << want[i]
                    << " (bound " << bound << ")";
      return;
    }
  }
}

}  // namespace fsdp::testing
