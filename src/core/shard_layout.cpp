#include "core/shard_layout.h"

#include "fsdp/error.h"

namespace fsdp::core {

GroupLayout make_group_layout(const std::vector<std::vector<int64_t>>& shapes, int world) {
  FSDP_CHECK(world >= 1, "world size must be >= 1, got ", world);
  GroupLayout layout;
  layout.world = world;
  for (const auto& shape : shapes) {
    ShardSlice s;
    s.rows = shape.empty() ? 1 : shape[0];
    s.cols = 1;
    for (size_t d = 1; d < shape.size(); ++d) s.cols *= shape[d];
    FSDP_CHECK(s.rows > 0 && s.cols > 0, "cannot shard an empty parameter");
    s.rows_per_rank = (s.rows + world - 1) / world;
    s.offset = layout.shard_numel;
    layout.shard_numel += s.rows_per_rank * s.cols;
    layout.slices.push_back(s);
  }
  layout.views_suffice =
      world == 1 || (layout.slices.size() == 1 && layout.slices[0].rows % world == 0);
  return layout;
}

std::vector<float> shard_of(const GroupLayout& layout, int rank,
                            const std::vector<const std::vector<float>*>& full_values) {
  FSDP_CHECK(full_values.size() == layout.slices.size(), "expected ", layout.slices.size(),
             " params, got ", full_values.size());
  std::vector<float> shard(static_cast<size_t>(layout.shard_numel), 0.0f);
  for (size_t p = 0; p < layout.slices.size(); ++p) {
    const ShardSlice& s = layout.slices[p];
    const std::vector<float>& full = *full_values[p];
    FSDP_CHECK(static_cast<int64_t>(full.size()) == s.rows * s.cols, "param ", p, " has ",
               full.size(), " initial values, its shape needs ", s.rows * s.cols);
    for (int64_t j = 0; j < s.rows_per_rank; ++j) {
      const int64_t row = rank * s.rows_per_rank + j;
      if (row >= s.rows) break;
      for (int64_t c = 0; c < s.cols; ++c)
        shard[s.offset + j * s.cols + c] = full[row * s.cols + c];
    }
  }
  return shard;
}

std::vector<float> unshard_param(const GroupLayout& layout, int index,
                                 const std::vector<float>& gathered) {
  const ShardSlice& s = layout.slices.at(index);
  std::vector<float> full(static_cast<size_t>(s.rows * s.cols));
  for (int64_t i = 0; i < s.rows; ++i) {
    const int64_t r = i / s.rows_per_rank, j = i % s.rows_per_rank;
    for (int64_t c = 0; c < s.cols; ++c)
      full[i * s.cols + c] = gathered[r * layout.shard_numel + s.offset + j * s.cols + c];
  }
  return full;
}

}  // namespace fsdp::core
