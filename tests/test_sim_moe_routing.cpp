// The host's dropless MoE routing on the simulation backend (Note [Simulated host routing]):
// once the host has read the router's probabilities, or the combine weights' gradients, and
// waited for them, it works for the calibration's host.moe_route_us or moe_route_backward_us
// before it launches anything more; hand-computed on the virtual clock, so exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/sim/sim_backend.h"
#include "fsdp/error.h"
#include "runtime/launch_sim.h"

namespace fsdp::sim {
namespace {

constexpr double kExact = 1e-6;  // us

SimOptions routed(double route_us, double backward_us) {
  SimOptions o;
  o.gpus = o.gpus_per_node = 1;
  // 1000 GB/s for every kernel and host copy, no launch costs, no kernel minimum.
  o.calibration = ideal_calibration(1000, 100, 100);
  o.calibration.moe_route_us = route_us;
  o.calibration.moe_route_backward_us = backward_us;
  o.cost_log = true;
  return o;
}

double start_of(const Timeline& tl, const std::string& label) {
  for (const TimelineOp& op : tl.ops)
    if (op.label == label) return op.start_us;
  throw Error("no op labelled " + label);
}

// A softmax of 1000 x 8 bf16 logits writes fp32 probabilities: 1000 x 8 x (2 + 4) bytes, 0.048
// us at 1000 GB/s; reading them back is 32000 bytes, 0.032 us. The host has waited for them at
// 0.080 us, routes for 700 us, and launches the next op at 700.080. The combine weights'
// gradients (a row_dot of 1000 x 64 bf16 rows: 2 x 1000 x 64 x 2 + 4 x 1000 bytes, 0.260 us)
// read back (4000 bytes, 0.004 us) cost the host 90 us; any other buffer read back costs it
// nothing, and with the host's costs off (a captured step) neither costs anything.
TEST(SimHostRouting, TheHostRoutesAfterItWaitsForTheProbabilities) {
  for (const bool host_costs : {true, false}) {
    SimOptions o = routed(700, 90);
    o.host_costs = host_costs;
    SimWorld world(o);
    auto dev = world.make_device();
    const Stream s = dev->create_stream("compute", StreamPriority::Normal);
    void* x = dev->alloc(1 << 20, s, MemTag::Other);
    auto* probs = static_cast<float*>(dev->alloc(32000, s, MemTag::Other));
    auto* dw = static_cast<float*>(dev->alloc(4000, s, MemTag::Other));
    std::vector<float> host(8000);
    dev->synchronize();
    dev->enable_timeline(true);
    const double t0 = dev->now_us();
    dev->set_label("softmax");
    dev->softmax_rows(s, x, DType::BF16, probs, 1000, 8);
    dev->copy_to_host(s, host.data(), probs, 32000);
    dev->synchronize_stream(s);
    dev->set_label("dispatch");
    dev->fill(s, x, DType::F32, 250, 0.0f);  // 1000 bytes, 0.001 us
    dev->set_label("combine backward");
    dev->row_dot(s, x, x, DType::BF16, dw, 1, 1000, 64);
    dev->copy_to_host(s, host.data(), dw, 4000);
    dev->synchronize_stream(s);
    dev->set_label("router backward");
    dev->fill(s, x, DType::F32, 250, 0.0f);
    dev->copy_to_host(s, host.data(), x, 4000);  // no routing value: no host work
    dev->synchronize_stream(s);
    dev->set_label("after");
    dev->fill(s, x, DType::F32, 250, 0.0f);
    const Timeline tl = dev->take_timeline();
    const double route = host_costs ? 700 : 0, backward = host_costs ? 90 : 0;
    EXPECT_NEAR(start_of(tl, "dispatch") - t0, 0.048 + 0.032 + route, kExact) << host_costs;
    const double gradients = 0.048 + 0.032 + route + 0.001 + 0.260 + 0.004;
    EXPECT_NEAR(start_of(tl, "router backward") - t0, gradients + backward, kExact);
    EXPECT_NEAR(start_of(tl, "after") - t0, gradients + backward + 0.001 + 0.004, kExact);
    const CostLog log = world.cost_log();
    const auto route_entry = log.find({"softmax", "host_moe_route"});
    const auto backward_entry = log.find({"combine backward", "host_moe_route_backward"});
    ASSERT_EQ(route_entry != log.end(), host_costs);
    ASSERT_EQ(backward_entry != log.end(), host_costs);
    if (host_costs) {
      EXPECT_EQ(route_entry->second.ops, 1);
      EXPECT_NEAR(route_entry->second.us, 700, kExact);
      EXPECT_NEAR(backward_entry->second.us, 90, kExact);
    }
    dev->free(dw, s);
    dev->free(probs, s);
    dev->free(x, s);
  }
}

// A dropless MoE transformer trained on 1 GPU, 2 MoE layers of 4 (every other one), 2 steps:
// each MoE layer's forward and backward pay the host's routing once a step, so the cost log
// holds 4 routings and 4 router gradients, and in the timeline's step (the one after warm-up)
// the compute stream idles exactly 700 us after each layer reads its probabilities back and
// exactly 90 us after it reads the weights' gradients back (no launch costs: the host is
// otherwise ahead of the device). Without the costs it never idles that long.
TEST(SimHostRouting, EachDroplessMoeLayerPaysItsRoutingOnTheHost) {
  runtime::TrainConfig c;
  c.model.kind = "moe-transformer";
  c.model.layers = 4;
  c.model.dim = 256;
  c.model.heads = 4;
  c.model.experts = 8;
  c.model.top_k = 2;
  c.model.seq_len = 256;
  c.model.vocab = 256;
  c.model.capacity_factor = 0;
  c.tokens = 1024;
  c.steps = 2;
  c.warmup = 1;
  c.timeline = true;
  struct Run {
    std::vector<double> idle;  // the compute stream's gaps between consecutive ops
    CostLog log;
  };
  auto run = [&](double route_us, double backward_us) {
    SimWorld world(routed(route_us, backward_us));
    const runtime::RankResult r = runtime::run_simulated_training(world, c);
    std::vector<const TimelineOp*> compute;
    for (const TimelineOp& op : r.timeline.ops)
      if (op.kind != OpKind::Wait && op.kind != OpKind::Host &&
          r.timeline.stream_names.at(static_cast<size_t>(op.stream)) == "compute")
        compute.push_back(&op);
    std::sort(compute.begin(), compute.end(),
              [](const TimelineOp* a, const TimelineOp* b) { return a->start_us < b->start_us; });
    Run out{{}, world.cost_log()};
    for (size_t i = 1; i < compute.size(); ++i)
      out.idle.push_back(compute[i]->start_us - compute[i - 1]->end_us);
    return out;
  };
  const Run free_host = run(0, 0), routing = run(700, 90);
  auto gaps_of = [](const Run& r, double us) {
    return std::count_if(r.idle.begin(), r.idle.end(),
                         [us](double g) { return std::fabs(g - us) < kExact; });
  };
  EXPECT_EQ(gaps_of(routing, 700), 2);
  EXPECT_EQ(gaps_of(routing, 90), 2);
  EXPECT_LT(*std::max_element(free_host.idle.begin(), free_host.idle.end()), 90);
  int64_t routes = 0, backwards = 0;
  double host_us = 0;
  for (const auto& [key, e] : routing.log) {
    if (key.second == "host_moe_route") routes += e.ops;
    if (key.second == "host_moe_route_backward") backwards += e.ops;
    if (key.second.rfind("host_moe_route", 0) == 0) host_us += e.us;
  }
  EXPECT_EQ(routes, 4);
  EXPECT_EQ(backwards, 4);
  EXPECT_NEAR(host_us, 4 * (700 + 90), kExact);
  for (const auto& [key, e] : free_host.log) EXPECT_NE(key.second.rfind("host_moe", 0), 0u);
}

}  // namespace
}  // namespace fsdp::sim
