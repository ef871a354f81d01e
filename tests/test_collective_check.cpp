// Collective fingerprints (include/fsdp/collective_check.h, Note [Collective fingerprints]):
// ranks that issue different collectives get one error naming both sides, on every rank,
// before the collective runs; ranks that issue the same train exactly as without the check,
// with the same collective counts.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"  // first: it names ::testing inside fsdp, before fsdp::testing exists
#include "command_util.h"
#include "fsdp/collective_check.h"
#include "fsdp/error.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

using cpu::cpu_test::Floats;
using cpu::cpu_test::upload;

// Runs fn(rank, device, checked world) on one thread per rank; returns each rank's error
// ("" when it ended cleanly). The world is never aborted, so each error is the rank's own.
std::vector<std::string> run_checked(int world_size,
                                     const std::function<void(int, Device&, Comm&, Stream)>& fn) {
  cpu::CpuOptions options;
  options.collective_timeout_s = 20;  // a bound on a failure, never reached when the check works
  cpu::CpuWorld world(world_size, options);
  std::vector<std::string> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      this_thread_identity() = {r, "cpu:" + std::to_string(r)};
      try {
        auto device = world.make_device(r);
        std::shared_ptr<Comm> raw = world.make_world_comm(r, *device);
        std::shared_ptr<Comm> comm = with_collective_checks(raw, *device);
        const Stream s = device->create_stream("s", StreamPriority::Normal);
        fn(r, *device, *comm, s);
        device->synchronize();
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Buffers for a collective of `count` fp32 elements per member on a communicator of `size`.
struct Buffers {
  Buffers(Device& d, Stream s, int size, int64_t count)
      : device(d), stream(s), in(upload(d, s, Floats(size * count, 1.0f), DType::F32)),
        out(d.alloc(size * count * sizeof(float), s, MemTag::Other)) {}
  ~Buffers() {
    try {
      device.synchronize();  // may rethrow a failure that the test itself reports
    } catch (const Error&) {
    }
    device.free(in, stream);
    device.free(out, stream);
  }
  Device& device;
  Stream stream;
  void* in;
  void* out;
};

TEST(CollectiveCheck, DifferentOpsOnTwoRanksNameBothSides) {
  const auto errors = run_checked(2, [](int rank, Device& dev, Comm& comm, Stream s) {
    Buffers b(dev, s, 2, 1024);
    if (rank == 0)
      comm.all_gather(b.in, b.out, 1024, DType::F32, s);
    else
      comm.reduce_scatter(b.in, b.out, 1024, DType::F32, ReduceOp::Sum, s);
  });
  for (int r : {0, 1}) {
    EXPECT_TRUE(contains(errors[r], "collective 0 on 'world': rank 0 issued all_gather of 4096 "
                                    "bytes (fp32), rank 1 issued reduce_scatter (sum) of 8192 "
                                    "bytes (fp32)"))
        << errors[r];
    EXPECT_TRUE(contains(errors[r], "[rank " + std::to_string(r))) << errors[r];
  }
}

// Both ranks issue an all_reduce and an all_gather, in opposite orders.
TEST(CollectiveCheck, SwappedOrderOnTwoRanksIsCaughtAtTheFirstCollective) {
  const auto errors = run_checked(2, [](int rank, Device& dev, Comm& comm, Stream s) {
    Buffers b(dev, s, 2, 8);
    auto reduce = [&] { comm.all_reduce(b.in, b.out, 8, DType::F32, ReduceOp::Avg, s); };
    auto gather = [&] { comm.all_gather(b.in, b.out, 8, DType::F32, s); };
    if (rank == 0) reduce(), gather();
    else gather(), reduce();
  });
  for (int r : {0, 1})
    EXPECT_TRUE(contains(errors[r], "collective 0 on 'world': rank 0 issued all_reduce (avg) of "
                                    "32 bytes (fp32), rank 1 issued all_gather of 32 bytes (fp32)"))
        << errors[r];
}

// Four ranks agree on collective 0; rank 2 reduces twice as many elements at collective 1.
TEST(CollectiveCheck, AByteCountMismatchOnFourRanksNamesTheOddRank) {
  const auto errors = run_checked(4, [](int rank, Device& dev, Comm& comm, Stream s) {
    Buffers b(dev, s, 4, 16);
    comm.broadcast(b.in, 16, DType::F32, 1, s);
    comm.all_reduce(b.in, b.out, rank == 2 ? 16 : 8, DType::F32, ReduceOp::Sum, s);
  });
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(contains(errors[r], "collective 1 on 'world': rank 0 issued all_reduce (sum) of "
                                    "32 bytes (fp32), rank 2 issued all_reduce (sum) of 64 bytes "
                                    "(fp32)"))
        << errors[r];
}

// A communicator split from a checked one is checked, and its errors name global ranks; the
// other pair, which agrees, finishes.
TEST(CollectiveCheck, SplitCommunicatorsAreCheckedAndNameGlobalRanks) {
  const auto errors = run_checked(4, [](int rank, Device& dev, Comm& comm, Stream s) {
    std::unique_ptr<Comm> pair = comm.split(rank / 2, rank, "pair");
    Buffers b(dev, s, 2, 4);
    pair->all_gather(b.in, b.out, rank == 3 ? 2 : 4, DType::F32, s);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (int r : {2, 3})
    EXPECT_TRUE(contains(errors[r], "collective 0 on 'pair': rank 2 issued all_gather of 16 bytes "
                                    "(fp32), rank 3 issued all_gather of 8 bytes (fp32)"))
        << errors[r];
}

// Matching collectives give the same results through the check, and issued() counts only them.
TEST(CollectiveCheck, MatchedCollectivesRunAndOnlyTheyAreCounted) {
  const auto errors = run_checked(2, [](int rank, Device& dev, Comm& comm, Stream s) {
    const std::vector<float> mine(4, static_cast<float>(rank + 1));
    void* x = upload(dev, s, mine, DType::F32);
    void* sum = dev.alloc(4 * sizeof(float), s, MemTag::Other);
    comm.all_reduce(x, sum, 4, DType::F32, ReduceOp::Sum, s);
    comm.all_reduce(x, sum, 4, DType::F32, ReduceOp::Sum, s);
    std::vector<float> got(4);
    dev.copy_to_host(s, got.data(), sum, 4 * sizeof(float));
    dev.synchronize();
    dev.free(x, s);
    dev.free(sum, s);
    FSDP_CHECK(got == std::vector<float>(4, 3.0f), "all_reduce through the check gave ", got[0]);
    FSDP_CHECK(comm.issued(CollectiveKind::AllReduce) == 2 &&
                   comm.issued(CollectiveKind::AllGather) == 0,
               "issued counts the fingerprint exchanges: ",
               comm.issued(CollectiveKind::AllGather), " all-gathers");
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

runtime::TrainConfig small_config() {
  runtime::TrainConfig c;
  c.model.kind = "resmlp";
  c.model.layers = 2;
  c.model.dim = 16;
  c.model.classes = 4;
  c.tokens = 8;
  c.steps = 3;
  c.separate_rs_group = true;  // a split-off communicator, checked too
  return c;
}

void expect_same_training(int world, RanksAs as = RanksAs::Threads) {
  runtime::TrainConfig off = small_config(), on = small_config();
  on.check_collectives = true;
  const auto plain = run_fsdp(world, off, {}, as);
  const auto checked = run_fsdp(world, on, {}, as);
  ASSERT_EQ(checked.size(), plain.size());
  for (size_t r = 0; r < plain.size(); ++r) {
    EXPECT_EQ(checked[r].losses, plain[r].losses) << "rank " << r;
    EXPECT_EQ(checked[r].grad_norms, plain[r].grad_norms) << "rank " << r;
    EXPECT_EQ(checked[r].all_gathers_forward_first_step, plain[r].all_gathers_forward_first_step);
    EXPECT_EQ(checked[r].all_gathers_backward_first_step, plain[r].all_gathers_backward_first_step);
    EXPECT_EQ(checked[r].reduce_scatters_first_step, plain[r].reduce_scatters_first_step);
  }
  // resmlp, 2 blocks: one all-gather per block and one for the root in forward; the counts
  // are the trainer's (Comm::issued on the checked communicators, without the exchanges).
  EXPECT_EQ(checked[0].all_gathers_forward_first_step, 3);
}

TEST(CollectiveCheck, TrainingIsIdenticalWithTheCheckOnTwoRanks) { expect_same_training(2); }
TEST(CollectiveCheck, TrainingIsIdenticalWithTheCheckOnFourRanks) { expect_same_training(4); }
// Over Gloo (ranks as processes): the check is in the Comm wrapper, so any backend has it.
TEST(CollectiveCheck, TrainingIsIdenticalWithTheCheckOnTwoRankProcesses) {
  FSDP_SKIP_WITHOUT_PROCESSES(RanksAs::Processes);
  expect_same_training(2, RanksAs::Processes);
}

// One rank builds a wider model than the others: its first all-gather moves more bytes.
std::string first_error_of_mismatched_training(int world, int odd_rank) {
  try {
    runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
      runtime::TrainConfig c = small_config();
      c.check_collectives = true;
      if (rank == odd_rank) c.model.dim = 32;
      runtime::train_rank(device, comm, c);
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CollectiveCheck, RanksThatBuiltDifferentModelsFailNamingBothSides) {
  for (auto [world, odd] : {std::pair{2, 1}, std::pair{4, 3}}) {
    const std::string e = first_error_of_mismatched_training(world, odd);
    // Collective 0 is the split of the reduce-scatter communicator, which all ranks agree on.
    EXPECT_TRUE(contains(e, "collective 1 on 'world': rank 0 issued all_gather of ")) << e;
    EXPECT_TRUE(contains(e, ", rank " + std::to_string(odd) + " issued all_gather of ")) << e;
  }
}

std::vector<float> losses_in(const std::string& json_path) {
  std::ifstream in(json_path);
  return nlohmann::json::parse(in)["losses"].get<std::vector<float>>();
}

TEST(CollectiveCheck, TheTrainCommandTrainsIdenticallyWithTheFlag) {
  const std::string common =
      "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 16 --tokens 8 --steps 3 "
      "--quiet --json ";
  const std::string off_json = ::testing::TempDir() + "check_off.json";
  const std::string on_json = ::testing::TempDir() + "check_on.json";
  const CommandResult off = run_fsdp_command(common + off_json);
  const CommandResult on = run_fsdp_command(common + on_json + " --check-collectives --timeout 30");
  ASSERT_EQ(off.code, 0) << off.output;
  ASSERT_EQ(on.code, 0) << on.output;
  EXPECT_EQ(losses_in(on_json).size(), 3u);
  EXPECT_EQ(losses_in(on_json), losses_in(off_json));
}

TEST(CollectiveCheck, ANegativeTimeoutIsAOneLineError) {
  const CommandResult r = run_fsdp_command("train --backend cpu --steps 1 --quiet --timeout -1");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.output, "--timeout")) << r.output;
}

}  // namespace
}  // namespace fsdp::testing
