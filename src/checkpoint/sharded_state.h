// What a checkpoint saves and loads on one rank: every param's shard, unpadded, with the
// optimizer's state at the same place (Note [Shard layout] in src/core/shard_layout.h).
#pragma once

#include <cstdint>
#include <functional>
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
  std::vector<int64_t> shape;  // the global shape (an expert param: every expert's rows)
  int64_t cols = 1;            // elements per dim-0 row
  RowRange rows;               // the global rows this rank holds
  std::vector<RowRange> rank_rows;  // every rank's global rows (the index's "ranks")
  float* param = nullptr;      // device: those rows, row-major (the padding follows them)
  std::vector<float*> states;  // device, same layout, one per optimizer state name
  int group = 0;               // the optimizer tensor (param group) it belongs to
};

struct ShardedState {
  int rank = 0, world = 1;  // on the root's mesh (HSDP: within the shard group)
  // HSDP: which replica this rank belongs to. Every replica holds the same shards, so only
  // replica 0 saves; every replica loads its shard rank's rows (docs/hsdp.md).
  int replica = 0;
  std::vector<ShardView> tensors;        // in module pre-order
  std::vector<std::string> state_names;  // AdamW: exp_avg, exp_avg_sq; SGD: momentum_buffer
  optim::Optimizer* optimizer = nullptr; // null: params only
  std::string optimizer_kind;
};

// Note [Expert params in checkpoints]
// With expert parallelism (docs/moe.md) a rank's expert param [E / ep, ...] is its ep block of
// a global [E, ...] tensor, sharded over the efsdp mesh. A checkpoint describes it as the
// global tensor: rank r (ep rank r % ep, efsdp rank r / ep) holds global rows
// (r % ep) * E_local + its efsdp rows of E_local. Each rank saves its own rows and the index
// lists every rank's range, so the saved ranks' files hold every expert once, and a load (of
// any world size and ep, which only changes which rows a rank reads) or `fsdp export`
// reassembles them by rows like any other param.
struct ExpertLayout {
  int ep = 1;
  std::function<bool(const Module& owner)> is_expert;  // params of the expert modules
};

// `optimizer` may be null (params only). Its tensors must be in sharded_groups(root) order,
// as the trainer builds them. `experts`: Note [Expert params in checkpoints].
ShardedState collect_sharded_state(FsdpModule& root, optim::Optimizer* optimizer,
                                   const ExpertLayout& experts = {});

// Each param's fully qualified name: its module's fqn, a dot, its local name.
std::string param_fqn(const Module& owner, const Param& param);

}  // namespace fsdp::checkpoint
