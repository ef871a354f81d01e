#include "checkpoint/sharded_state.h"

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

ShardedState collect_sharded_state(FsdpModule& root, optim::Optimizer* optimizer) {
  ShardedState out;
  Module& top = root.module();
  std::map<const Param*, std::string> names;
  top.visit([&](Module& m) {
    for (const auto& p : m.params()) names[p.get()] = param_fqn(m, *p);
  });
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
      out.rank = g->mesh().rank();
      out.world = layout.world;
      out.replica = g->mesh().replicate_rank();
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
        v.rows = rows_of_rank(slice.rows, layout.world, g->mesh().rank());
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
