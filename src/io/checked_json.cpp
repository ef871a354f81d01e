#include "io/checked_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "fsdp/error.h"

namespace fsdp::io {

std::string printable(const std::string& s, size_t max_bytes) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max_bytes) return out + "...";
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

JsonField::JsonField(const nlohmann::json& root, std::shared_ptr<const std::string> file)
    : value_(&root), file_(std::move(file)) {}

void JsonField::fail(const std::string& problem) const {
  FSDP_USER_FAIL("'", printable(*file_, 4096), "': ", where(), " ", problem);
}

std::string JsonField::type_name() const {
  const nlohmann::json& v = *value_;
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  if (v.is_number_float()) return "the number " + printable(v.dump(), 40);
  return "the integer " + printable(v.dump(), 40);
}

JsonField JsonField::member(const std::string& key, const nlohmann::json& v) const {
  const std::string name = printable(key, 64);
  return JsonField(&v, file_, path_.empty() ? name : path_ + "." + name);
}

JsonField JsonField::element(size_t i, const nlohmann::json& v) const {
  return JsonField(
      &v, file_,
      (path_.empty() ? std::string("the element") : path_) + "[" + std::to_string(i) + "]");
}

JsonField JsonField::operator[](const std::string& key) const {
  std::optional<JsonField> f = find(key);
  if (!f) {
    const std::string name = printable(key, 64);
    FSDP_USER_FAIL("'", printable(*file_, 4096), "': ", path_.empty() ? name : path_ + "." + name,
                   " is missing");
  }
  return *f;
}

std::optional<JsonField> JsonField::find(const std::string& key) const {
  if (!value_->is_object()) fail("must be an object, not " + type_name());
  auto it = value_->find(key);
  if (it == value_->end()) return std::nullopt;
  return member(key, *it);
}

void JsonField::expect_array(size_t max_count) const {
  if (!value_->is_array()) fail("must be an array, not " + type_name());
  if (value_->size() > max_count)
    fail("has " + std::to_string(value_->size()) + " elements, more than the " +
         std::to_string(max_count) + " it may have");
}

std::vector<JsonField> JsonField::elements(size_t max_count) const {
  expect_array(max_count);
  std::vector<JsonField> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i) out.push_back(element(i, (*value_)[i]));
  return out;
}

std::vector<std::pair<std::string, JsonField>> JsonField::members(size_t max_count) const {
  if (!value_->is_object()) fail("must be an object, not " + type_name());
  if (value_->size() > max_count)
    fail("has " + std::to_string(value_->size()) + " members, more than the " +
         std::to_string(max_count) + " it may have");
  std::vector<std::pair<std::string, JsonField>> out;
  out.reserve(value_->size());
  for (auto it = value_->begin(); it != value_->end(); ++it)
    out.emplace_back(it.key(), member(it.key(), it.value()));
  return out;
}

int64_t JsonField::integer(int64_t lo, int64_t hi) const {
  const nlohmann::json& v = *value_;
  bool ok = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    ok = true;
    x = v.get<int64_t>();
  }
  if (!ok || x < lo || x > hi)
    fail("must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " +
         type_name());
  return x;
}

uint64_t JsonField::unsigned_integer(uint64_t hi) const {
  const nlohmann::json& v = *value_;
  const bool ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  if (!ok || v.get<uint64_t>() > hi)
    fail("must be an integer in [0, " + std::to_string(hi) + "], not " + type_name());
  return v.get<uint64_t>();
}

double JsonField::number() const {
  if (!value_->is_number()) fail("must be a number, not " + type_name());
  const double x = value_->get<double>();
  if (!std::isfinite(x)) fail("must be a finite number, not " + type_name());
  return x;
}

bool JsonField::boolean() const {
  if (!value_->is_boolean()) fail("must be true or false, not " + type_name());
  return value_->get<bool>();
}

std::string JsonField::string(size_t max_bytes) const {
  if (!value_->is_string()) fail("must be a string, not " + type_name());
  const std::string& s = value_->get_ref<const std::string&>();
  if (s.size() > max_bytes)
    fail("is a string of " + std::to_string(s.size()) + " bytes, more than the " +
         std::to_string(max_bytes) + " it may have");
  return s;
}

std::vector<int64_t> JsonField::integers(size_t max_count, int64_t lo, int64_t hi) const {
  expect_array(max_count);
  std::vector<int64_t> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i)
    out.push_back(element(i, (*value_)[i]).integer(lo, hi));
  return out;
}

std::vector<uint32_t> JsonField::uint32s(size_t max_count) const {
  expect_array(max_count);
  std::vector<uint32_t> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i) {
    const nlohmann::json& v = (*value_)[i];
    // The fast path: a list of millions of chunk CRCs builds no key path unless one is bad.
    if (v.is_number_unsigned() && v.get<uint64_t>() <= 0xffffffffu)
      out.push_back(static_cast<uint32_t>(v.get<uint64_t>()));
    else
      out.push_back(static_cast<uint32_t>(element(i, v).unsigned_integer(0xffffffffu)));
  }
  return out;
}

std::vector<std::string> JsonField::strings(size_t max_count, size_t max_bytes) const {
  expect_array(max_count);
  std::vector<std::string> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i)
    out.push_back(element(i, (*value_)[i]).string(max_bytes));
  return out;
}

namespace {

// The deepest nesting of arrays and objects in `text`, counted outside strings; stops
// counting past `limit`.
int nesting_depth(const std::string& text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

JsonDocument parse_json(const std::string& text, const std::string& file) {
  JsonDocument doc;
  doc.file = std::make_shared<const std::string>(file);
  FSDP_USER_CHECK(nesting_depth(text, kMaxJsonDepth) <= kMaxJsonDepth, "'", printable(file, 4096),
                  "' is corrupt: its JSON nests deeper than ", kMaxJsonDepth, " levels");
  try {
    doc.value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    FSDP_USER_FAIL("'", printable(file, 4096), "' is corrupt: not valid JSON (at byte ", e.byte,
                   ")");
  } catch (const nlohmann::json::exception&) {  // a number too large for a double, say
    FSDP_USER_FAIL("'", printable(file, 4096),
                   "' is corrupt: not valid JSON (a value out of range)");
  }
  return doc;
}

}  // namespace fsdp::io
