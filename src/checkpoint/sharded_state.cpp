#include "checkpoint/sharded_state.h"

#include <algorithm>
#include <map>

#include "core/fsdp_state.h"
#include "fsdp/error.h"

namespace fsdp::checkpoint {

RowRange rows_of_rank(int64_t rows, int world, int rank) {
  const int64_t per_rank = (rows + world - 1) / world;
  RowRange r;
  r.begin = std::min(rows, rank * per_rank);
  r.end = std::min(rows, (rank + 1) * per_rank);
  return r;
}

std::string param_fqn(const Module& owner, const Param& param) {
  return owner.fqn().empty() ? param.name() : owner.fqn() + "." + param.name();
}

ShardedState collect_sharded_state(FsdpModule& root, optim::Optimizer* optimizer,
                                   const ExpertLayout& experts) {
  ShardedState out;
  Module& top = root.module();
  std::map<const Param*, std::string> names;
  std::map<const Param*, bool> expert;
  top.visit([&](Module& m) {
    const bool e = experts.ep > 1 && experts.is_expert && experts.is_expert(m);
    for (const auto& p : m.params()) {
      names[p.get()] = param_fqn(m, *p);
      expert[p.get()] = e;
    }
  });
  out.rank = root.state().mesh.rank();
  out.world = root.state().mesh.size();  // HSDP: the shard group's
  out.replica = root.state().mesh.replicate_rank();
  const int ep = std::max(1, experts.ep);
  FSDP_CHECK(out.world % ep == 0, "ep ", ep, " does not divide the world of ", out.world);
  out.optimizer = optimizer;
  if (optimizer) {
    out.optimizer_kind = optimizer->config().kind;
    out.state_names = out.optimizer_kind == "adamw"
                          ? std::vector<std::string>{"exp_avg", "exp_avg_sq"}
                          : std::vector<std::string>{"momentum_buffer"};
  }
  int ordinal = 0;  // the order of sharded_groups(root), which the optimizer's tensors follow
  top.visit([&](Module& m) {
    core::FsdpState* s = core::state_of(m);
    if (!s) return;
    for (auto& g : s->groups) {
      const core::GroupLayout& layout = g->layout();
      const OptimTensor* t = nullptr;
      if (optimizer) {
        FSDP_CHECK(ordinal < static_cast<int>(optimizer->tensors().size()) &&
                       optimizer->tensors()[ordinal].param == g->shard_param(),
                   "the optimizer's tensors do not follow the param groups' order");
        t = &optimizer->tensors()[ordinal];
      }
      for (size_t i = 0; i < g->params().size(); ++i) {
        const Param* p = g->params()[i];
        const ShardSlice& slice = layout.slices[i];
        ShardView v;
        v.fqn = names.at(p);
        v.shape = p->shape();
        v.cols = slice.cols;
        if (expert.at(p)) {  // Note [Expert params in checkpoints]
          FSDP_CHECK(layout.world == out.world / ep && g->mesh().rank() == out.rank / ep,
                     "expert param '", v.fqn, "' is not on the efsdp mesh of ep ", ep);
          v.shape.at(0) = slice.rows * ep;
          for (int r = 0; r < out.world; ++r) {
            RowRange rr = rows_of_rank(slice.rows, out.world / ep, r / ep);
            const int64_t first = (r % ep) * slice.rows;
            v.rank_rows.push_back({first + rr.begin, first + rr.end});
          }
        } else {
          FSDP_CHECK(layout.world == out.world && g->mesh().rank() == out.rank, "param '", v.fqn,
                     "' is sharded over another mesh than the root's (", layout.world, " ranks)");
          for (int r = 0; r < out.world; ++r)
            v.rank_rows.push_back(rows_of_rank(slice.rows, out.world, r));
        }
        v.rows = v.rank_rows.at(static_cast<size_t>(out.rank));
        v.param = g->shard_param() + slice.offset;
        if (t) {
          v.states.push_back(t->state0 + slice.offset);
          if (out.state_names.size() > 1) v.states.push_back(t->state1 + slice.offset);
        }
        v.group = ordinal;
        out.tensors.push_back(std::move(v));
      }
      ++ordinal;
    }
  });
  return out;
}

}  // namespace fsdp::checkpoint
