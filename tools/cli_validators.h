// Checks of flag text that CLI11's own conversions leave out.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace fsdp::tools {

// A decimal integer in [0, 2^64). CLI11 reads "-1" into a uint64_t as 2^64 - 1, and a number
// past 2^64 - 1 as 2^64 - 1, so three different seeds would give one run.
inline CLI::Validator uint64_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (text.empty() || ec != std::errc() || ptr != end)
          return "must be an integer in [0, 18446744073709551615], got '" + text + "'";
        return "";
      },
      "UINT64");
}

}  // namespace fsdp::tools
