// Note [Shard layout]
// Every param is sharded on dim 0 with torch.chunk semantics and padding: with R rows and
// world size W, each rank owns rows_per_rank = ceil(R / W) rows; rank r owns rows
// [r * P, min((r + 1) * P, R)) and the rest of its P rows are zero padding. A param group
// stores its params' shards back to back in one flat fp32 buffer of shard_numel elements:
// param p sits at `offset` and takes P * C elements. So
//   - the all-gather input is the flat shard cast to the param dtype, and the all-gather
//     output is [W][shard_numel], rank-major;
//   - unsharded row i of p lives at gathered[(i / P) * shard_numel + offset + (i % P) * C];
//   - the reduce-scatter input has the same [W][shard_numel] layout, built from the grads by
//     one fused copy-in that pads, interleaves per rank and casts;
//   - padding stays zero forever: its grad is zero and AdamW/SGD keep a zero param at zero.
// When W == 1, or a group holds one param whose R divides by W, the all-gather output *is*
// the unsharded param(s) and no copy-out is needed (views).
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/device.h"

namespace fsdp::core {

struct GroupLayout {
  std::vector<ShardSlice> slices;
  int64_t shard_numel = 0;
  int world = 1;
  bool views_suffice = false;  // the AG output can serve as the unsharded params directly
};

GroupLayout make_group_layout(const std::vector<std::vector<int64_t>>& shapes, int world);

// This rank's flat shard of the group, from the params' full host values.
std::vector<float> shard_of(const GroupLayout& layout, int rank,
                            const std::vector<const std::vector<float>*>& full_values);

// The inverse: full values of param `index` from the gathered [W][shard_numel] buffer.
std::vector<float> unshard_param(const GroupLayout& layout, int index,
                                 const std::vector<float>& gathered);

}  // namespace fsdp::core
