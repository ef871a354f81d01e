// E4M3 and E5M2 on the host (include/fsdp/fp8.h): every one of the 256 codes decodes to the
// value its bits spell, encodes back to itself, and every float in between rounds to the
// nearer code, ties to the even one, with saturation at the largest finite value.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/fp8.h"

namespace fsdp {
namespace {

bool is_nan_code(uint8_t c, Fp8Format f) {
  return f == Fp8Format::E4M3 ? (c & 0x7f) == 0x7f : (c & 0x7f) > 0x7c;
}

// The finite non-negative codes, ascending (code order is value order for positives).
std::vector<uint8_t> finite_positive_codes(Fp8Format f) {
  std::vector<uint8_t> out;
  for (int c = 0; c < 128; ++c)
    if (!is_nan_code(static_cast<uint8_t>(c), f) && !std::isinf(fp8_to_float(c, f)))
      out.push_back(static_cast<uint8_t>(c));
  return out;
}

class Fp8Formats : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8Formats, SpecialValuesAndExtremes) {
  const Fp8Format f = GetParam();
  const bool e4m3 = f == Fp8Format::E4M3;
  EXPECT_EQ(fp8_to_float(0x00, f), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_to_float(0x80, f)));
  EXPECT_EQ(fp8_to_float(e4m3 ? 0x7e : 0x7b, f), e4m3 ? 448.0f : 57344.0f);
  EXPECT_EQ(fp8_to_float(0x01, f), e4m3 ? 0x1p-9f : 0x1p-16f);  // the smallest subnormal
  EXPECT_EQ(fp8_to_float(0x08 >> (e4m3 ? 0 : 1), f), e4m3 ? 0x1p-6f : 0x1p-14f);  // min normal
  EXPECT_EQ(fp8_to_float(0x38 + (e4m3 ? 0 : 0x04), f), 1.0f);
  int nans = 0;
  for (int c = 0; c < 256; ++c) nans += std::isnan(fp8_to_float(static_cast<uint8_t>(c), f));
  EXPECT_EQ(nans, e4m3 ? 2 : 6);
  if (!e4m3) {
    EXPECT_EQ(fp8_to_float(0x7c, f), INFINITY);
    EXPECT_EQ(fp8_to_float(0xfc, f), -INFINITY);
  }
  // Saturation: beyond the largest, and infinities, land on +-max; NaN is 0x7f.
  const uint8_t max_code = e4m3 ? 0x7e : 0x7b;
  EXPECT_EQ(float_to_fp8(fp8_spec(f).max * 1.01f, f), max_code);
  EXPECT_EQ(float_to_fp8(1e30f, f), max_code);
  EXPECT_EQ(float_to_fp8(INFINITY, f), max_code);
  EXPECT_EQ(float_to_fp8(-INFINITY, f), 0x80 | max_code);
  EXPECT_EQ(float_to_fp8(NAN, f), kFp8NaN);
  EXPECT_EQ(float_to_fp8(-NAN, f), kFp8NaN);
  // Below half the smallest subnormal: a signed zero; exactly half ties to even (zero).
  const float tiny = fp8_to_float(0x01, f);
  EXPECT_EQ(float_to_fp8(tiny * 0.5f, f), 0x00);
  EXPECT_EQ(float_to_fp8(-tiny * 0.5f, f), 0x80);
  EXPECT_EQ(float_to_fp8(tiny * 0.5001f, f), 0x01);
  EXPECT_EQ(float_to_fp8(tiny * 1.5f, f), 0x02);  // tie between 1 and 2: even
  EXPECT_EQ(float_to_fp8(1e-30f, f), 0x00);
}

