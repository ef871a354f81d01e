// Note [One-rank collectives]: over one rank an in-place all-gather or reduce-scatter is the
// identity, so Comm counts it as issued and the backend is never asked to run it; anything
// else still reaches the backend.
#include <gtest/gtest.h>

#include "fsdp/comm.h"

namespace fsdp {
namespace {

class CountingComm final : public Comm {
 public:
  explicit CountingComm(int world) : Comm(0, ranks(world), "counting") {}
  int launched = 0;

 protected:
  void do_all_gather(const void*, void*, int64_t, DType, Stream) override { ++launched; }
  void do_reduce_scatter(const void*, void*, int64_t, DType, ReduceOp, Stream) override {
    ++launched;
  }
  void do_all_reduce(const void*, void*, int64_t, DType, ReduceOp, Stream) override { ++launched; }
  void do_broadcast(void*, int64_t, DType, int, Stream) override { ++launched; }
  void do_all_to_all(const void*, const std::vector<int64_t>&, void*, const std::vector<int64_t>&,
                     DType, Stream) override {
    ++launched;
  }
  std::unique_ptr<Comm> do_split(int, int, const std::string&) override { return nullptr; }

 private:
  static std::vector<int> ranks(int world) {
    std::vector<int> r(static_cast<size_t>(world));
    for (int i = 0; i < world; ++i) r[static_cast<size_t>(i)] = i;
    return r;
  }
};

TEST(OneRankCollectives, InPlaceAllGatherAndReduceScatterLaunchNothing) {
  float a[4] = {}, b[4] = {};
  CountingComm one(1);
  one.all_gather(a, a, 4, DType::F32, Stream{0});
  one.reduce_scatter(a, a, 4, DType::F32, ReduceOp::Avg, Stream{0});
  one.reduce_scatter(a, a, 4, DType::F32, ReduceOp::Sum, Stream{0});
  EXPECT_EQ(one.launched, 0);
  EXPECT_EQ(one.issued(CollectiveKind::AllGather), 1);
  EXPECT_EQ(one.issued(CollectiveKind::ReduceScatter), 2);
  // Out of place, the output must be written: the backend runs it.
  one.all_gather(a, b, 4, DType::F32, Stream{0});
  one.reduce_scatter(a, b, 4, DType::F32, ReduceOp::Avg, Stream{0});
  EXPECT_EQ(one.launched, 2);
}

TEST(OneRankCollectives, TwoRanksAlwaysLaunch) {
  float a[8] = {};
  CountingComm two(2);
  two.all_gather(a, a, 4, DType::F32, Stream{0});
  two.reduce_scatter(a, a, 4, DType::F32, ReduceOp::Avg, Stream{0});
  EXPECT_EQ(two.launched, 2);
}

}  // namespace
}  // namespace fsdp
