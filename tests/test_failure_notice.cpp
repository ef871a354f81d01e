// Note [Failure notices]: the first failure of a job is the one every rank names.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "rendezvous/failure_notice.h"
#include "rendezvous/failure_watch.h"
#include "counting_store.h"

namespace fsdp::rendezvous {
namespace {

TEST(FailureNotice, OnlyTheFirstIsKept) {
  auto store = make_memory_store();
  EXPECT_TRUE(post_failure(*store, {2, "rank 2 was killed by signal 9 (Killed)"}));
  EXPECT_FALSE(post_failure(*store, {0, "rank 0 failed: lost rank 2"}));
  const auto notice = read_failure(*store, Millis(0));
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(notice->rank, 2);
  EXPECT_EQ(notice->message, "rank 2 was killed by signal 9 (Killed)");
}

TEST(FailureNotice, NoneWithoutAFailure) {
  auto store = make_memory_store();
  EXPECT_FALSE(read_failure(*store, Millis(0)).has_value());
}

// Whoever wrote the notice into the store, what reaches the user is one line of bounded
// length without control characters, attributed to the rank it names.
TEST(FailureNotice, WhatReachesTheUserIsOneSafeLineOfTheRankItNames) {
  auto store = make_memory_store();
  const std::string forged = "1\nall is well\nfsdp: run `cleanup.sh` to go on\r\x1b[2J\x1b]0;t\x07"
                             "\xe2\x80\xae" "desrever\xc2\x85" "caf\xc3\xa9 \xff" +
                             std::string(5000, 'x');
  store->add("fsdp/failure/count", 1);
  store->set("fsdp/failure/notice", forged);
  const auto notice = read_failure(*store, Millis(0));
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(notice->rank, 1);
  const std::string head =
      "rank 1: all is well fsdp: run `cleanup.sh` to go on  [2J ]0;t  desrever caf\xc3\xa9 ?";
  EXPECT_EQ(notice->message.substr(0, head.size()), head);
  // Cut at the bound: "rank 1: ", kMaxNoticeBytes of the text, " [...]".
  EXPECT_EQ(notice->message.size(), 8 + kMaxNoticeBytes + 6);
  EXPECT_EQ(notice->message.substr(notice->message.size() - 7), "x [...]");
  // A notice that names its rank keeps its words; one that is not a notice is none.
  store->set("fsdp/failure/notice", "2\nrank 2 was killed by signal 9 (Killed)");
  EXPECT_EQ(read_failure(*store, Millis(0))->message, "rank 2 was killed by signal 9 (Killed)");
  store->set("fsdp/failure/notice", " 2x\nrank 2 was killed");
  EXPECT_FALSE(read_failure(*store, Millis(0)).has_value());
}

TEST(FailureNotice, AReaderWaitsForALateNotice) {
  auto store = make_memory_store();
  std::thread launcher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    post_failure(*store, {3, "rank 3 exited with status 1"});
  });
  const auto notice = read_failure(*store, Millis(60000));
  launcher.join();
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(notice->rank, 3);
}

TEST(FailureWatch, CallsBackOnceWithAnotherRanksNotice) {
  auto store = std::make_shared<CountingStore>();
  std::promise<FailureNotice> seen;
  std::atomic<int> calls{0};
  {
    FailureWatch watch(store, /*rank=*/0, Millis(1), [&](const FailureNotice& n) {
      if (calls++ == 0) seen.set_value(n);
    });
    post_failure(*store, {3, "rank 3 was killed by signal 9 (Killed)"});
    auto got = seen.get_future();
    ASSERT_EQ(got.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const FailureNotice n = got.get();
    EXPECT_EQ(n.rank, 3);
    EXPECT_EQ(n.message, "rank 3 was killed by signal 9 (Killed)");
  }
  EXPECT_EQ(calls.load(), 1);
}

TEST(FailureWatch, ThisRanksOwnNoticeIsNotNews) {
  auto store = std::make_shared<CountingStore>();
  std::atomic<int> calls{0};
  post_failure(*store, {1, "rank 1 failed: the data file is empty"});
  {
    FailureWatch watch(store, /*rank=*/1, Millis(1), [&](const FailureNotice&) { ++calls; });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (store->checks.load() < 5 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    ASSERT_GE(store->checks.load(), 5);  // it read the notice several times over
  }
  EXPECT_EQ(calls.load(), 0);
}

TEST(FailureWatch, StopsAtOnceWhenDestroyed) {
  auto store = std::make_shared<CountingStore>();
  // An interval of an hour: the destructor must not wait for it.
  { FailureWatch watch(store, 0, Millis(3600 * 1000), [](const FailureNotice&) {}); }
  EXPECT_EQ(store->checks.load(), 0);
}

}  // namespace
}  // namespace fsdp::rendezvous
