// Names of the fp8 formats and recipes (include/fsdp/fp8.h).
#include "fsdp/fp8.h"

#include "fsdp/error.h"

namespace fsdp {

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

const char* fp8_recipe_name(Fp8Recipe r) {
  return r == Fp8Recipe::None ? "none" : r == Fp8Recipe::Tensorwise ? "tensorwise" : "rowwise";
}

Fp8Recipe parse_fp8_recipe(const std::string& s) {
  if (s == "none") return Fp8Recipe::None;
  if (s == "tensorwise") return Fp8Recipe::Tensorwise;
  if (s == "rowwise") return Fp8Recipe::Rowwise;
  throw OptionError::of(OptionName{"fp8"}, " must be none, tensorwise or rowwise, got '", s, "'");
}

}  // namespace fsdp
