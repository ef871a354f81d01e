// Note [RS ring]: the ring reclaims its oldest buffer first. Checked by the event each reclaim
// makes the compute stream wait on (the timeline names the op each awaited event followed), not
// by time: on the ring itself, and in training, where the compute stream's waits on
// reduce-scatters come in the order the reduce-scatters ran.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "core/rs_ring.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

// The ops each wait on `stream` waited for, in the order the stream ran them.
std::vector<std::string> waits_on(const Timeline& t, const std::string& stream) {
  std::vector<std::string> out;
  for (const TimelineOp& op : t.ops)
    if (op.kind == OpKind::Wait && op.stream >= 0 &&
        t.stream_names.at(static_cast<size_t>(op.stream)) == stream)
      out.push_back(op.waited_for);
  return out;
}

TEST(RsRingOrder, EachReserveWaitsForTheOldestEntrysEventAndDrainKeepsTheOrder) {
  static const char* const kLabels[] = {"RS 0", "RS 1", "RS 2", "RS 3", "RS 4", "RS 5", "RS 6"};
  constexpr int kEntries = 7;
  for (int k : {1, 2, 3}) {
    SCOPED_TRACE("capacity " + std::to_string(k));
    cpu::CpuWorld world(1, {});
    std::unique_ptr<Device> dev = world.make_device(0);
    Device& d = *dev;
    const Stream compute = d.create_stream("compute", StreamPriority::Normal);
    const Stream rs = d.create_stream("reduce-scatter", StreamPriority::High);
    std::vector<std::string> expected;
    {
      core::EventPool events(d);
      core::RsRing ring;
      ring.set_capacity(k);
      d.enable_timeline(true);
      void* scratch = d.alloc(64, rs, MemTag::Other);
      for (int i = 0; i < kEntries; ++i) {
        d.set_label("reserve");
        ring.reserve(d, compute, events, 0, 1);
        EXPECT_LT(static_cast<int>(ring.size()), k) << "room for entry " << i;
        // The entries a reserve reclaims are the oldest: entry i - k is the one that goes.
        if (i >= k) expected.push_back(kLabels[i - k]);
        void* buffer = d.alloc(64, compute, MemTag::RsInput);
        d.set_label(kLabels[i]);
        d.fill(rs, scratch, DType::F32, 16, static_cast<float>(i));  // "the reduce-scatter"
        core::RsRing::Entry e;
        e.buffer = buffer;
        e.done = events.acquire();
        e.group_index = 0;
        d.record_event(e.done, rs);
        ring.push(e);
        EXPECT_EQ(static_cast<int>(ring.size()), std::min(i + 1, k));
      }
      d.set_label("drain");
      ring.drain(d, compute, events);
      EXPECT_EQ(ring.size(), 0u);
      for (int i = std::max(kEntries - k, 0); i < kEntries; ++i) expected.push_back(kLabels[i]);
      d.free(scratch, rs);
      d.synchronize();
    }
    EXPECT_EQ(waits_on(d.take_timeline(), "compute"), expected);
  }
}

// In a training step each unit's reduce-scatter input goes into the ring in the order the
// reduce-scatters run; the compute stream's waits on them come in that same order, each once.
TEST(RsRingOrder, TrainingReclaimsReduceScatterInputsInTheOrderTheyRan) {
  for (int k : {1, 2, 3}) {
    SCOPED_TRACE("rs_max_input_buffers " + std::to_string(k));
    runtime::TrainConfig c;
    c.model.kind = "mlp";
    c.model.layers = 6;
    c.model.dim = 16;
    c.tokens = 4;
    c.steps = 1;
    c.timeline = true;
    c.rs_max_input_buffers = k;
    const auto r = run_fsdp(2, c);
    for (const runtime::RankResult& rank : r) {
      const Timeline& t = rank.timeline;
      std::vector<std::string> ran;  // the reduce-scatters, in the order their stream ran them
      for (const TimelineOp& op : t.ops)
        if (op.kind == OpKind::Collective && op.label.rfind("RS ", 0) == 0) ran.push_back(op.label);
      std::vector<std::string> reclaimed;
      for (const std::string& w : waits_on(t, "compute"))
        if (w.rfind("RS ", 0) == 0) reclaimed.push_back(w);
      ASSERT_EQ(ran.size(), 6u) << "one per block";
      EXPECT_EQ(reclaimed, ran) << "rank " << rank.rank;
    }
  }
}

}  // namespace
}  // namespace fsdp::testing
