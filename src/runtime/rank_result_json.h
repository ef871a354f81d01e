// A rank's RankResult as JSON, for ranks that are processes: the launcher's children send
// theirs back to the parent this way (GPU ranks, and CPU ranks as processes). Every field of
// Note [Result fields] travels under its own name.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/trainer.h"

namespace fsdp::runtime {

std::string rank_result_to_json(const RankResult& r);
// A result that lacks a field, has one this build does not know, or holds a value of the
// wrong kind is an error naming the field.
RankResult rank_result_from_json(const std::string& text);

// One field's value as JSON, as it travels and as the summary writes it.
template <class T>
nlohmann::json field_to_json(const T& value) {
  return value;
}
nlohmann::json field_to_json(const MemStats& m);
nlohmann::json field_to_json(const Timeline& t);
// {"dp/shard": {"all_gather": 4, "reduce_scatter": 0, ...}, ...}: every kind, by its name.
nlohmann::json field_to_json(const CountsByComm& counts);

}  // namespace fsdp::runtime
