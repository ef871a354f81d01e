// The in-process rendezvous store: values, counters, and timeouts that name what is missing.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "fsdp/error.h"
#include "rendezvous/store.h"
#include "counting_store.h"

namespace fsdp::rendezvous {
namespace {

TEST(MemoryStore, SetGetAddAndCheck) {
  auto store = make_memory_store();
  store->set("a", "hello");
  EXPECT_EQ(store->get("a", Millis(10)), "hello");
  EXPECT_EQ(store->add("n", 3), 3);
  EXPECT_EQ(store->add("n", -1), 2);
  EXPECT_EQ(store->check({"a", "b", "n"}), (std::vector<bool>{true, false, true}));
}

TEST(MemoryStore, GetWaitsForAnotherThread) {
  auto store = make_memory_store();
  std::thread writer([&] { store->set("late", "v"); });
  EXPECT_EQ(store->get("late", Millis(10000)), "v");
  writer.join();
}

TEST(MemoryStore, GetTimesOutNamingTheKey) {
  auto store = make_memory_store();
  try {
    store->get("nccl_id", Millis(5));
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nccl_id' was not set"), std::string::npos) << e.what();
  }
}

TEST(MemoryStore, BarrierNamesTheRanksThatNeverArrived) {
  auto store = make_memory_store();
  PrefixStore job("job", store);
  job.set("barrier/start/1", "1");  // rank 1 arrived; ranks 2 and 3 never do
  try {
    job.barrier("start", 0, 4, Millis(20));
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 2 and 3 of 4 never arrived"), std::string::npos)
        << e.what();
  }
}

TEST(MemoryStore, BarrierReturnsOnceEveryRankArrives) {
  auto store = make_memory_store();
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] { store->barrier("go", r, 4, Millis(60000)); });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(store->check({"barrier/go/3"}), std::vector<bool>{true});
}

// A barrier that completes polls its counter only (CountingStore, counting_store.h), so its
// cost per poll does not grow with the ranks.
TEST(MemoryStore, ABarrierThatCompletesChecksNoRankKeys) {
  CountingStore store;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 16; ++r)
    ranks.emplace_back([&, r] { store.barrier("go", r, 16, Millis(60000)); });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(store.checked_keys.load(), 0);
  EXPECT_EQ(store.get("barrier/go/count", Millis(0)), "16");
}

TEST(DescribeRanks, ReadsAsEnglish) {
  EXPECT_EQ(describe_ranks({3}), "rank 3");
  EXPECT_EQ(describe_ranks({2, 3}), "ranks 2 and 3");
  EXPECT_EQ(describe_ranks({1, 2, 5}), "ranks 1, 2 and 5");
}

}  // namespace
}  // namespace fsdp::rendezvous
