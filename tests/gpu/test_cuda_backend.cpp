// GPU tests of the CUDA backend: host copies, memory counters, events, the timeline and
// NcclComm (1 rank in-process; 2 ranks on 2 threads when 2 GPUs are visible). The compute ops
// against host references are in test_cuda_kernels.cpp; the fixture is in cuda_test_util.h.
// Without a GPU the binary prints SKIPPED and exits 77 (ctest's SKIP_RETURN_CODE).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "fsdp/error.h"

namespace fsdp {
namespace {

using cuda_test::CudaBackendTest;
using cuda_test::kNaN;

TEST_F(CudaBackendTest, CopyFromHostDoesNotNeedTheHostBufferAfterReturn) {
  for (size_t n : {size_t{1000}, size_t{1} << 20}) {  // staged, and the large (synced) path
    std::vector<float> host = random(n);
    const std::vector<float> original = host;
    void* d = buffer(DType::F32, static_cast<int64_t>(n));
    device->spin(s, 5000);  // the copy queues behind this
    device->copy_from_host(s, d, host.data(), n * sizeof(float));
    std::fill(host.begin(), host.end(), -7.0f);
    EXPECT_EQ(read(d, DType::F32, static_cast<int64_t>(n)), original) << n;
  }
}

TEST_F(CudaBackendTest, MemoryCountersAreExactPerTag) {
  auto tag = [](MemTag t) { return static_cast<int>(t); };
  void* shard = device->alloc(100, s, MemTag::ShardedState);
  void* rs[3];
  for (void*& p : rs) p = device->alloc(1000, s, MemTag::RsInput);
  void* empty = device->alloc(0, s, MemTag::Other);
  device->free(rs[0], s);
  MemStats m = device->memory_stats();
  EXPECT_EQ(m.current_bytes, 2100);
  EXPECT_EQ(m.peak_bytes, 3100);
  EXPECT_EQ(m.tag_bytes[tag(MemTag::RsInput)], 2000);
  EXPECT_EQ(m.tag_peak_bytes[tag(MemTag::RsInput)], 3000);
  EXPECT_EQ(m.tag_live[tag(MemTag::RsInput)], 2);
  EXPECT_EQ(m.tag_peak_live[tag(MemTag::RsInput)], 3);
  EXPECT_EQ(m.tag_live[tag(MemTag::Other)], 1);
  EXPECT_EQ(m.tag_bytes[tag(MemTag::ShardedState)], 100);
  device->reset_peak_memory();
  m = device->memory_stats();
  EXPECT_EQ(m.peak_bytes, 2100);
  EXPECT_EQ(m.tag_peak_live[tag(MemTag::RsInput)], 2);
  EXPECT_THROW(device->free(rs[0], s), Error);  // double free
  for (void* p : {shard, rs[1], rs[2], empty}) device->free(p, s);
  m = device->memory_stats();
  EXPECT_EQ(m.current_bytes, 0);
  for (int t = 0; t < kMemTagCount; ++t) EXPECT_EQ(m.tag_live[t], 0);
  int not_device_memory = 0;
  EXPECT_THROW(device->free(&not_device_memory, s), Error);
}

TEST_F(CudaBackendTest, EventsOrderWorkAcrossStreams) {
  const Stream a = device->create_stream("a", StreamPriority::High);
  const Stream b = device->create_stream("b", StreamPriority::Normal);
  const int64_t n = 1 << 20;
  void* x = device->alloc(n * 4, a, MemTag::Other);
  void* y = buffer(DType::BF16, n);
  // Warm up: the first launch of a kernel may load its module (lazy loading) and sync. The
  // synchronize() calls also make the stream-ordered allocations usable on every stream.
  device->spin(a, 1);
  device->fill(a, x, DType::F32, n, 0.0f);
  device->synchronize();
  device->cast(b, y, DType::BF16, x, DType::F32, n);
  device->fill(b, y, DType::BF16, n, kNaN);
  device->synchronize();
  const Event e = device->create_event();
  device->wait_event(b, e);  // never recorded: a no-op
  device->spin(a, 20000);
  device->fill(a, x, DType::F32, n, 1.0f);
  device->record_event(e, a);
  device->wait_event(b, e);
  device->cast(b, y, DType::BF16, x, DType::F32, n);
  EXPECT_FALSE(device->query_event(e));  // 20 ms of spin are still running
  device->synchronize_stream(b);
  EXPECT_TRUE(device->query_event(e));
  EXPECT_EQ(read(y, DType::BF16, n), std::vector<float>(n, 1.0f));
  device->free(x, a);
  device->destroy_event(e);
  EXPECT_THROW(device->record_event(e, a), Error);
  EXPECT_THROW(device->fill(Stream{99}, y, DType::BF16, 1, 0.0f), Error);
}

TEST_F(CudaBackendTest, TimelineRecordsOpsWaitsHostSpansAndMemory) {
  const Stream side = device->create_stream("side", StreamPriority::High);
  device->spin(side, 1);  // warm up (module loading) outside the measured spin
  device->synchronize();
  const double t0 = device->now_us();
  device->enable_timeline(true);
  const Event never = device->create_event();
  device->set_label("wait never");
  device->wait_event(s, never);  // never recorded: a no-op, no Wait op
  device->set_label("spin side");
  device->spin(side, 2000);
  const Event e = device->create_event();
  device->record_event(e, side);
  device->set_label("fill main");
  void* p = device->alloc(4096, s, MemTag::Activation);
  device->fill(s, p, DType::F32, 1024, 1.0f);
  device->set_label("wait main");
  device->wait_event(s, e);
  device->record_host_span("host work", device->now_us(), device->now_us() + 5);
  device->free(p, s);
  const Timeline tl = device->take_timeline();
  const double t1 = device->now_us();
  device->enable_timeline(false);
  ASSERT_EQ(tl.stream_names.size(), 2u);
  EXPECT_EQ(tl.stream_names[side.id], "side");
  const TimelineOp *spin = nullptr, *wait = nullptr, *fill = nullptr, *host = nullptr;
  for (const TimelineOp& op : tl.ops) {
    EXPECT_LE(op.start_us, op.end_us) << op.label;
    EXPECT_GE(op.start_us, t0 - 1000) << op.label;
    EXPECT_LE(op.end_us, t1 + 1000) << op.label;
    if (op.label == "spin side") spin = &op;
    if (op.label == "wait main" && op.kind == OpKind::Wait) wait = &op;
    if (op.label == "fill main") fill = &op;
    if (op.kind == OpKind::Host) host = &op;
    EXPECT_NE(op.label, "wait never");
  }
  ASSERT_TRUE(spin && wait && fill && host);
  EXPECT_EQ(spin->stream, side.id);
  EXPECT_NEAR(spin->end_us - spin->start_us, 2000, 500);
  EXPECT_EQ(wait->waited_for, "spin side");
  EXPECT_GE(wait->end_us, spin->end_us - 50);
  EXPECT_EQ(host->stream, -1);
  ASSERT_EQ(tl.memory.size(), 2u);
  EXPECT_EQ(tl.memory[0].bytes, 4096);
  EXPECT_EQ(tl.memory[1].bytes, 0);
  device->destroy_event(e);
  device->destroy_event(never);
  EXPECT_TRUE(device->take_timeline().ops.empty());
}

// The collectives every rank runs; `world` ranks, this one is `rank`.
void check_collectives(Device& device, Comm& comm, int rank, int world) {
  const Stream s = device.create_stream("comm", StreamPriority::High);
  const int64_t count = 1000;
  std::vector<float> mine(count);
  for (int64_t i = 0; i < count; ++i) mine[i] = static_cast<float>(rank * 10000 + i);
  auto* recv = static_cast<float*>(device.alloc(world * count * 4, s, MemTag::AllGather));
  device.copy_from_host(s, recv + rank * count, mine.data(), count * 4);
  comm.all_gather(recv + rank * count, recv, count, DType::F32, s);  // in place
  std::vector<float> all(world * count), one(count);
  device.copy_to_host(s, all.data(), recv, all.size() * 4);
  device.synchronize_stream(s);
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < count; i += 97) ASSERT_EQ(all[r * count + i], r * 10000 + i);
  auto* out = static_cast<float*>(device.alloc(count * 4, s, MemTag::RsOutput));
  comm.reduce_scatter(recv, out, count, DType::F32, ReduceOp::Avg, s);  // chunk r of everyone
  device.copy_to_host(s, one.data(), out, count * 4);
  device.synchronize_stream(s);
  for (int64_t i = 0; i < count; i += 97) ASSERT_EQ(one[i], rank * 10000 + i);
  comm.all_reduce(out, out, count, DType::F32, ReduceOp::Sum, s);
  comm.broadcast(out, count, DType::F32, world - 1, s);
  device.copy_to_host(s, one.data(), out, count * 4);
  device.synchronize_stream(s);
  double want = 0;
  for (int r = 0; r < world; ++r) want += r * 10000 + 5;
  ASSERT_EQ(one[5], want);
  auto reversed = comm.split(0, world - 1 - rank, "reversed");
  ASSERT_TRUE(reversed);
  EXPECT_EQ(reversed->rank(), world - 1 - rank);
  std::vector<int> expect_ranks(world);
  for (int r = 0; r < world; ++r) expect_ranks[r] = world - 1 - r;
  EXPECT_EQ(reversed->world_ranks(), expect_ranks);
  EXPECT_EQ(comm.split(rank == 0 ? 0 : -1, 0, "only0") != nullptr, rank == 0);
  EXPECT_EQ(comm.issued(CollectiveKind::AllGather), 1);
  device.free(recv, s);
  device.free(out, s);
  device.synchronize();
}

TEST_F(CudaBackendTest, NcclCommWithOneRank) {
  auto comm = cuda::make_world_comm(*device, cuda::make_unique_id(), 0, 1);
  EXPECT_EQ(comm->size(), 1);
  device->enable_timeline(true);
  check_collectives(*device, *comm, 0, 1);
  int collectives = 0;
  for (const TimelineOp& op : device->take_timeline().ops)
    collectives += op.kind == OpKind::Collective;
  // The in-place all-gather launches nothing over one rank (Note [One-rank collectives]); the
  // out-of-place reduce-scatter, the all-reduce and the broadcast run.
  EXPECT_EQ(collectives, 3);
}

TEST(CudaBackendTwoGpus, NcclCommAcrossTwoRanks) {
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const cuda::UniqueId id = cuda::make_unique_id();
  std::string errors[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        auto device = cuda::make_device(r);
        auto comm = cuda::make_world_comm(*device, id, r, 2);
        check_collectives(*device, *comm, r, 2);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace fsdp

int main(int argc, char** argv) {
  if (fsdp::cuda::device_count() == 0) {
    std::printf("SKIPPED: no CUDA GPU present; GPU tests need a machine with an NVIDIA GPU\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
