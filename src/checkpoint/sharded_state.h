// What a checkpoint saves and loads on one rank: every param's shard, unpadded, with the
// optimizer's state at the same place (Note [Shard layout] in src/core/shard_layout.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/optim.h"

namespace fsdp::checkpoint {

// Rows [r * P, min((r + 1) * P, R)) of an R-row param on rank r of `world`, P = ceil(R / W);
// empty ([R, R)) for ranks past the last row.
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t rows() const { return end - begin; }
};
RowRange rows_of_rank(int64_t rows, int world, int rank);

struct ShardView {
  std::string fqn;             // "layers.3.weight"
  std::vector<int64_t> shape;  // the global shape
  int64_t cols = 1;            // elements per dim-0 row
  RowRange rows;               // the global rows this rank holds
  float* param = nullptr;      // device: those rows, row-major (the padding follows them)
  std::vector<float*> states;  // device, same layout, one per optimizer state name
  int group = 0;               // the optimizer tensor (param group) it belongs to
};

struct ShardedState {
  int rank = 0, world = 1;  // in the shard group (HSDP: within one replica)
  // HSDP: which replica this rank belongs to. Every replica holds the same shards, so only
  // replica 0 saves; every replica loads its shard rank's rows (docs/hsdp.md).
  int replica = 0;
  std::vector<ShardView> tensors;        // in module pre-order
  std::vector<std::string> state_names;  // AdamW: exp_avg, exp_avg_sq; SGD: momentum_buffer
  optim::Optimizer* optimizer = nullptr; // null: params only
  std::string optimizer_kind;
};

// `optimizer` may be null (params only). Its tensors must be in sharded_groups(root) order,
// as the trainer builds them.
ShardedState collect_sharded_state(FsdpModule& root, optim::Optimizer* optimizer);

// Each param's fully qualified name: its module's fqn, a dot, its local name.
std::string param_fqn(const Module& owner, const Param& param);

}  // namespace fsdp::checkpoint
