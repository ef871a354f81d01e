// Reading the JSON files that anyone may have written (Note [Checked JSON]).
//
// Note [Checked JSON]
// A checkpoint's index.json and COMPLETE, a safetensors header, a corpus's meta.json: every
// JSON file we parse is input, and nlohmann-json's own accessors answer bad input in the
// library's words ("[json.exception.out_of_range.403] key 'tensors' not found") or convert it
// silently (-1 read as a size). So every value is read through a JsonField, which checks that
// the key is there, the type, and the range, and raises one plain line that names the file and
// the key's path: "'ck/step-000003/index.json': tensors[2].shape[0] must be an integer in
// [0, 1099511627776], got -1". parse_json() refuses text nested deeper than kMaxJsonDepth
// (no file of ours nests more than 6; deeper text is made to exhaust a recursive reader), and
// callers bound the text's size before parsing (Note [Reading files]).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp::io {

inline constexpr int kMaxJsonDepth = 32;

class JsonField {
 public:
  // The root of a document; `file` names it in errors.
  JsonField(const nlohmann::json& root, std::shared_ptr<const std::string> file);

  const nlohmann::json& raw() const { return *value_; }
  const std::string& file() const { return *file_; }
  std::string where() const { return path_.empty() ? "the top level" : path_; }
  // "'<file>': <where> <problem>", as a UserError.
  [[noreturn]] void fail(const std::string& problem) const;

  bool is_object() const { return value_->is_object(); }
  bool is_array() const { return value_->is_array(); }
  bool is_string() const { return value_->is_string(); }
  // A member of this object (which must be an object): required, or absent as nullopt.
  JsonField operator[](const std::string& key) const;
  std::optional<JsonField> find(const std::string& key) const;
  // An array's elements / an object's members, at most `max_count` of them.
  std::vector<JsonField> elements(size_t max_count) const;
  std::vector<std::pair<std::string, JsonField>> members(size_t max_count) const;

  int64_t integer(int64_t lo, int64_t hi) const;
  uint64_t unsigned_integer(uint64_t hi) const;
  double number() const;  // finite
  bool boolean() const;
  std::string string(size_t max_bytes = 1 << 20) const;
  // Arrays of scalars, element by element checked; an error names the first bad element.
  std::vector<int64_t> integers(size_t max_count, int64_t lo, int64_t hi) const;
  std::vector<uint32_t> uint32s(size_t max_count) const;
  std::vector<std::string> strings(size_t max_count, size_t max_bytes = 4096) const;

 private:
  JsonField(const nlohmann::json* value, std::shared_ptr<const std::string> file, std::string path)
      : value_(value), file_(std::move(file)), path_(std::move(path)) {}
  JsonField member(const std::string& key, const nlohmann::json& v) const;
  JsonField element(size_t i, const nlohmann::json& v) const;
  std::string type_name() const;
  void expect_array(size_t max_count) const;

  const nlohmann::json* value_;
  std::shared_ptr<const std::string> file_;
  std::string path_;  // "tensors[2].shape"
};

// A parsed file: the value and the name its errors use.
struct JsonDocument {
  nlohmann::json value;
  std::shared_ptr<const std::string> file;
  JsonField root() const { return JsonField(value, file); }
};

// `s` fit for a one-line error: control bytes as \xNN, cut to `max_bytes` with "...".
std::string printable(const std::string& s, size_t max_bytes = 96);

// Parses `text` read from `file`; one-line errors for invalid or too deeply nested JSON.
JsonDocument parse_json(const std::string& text, const std::string& file);

}  // namespace fsdp::io
