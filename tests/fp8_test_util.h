// What the fp8 training tests share: the tiny fp8 config, bitwise comparison of two runs,
// and a communicator that records every collective (its kind, communicator and bytes).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace fsdp::testing {

inline runtime::TrainConfig fp8_config(Fp8Recipe recipe, int steps = 3) {
  runtime::TrainConfig c = tiny_transformer_config(steps);
  c.param_dtype = DType::BF16;
  c.fp8 = recipe;
  c.optimizer.adamw.lr = 3e-3f;
  return c;
}

inline void expect_bitwise(const runtime::RankResult& a, const runtime::RankResult& b,
                    const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t s = 0; s < a.losses.size(); ++s) EXPECT_EQ(a.losses[s], b.losses[s]) << what << " step " << s;
  EXPECT_EQ(a.params, b.params) << what;
}

struct Collective {
  std::string comm;
  int comm_size;
  CollectiveKind kind;
  ReduceOp op;
  int64_t bytes;  // what this rank sends (all-gather: its chunk)
};

// Forwards to a communicator and records every collective issued on it or its splits.
class RecordingComm final : public Comm {
 public:
  RecordingComm(std::shared_ptr<Comm> inner, std::vector<Collective>* log)
      : Comm(inner->rank(), inner->world_ranks(), inner->name()), inner_(std::move(inner)), log_(log) {}

 protected:
  void note(CollectiveKind k, int64_t count, DType t, ReduceOp op = ReduceOp::Sum) {
    log_->push_back({name(), size(), k, op, count * static_cast<int64_t>(dtype_size(t))});
  }
  void do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) override {
    note(CollectiveKind::AllGather, count, t);
    inner_->all_gather(send, recv, count, t, s);
  }
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                         Stream s) override {
    note(CollectiveKind::ReduceScatter, count, t, op);
    inner_->reduce_scatter(send, recv, count, t, op, s);
  }
  void do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                     Stream s) override {
    note(CollectiveKind::AllReduce, count, t, op);
    inner_->all_reduce(send, recv, count, t, op, s);
  }
  void do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) override {
    note(CollectiveKind::Broadcast, count, t);
    inner_->broadcast(buf, count, t, root, s);
  }
  void do_all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, DType t, Stream s) override {
    note(CollectiveKind::AllToAll, 0, t);
    inner_->all_to_all(send, send_counts, recv, recv_counts, t, s);
  }
  std::unique_ptr<Comm> do_split(int color, int key, const std::string& name) override {
    std::unique_ptr<Comm> c = inner_->split(color, key, name);
    if (!c) return nullptr;
    return std::make_unique<RecordingComm>(std::shared_ptr<Comm>(std::move(c)), log_);
  }
  std::unique_ptr<Comm> do_split_groups(int group_size, int stride, int, const std::string& name) override {
    return std::make_unique<RecordingComm>(
        std::shared_ptr<Comm>(inner_->split_groups(group_size, stride, name)), log_);
  }

 private:
  std::shared_ptr<Comm> inner_;
  std::vector<Collective>* log_;
};

inline std::vector<std::vector<Collective>> record(int world, const runtime::TrainConfig& c) {
  std::vector<std::vector<Collective>> logs(world);
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    runtime::train_rank(device, std::make_shared<RecordingComm>(comm, &logs[rank]), c);
  });
  return logs;
}

inline std::vector<Collective> only(const std::vector<Collective>& log, CollectiveKind k,
                             std::optional<ReduceOp> op = std::nullopt) {
  std::vector<Collective> out;
  for (const Collective& c : log)
    if (c.kind == k && (!op || c.op == *op)) out.push_back(c);
  return out;
}

}  // namespace fsdp::testing
