// Note [Failure notices]: the first failure of a job is the one every rank names.
#include <gtest/gtest.h>

#include <thread>

#include "rendezvous/failure_notice.h"

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

}  // namespace
}  // namespace fsdp::rendezvous