TEST_P(Fp8Formats, EveryCodeRoundTrips) {
  const Fp8Format f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float v = fp8_to_float(code, f);
    if (std::isnan(v)) {
      EXPECT_EQ(float_to_fp8(v, f), kFp8NaN);
    } else if (std::isinf(v)) {
      EXPECT_EQ(float_to_fp8(v, f) & 0x7f, f == Fp8Format::E4M3 ? 0x7e : 0x7b);
    } else {
      EXPECT_EQ(float_to_fp8(v, f), code) << "code " << c << " value " << v;
    }
  }
}

// Between two neighbouring codes: just below the midpoint goes down, just above goes up, the
// midpoint itself to the code with an even mantissa (an even code). Both signs.
TEST_P(Fp8Formats, MidpointsTieToEven) {
  const Fp8Format f = GetParam();
  const std::vector<uint8_t> codes = finite_positive_codes(f);
  for (size_t i = 0; i + 1 < codes.size(); ++i) {
    const float lo = fp8_to_float(codes[i], f), hi = fp8_to_float(codes[i + 1], f);
    const float mid = lo + (hi - lo) / 2;  // exact: both are short binary fractions
    const uint8_t even = (codes[i] & 1) == 0 ? codes[i] : codes[i + 1];
    for (float sign : {1.0f, -1.0f}) {
      const uint8_t s = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(float_to_fp8(sign * mid, f), s | even) << "midpoint " << mid;
      EXPECT_EQ(float_to_fp8(sign * std::nextafter(mid, 0.0f), f), s | codes[i]) << mid;
      EXPECT_EQ(float_to_fp8(sign * std::nextafter(mid, INFINITY), f), s | codes[i + 1]) << mid;
    }
  }
}

// Random floats of every magnitude against a brute-force nearest code.
TEST_P(Fp8Formats, RandomFloatsRoundToTheNearestCode) {
  const Fp8Format f = GetParam();
  const std::vector<uint8_t> codes = finite_positive_codes(f);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-20.0f, 18.0f);
  for (int i = 0; i < 20000; ++i) {
    const float a = std::exp2(exponent(rng));
    uint8_t best = codes.back();  // beyond the largest: saturation
    for (size_t j = 0; j + 1 < codes.size(); ++j) {
      const double lo = fp8_to_float(codes[j], f), hi = fp8_to_float(codes[j + 1], f);
      if (a >= hi) continue;
      const double d_lo = a - lo, d_hi = hi - a;
      best = d_lo < d_hi ? codes[j] : d_hi < d_lo ? codes[j + 1]
                                                  : ((codes[j] & 1) ? codes[j + 1] : codes[j]);
      break;
    }
    ASSERT_EQ(float_to_fp8(a, f), best) << a;
    ASSERT_EQ(float_to_fp8(-a, f), 0x80 | best) << -a;
  }
}

INSTANTIATE_TEST_SUITE_P(Both, Fp8Formats, ::testing::Values(Fp8Format::E4M3, Fp8Format::E5M2),
                         [](const auto& info) { return std::string(fp8_format_name(info.param)); });

TEST(Fp8Scale, FromAmaxWithAFloorForZeros) {
  EXPECT_EQ(fp8_scale_of(448.0f, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(fp8_scale_of(2.0f, Fp8Format::E5M2), 28672.0f);
  EXPECT_TRUE(std::isfinite(fp8_scale_of(0.0f, Fp8Format::E4M3)));
  EXPECT_EQ(fp8_scale_of(0.0f, Fp8Format::E4M3), 448.0f / kFp8AmaxFloor);
}

TEST(Fp8Recipe, ParsesItsNamesAndRefusesOthersInOneLine) {
  EXPECT_EQ(parse_fp8_recipe("none"), Fp8Recipe::None);
  EXPECT_EQ(parse_fp8_recipe("tensorwise"), Fp8Recipe::Tensorwise);
  EXPECT_EQ(parse_fp8_recipe("rowwise"), Fp8Recipe::Rowwise);
  try {
    parse_fp8_recipe("e4m3");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "fp8 must be none, tensorwise or rowwise, got 'e4m3'");
  }
}

}  // namespace
}  // namespace fsdp
