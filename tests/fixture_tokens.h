// Token batches given by a golden fixture (tests/fixtures/*.json: a list of {"ids", "labels"}),
// as a BatchSource: batch `index` of the run is the fixture's batch `index`.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/error.h"
#include "runtime/batch_source.h"

namespace fsdp::testing {

class FixtureTokens final : public runtime::BatchSource {
 public:
  explicit FixtureTokens(const nlohmann::json& batches) {
    for (const nlohmann::json& b : batches) {
      ids_.push_back(b.at("ids").get<std::vector<int32_t>>());
      labels_.push_back(b.at("labels").get<std::vector<int32_t>>());
    }
  }

  runtime::DeviceBatch make(Device& d, Stream s, int64_t index, int64_t first_row, int64_t rows,
                            DType) override {
    FSDP_CHECK(index >= 0 && index < static_cast<int64_t>(ids_.size()), "batch ", index,
               " is not in the fixture");
    const auto& ids = ids_[static_cast<size_t>(index)];
    FSDP_CHECK(first_row >= 0 && first_row + rows <= static_cast<int64_t>(ids.size()), "rows [",
               first_row, ", ", first_row + rows, ") are not in the fixture's batch");
    runtime::DeviceBatch out;
    out.tokens = rows;
    out.x = empty_tensor(d, s, DType::I32, rows, 1, MemTag::Activation);
    out.labels = empty_tensor(d, s, DType::I32, rows, 1, MemTag::Activation);
    d.copy_from_host(s, out.x.data, ids.data() + first_row, out.x.bytes());
    d.copy_from_host(s, out.labels.data, labels_[static_cast<size_t>(index)].data() + first_row,
                     out.labels.bytes());
    return out;
  }

 private:
  std::vector<std::vector<int32_t>> ids_, labels_;
};

}  // namespace fsdp::testing
