// Reading the JSON of tokenizer files: a nesting bound while parsing, and objects read key by
// key so that a key nobody reads is refused (Note [Tokenizer files are refused, not guessed]).
#pragma once

#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "tokenizer/tokenizer.h"

namespace fsdp::tokenizer::json_reading {

using json = nlohmann::json;

struct TooDeep {};

// Parses with a nesting bound: deep nesting would only cost memory here, never mean anything.
inline json parse_bounded(std::string_view text, const std::string& name) {
  const json::parser_callback_t depth_check = [](int depth, json::parse_event_t, json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), depth_check);
  } catch (const TooDeep&) {
    FSDP_USER_FAIL(name, ": JSON nested deeper than ", kMaxJsonDepth, " levels");
  } catch (const json::exception& e) {
    FSDP_USER_FAIL(name, ": not valid JSON: ", e.what());
  }
}

inline std::string type_name(const json& v) {
  return v.type_name();
}

// One JSON object of the file, read key by key: each key is taken once, and done() refuses
// the keys nobody took, so an unknown setting is never skipped in silence.
class Object {
 public:
  // `where` is the object's path in the file ("model", "added_tokens[3]"; "" for the top).
  Object(const json& v, std::string where, const std::string& name)
      : v_(v), where_(std::move(where)), name_(name) {
    if (!v.is_object()) fail("is ", type_name(v), ", not an object");
  }
  const std::string& where() const { return where_; }
  std::string at(const std::string& key) const { return where_.empty() ? key : where_ + "." + key; }

  // The value of `key`, or nullptr when absent.
  const json* get(const std::string& key) {
    taken_.insert(key);
    const auto it = v_.find(key);
    return it == v_.end() ? nullptr : &*it;
  }
  const json& need(const std::string& key) {
    const json* v = get(key);
    if (v == nullptr) fail("has no \"", key, "\"");
    return *v;
  }
  std::string string(const std::string& key) {
    const json& v = need(key);
    if (!v.is_string()) fail_key(key, "is ", type_name(v), ", not a string");
    return v.get<std::string>();
  }
  bool boolean(const std::string& key, bool absent) {
    const json* v = get(key);
    if (v == nullptr || v->is_null()) return absent;
    if (!v->is_boolean()) fail_key(key, "is ", type_name(*v), ", not true or false");
    return v->get<bool>();
  }
  // Keys that do not change a single text's ids (offsets, pair templates), taken unread.
  void ignore(const std::string& key) { taken_.insert(key); }
  // `what`: what an unknown key may change.
  void done(const char* what = "the ids") const {
    for (const auto& [key, value] : v_.items())
      if (!taken_.count(key))
        fail("has the key \"", key,
             "\", which this reader does not know (refused rather "
             "than ignored: it may change ",
             what, ")");
  }
  // Requires `key`, when present and not null, to be `want` (a setting whose other values
  // change the ids).
  void require_bool(const std::string& key, bool want, const char* why) {
    const json* v = get(key);
    if (v == nullptr || v->is_null()) return;
    if (!v->is_boolean()) fail_key(key, "is ", type_name(*v), ", not true or false");
    if (v->get<bool>() != want)
      fail_key(key, "is ", want ? "false" : "true", ", which this reader does not support (", why,
               ")");
  }

  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    FSDP_USER_FAIL(name_, ": ", where_.empty() ? "the file" : where_, " ", parts...);
  }
  template <typename... Parts>
  [[noreturn]] void fail_key(const std::string& key, const Parts&... parts) const {
    FSDP_USER_FAIL(name_, ": ", at(key), " ", parts...);
  }
  // For an element of an array under `key`: "model.merges[3] ...".
  template <typename... Parts>
  [[noreturn]] void fail_item(const std::string& key, size_t index, const Parts&... parts) const {
    FSDP_USER_FAIL(name_, ": ", at(key), "[", index, "]", parts...);
  }

 private:
  const json& v_;
  std::string where_;
  const std::string& name_;
  std::set<std::string> taken_;
};

}  // namespace fsdp::tokenizer::json_reading
