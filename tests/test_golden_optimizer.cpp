// The optimizer's path as the trainer drives it (LrSchedule -> Optimizer::begin_step -> step
// scalars in device memory -> the CPU kernel) against PyTorch's own torch.optim.AdamW,
// torch.optim.SGD, LambdaLR and clip_grad_norm_, in float64 (tests/fixtures/golden_optim.json,
// made by tests/fixtures/make_golden.py). Nothing here is computed by the engine's code on
// both sides: an error in the bias corrections, the lr or the step count shows.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "fsdp/dtype.h"
#include "fsdp/launch.h"
#include "fsdp/optim.h"
#include "golden_fixture.h"
#include "optim/lr_schedule.h"

namespace fsdp::testing {
namespace {

using nlohmann::json;
using Tensors = std::vector<std::vector<float>>;

const json& fixture() {
  static const json j = golden_fixture("golden_optim.json");
  return j;
}

const json& optimizer_case(const std::string& name) {
  for (const json& c : fixture().at("optimizers"))
    if (c.at("name") == name) return c;
  ADD_FAILURE() << "no case " << name;
  static const json none = json::object();
  return none;
}

optim::OptimizerConfig config_of(const json& c) {
  optim::OptimizerConfig o;
  o.kind = c.at("kind").get<std::string>();
  if (o.kind == "adamw") {
    o.adamw.lr = c.at("lr").get<float>();
    o.adamw.beta1 = c.at("betas").at(0).get<float>();
    o.adamw.beta2 = c.at("betas").at(1).get<float>();
    o.adamw.eps = c.at("eps").get<float>();
    o.adamw.weight_decay = c.at("weight_decay").get<float>();
  } else {
    o.sgd_lr = c.at("lr").get<float>();
    o.sgd_momentum = c.at("momentum").get<float>();
    o.sgd_weight_decay = c.at("weight_decay").get<float>();
  }
  o.max_grad_norm = c.at("max_grad_norm").get<float>();
  return o;
}

optim::LrSchedule schedule_of(const json& c) {
  optim::LrSchedule s;
  s.kind = c.at("schedule").at("kind").get<std::string>();
  s.warmup_steps = c.at("schedule").at("warmup_steps").get<int>();
  s.min_lr = c.at("schedule").at("min_lr").get<float>();
  s.total_steps = c.at("steps").get<int>();
  return s;
}

// How the step reaches the kernel: the step after backward, each tensor's step in backward
// with the grad as the reduce-scatter left it (Note [Optimizer in backward]), or the step split
// into the next forward, writing a bf16 copy of each param (Note [Optimizer in forward]).
enum class Path { Step, StepOneBf16Grads, DeferredBf16Copies };

struct Trajectory {
  std::vector<Tensors> params;  // after each step
  std::vector<Tensors> copies;  // DeferredBf16Copies: the bf16 copies, as floats
  std::vector<float> lrs, grad_norms;
};

// Runs the case's steps on one CPU device as the trainer does. With resume_at > 0, the
// optimizer is rebuilt after that many steps from its state and step count, as a resumed
// checkpoint rebuilds it (set_step_count).
Trajectory run_case(const json& c, Path path, int resume_at = 0) {
  cpu::CpuWorld world(1, {});
  std::unique_ptr<Device> dev = world.make_device(0);
  Device& d = *dev;
  const Stream s = d.create_stream("compute", StreamPriority::Normal);
  const optim::OptimizerConfig config = config_of(c);
  const optim::LrSchedule schedule = schedule_of(c);
  const Tensors params0 = c.at("params0").get<Tensors>();
  std::vector<float*> params, grads;
  std::vector<void*> extra;  // bf16 grads or copies
  for (const auto& p : params0) {
    const size_t bytes = p.size() * sizeof(float);
    params.push_back(static_cast<float*>(d.alloc(bytes, s, MemTag::ShardedState)));
    d.copy_from_host(s, params.back(), p.data(), bytes);
    grads.push_back(static_cast<float*>(d.alloc(bytes, s, MemTag::ShardedState)));
    extra.push_back(d.alloc(p.size() * 2, s, MemTag::Other));
  }
  auto spans = [&] {
    std::vector<optim::ParamSpan> out;
    for (size_t i = 0; i < params.size(); ++i)
      out.push_back({params[i], grads[i], static_cast<int64_t>(params0[i].size()), nullptr,
                     "tensor " + std::to_string(i)});
    return out;
  };
  auto optimizer = std::make_unique<optim::Optimizer>(d, s, spans(), config);
  // The split step's owner (Note [Optimizer in forward's owner]), remade with the optimizer.
  auto in_forward = std::make_unique<optim::OptimizerInForward>(*optimizer, s);
  auto download = [&](const void* p, size_t n, DType t) {
    std::vector<uint16_t> half(n);
    std::vector<float> out(n);
    if (t == DType::F32) d.copy_to_host(s, out.data(), p, n * sizeof(float));
    else d.copy_to_host(s, half.data(), p, n * 2);
    d.synchronize_stream(s);
    if (t == DType::BF16)
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(half[i]);
    return out;
  };

  Trajectory out;
  const auto all_grads = c.at("grads").get<std::vector<Tensors>>();
  for (int step = 0; step < static_cast<int>(all_grads.size()); ++step) {
    if (resume_at > 0 && step == resume_at) {
      // What a checkpoint holds: each tensor's state buffers and the step count.
      std::vector<Tensors> states;
      for (const OptimTensor& t : optimizer->tensors()) {
        Tensors one;
        for (const float* b : {t.state0, t.state1})
          if (b) one.push_back(download(b, static_cast<size_t>(t.numel), DType::F32));
        states.push_back(one);
      }
      const int64_t count = optimizer->step_count();
      in_forward.reset();
      optimizer = std::make_unique<optim::Optimizer>(d, s, spans(), config);
      in_forward = std::make_unique<optim::OptimizerInForward>(*optimizer, s);
      for (size_t i = 0; i < states.size(); ++i) {
        const OptimTensor& t = optimizer->tensors()[i];
        float* bufs[2] = {t.state0, t.state1};
        for (size_t k = 0; k < states[i].size(); ++k)
          d.copy_from_host(s, bufs[k], states[i][k].data(), states[i][k].size() * sizeof(float));
      }
      optimizer->set_step_count(count);
    }
    const float lr = schedule.at(step, config.base_lr());
    out.lrs.push_back(lr);
    optimizer->begin_step(s, lr);
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::vector<float>& g = all_grads[step][i];
      d.copy_from_host(s, grads[i], g.data(), g.size() * sizeof(float));
    }
    if (path == Path::StepOneBf16Grads) {
      for (size_t i = 0; i < grads.size(); ++i) {
        std::vector<uint16_t> half;
        for (float v : all_grads[step][i]) half.push_back(float_to_bf16(v));
        d.copy_from_host(s, extra[i], half.data(), half.size() * 2);
        optimizer->step_one(s, static_cast<int>(i), extra[i], DType::BF16);
      }
    } else {
      if (config.max_grad_norm > 0) {
        optimizer->compute_grad_squares(s);
        const auto sq = download(optimizer->grad_squares(), optimizer->grad_square_names().size(),
                                 DType::F32);
        double sum = 0;
        for (float v : sq) sum += v;
        out.grad_norms.push_back(static_cast<float>(std::sqrt(sum)));
      }
      if (path == Path::Step) {
        optimizer->step(s);
      } else {
        in_forward->defer(s, std::vector<bool>(params.size(), true));
        for (size_t i = 0; i < params.size(); ++i)
          in_forward->run(s, static_cast<int>(i), extra[i], DType::BF16);
      }
    }
    Tensors now, copies;
    for (size_t i = 0; i < params.size(); ++i) {
      now.push_back(download(params[i], params0[i].size(), DType::F32));
      if (path == Path::DeferredBf16Copies)
        copies.push_back(download(extra[i], params0[i].size(), DType::BF16));
    }
    out.params.push_back(now);
    out.copies.push_back(copies);
  }
  in_forward.reset();
  optimizer.reset();
  for (size_t i = 0; i < params.size(); ++i) {
    d.free(params[i], s);
    d.free(grads[i], s);
    d.free(extra[i], s);
  }
  d.synchronize();
  return out;
}

// fp32 against float64: a few fp32 roundings per step, over a handful of steps.
constexpr double kRel = 2e-6, kFloor = 1e-2;

void expect_trajectory(const json& c, const Trajectory& t, bool bf16_copies = false) {
  const std::string name = c.at("name").get<std::string>();
  const auto want = c.at("expected").get<std::vector<std::vector<std::vector<double>>>>();
  ASSERT_EQ(t.params.size(), want.size()) << name;
  expect_close(t.lrs, c.at("lrs").get<std::vector<double>>(), 3e-7, 0, name + " lr");
  if (c.at("max_grad_norm").get<double>() > 0)
    expect_close(t.grad_norms, c.at("grad_norms").get<std::vector<double>>(), 1e-6, 0,
                 name + " grad norm");
  for (size_t step = 0; step < want.size(); ++step)
    for (size_t i = 0; i < want[step].size(); ++i) {
      const std::string what = name + " step " + std::to_string(step + 1) + " tensor " + std::to_string(i);
      expect_close(t.params[step][i], want[step][i], kRel, kFloor, what);
      // A bf16 copy is PyTorch's param rounded once: within half a bf16 ulp of it (2^-8
      // relative: bf16 keeps 8 significant bits), plus the fp32 error above.
      if (bf16_copies) expect_close(t.copies[step][i], want[step][i], 0x1p-8 + 1e-5, 0, what + " bf16 copy");
    }
}

TEST(GoldenAdamW, StepsWithWeightDecayAndWarmUpMatchTorch) {
  for (const char* name : {"adamw", "adamw_llama"}) {
    SCOPED_TRACE(name);
    expect_trajectory(optimizer_case(name), run_case(optimizer_case(name), Path::Step));
  }
}

// The first update is the one the bias corrections scale most (1 - beta^1): checked on its own,
// so a wrong step count names itself.
TEST(GoldenAdamW, FirstUpdateIsTorchsBiasCorrectedStep) {
  const json& c = optimizer_case("adamw");
  const Trajectory t = run_case(c, Path::Step);
  const auto want = c.at("expected").at(0).get<std::vector<std::vector<double>>>();
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(t.params.at(0)[i], want[i], kRel, kFloor, "step 1 tensor " + std::to_string(i));
}

TEST(GoldenAdamW, Bf16GradsStepInBackwardAsTorchOnRoundedGrads) {
  const json& c = optimizer_case("adamw_bf16_grads");
  expect_trajectory(c, run_case(c, Path::StepOneBf16Grads));
}

TEST(GoldenAdamW, DeferredStepWritesTorchsParamsAndTheirBf16Copies) {
  const json& c = optimizer_case("adamw");
  expect_trajectory(c, run_case(c, Path::DeferredBf16Copies), /*bf16_copies=*/true);
}

TEST(GoldenAdamW, ClippedStepsMatchClipGradNormThenAdamW) {
  const json& c = optimizer_case("adamw_clipped");
  expect_trajectory(c, run_case(c, Path::Step));
  expect_trajectory(c, run_case(c, Path::DeferredBf16Copies), /*bf16_copies=*/true);
}

// A resumed optimizer continues PyTorch's bias corrections from the saved step count.
TEST(GoldenAdamW, ResumedFromItsStateAndStepCountContinuesTorchsSteps) {
  for (const char* name : {"adamw", "adamw_clipped"}) {
    SCOPED_TRACE(name);
    expect_trajectory(optimizer_case(name), run_case(optimizer_case(name), Path::Step, 3));
  }
}

TEST(GoldenSgd, MomentumWeightDecayAndClippingMatchTorch) {
  for (const char* name : {"sgd", "sgd_plain", "sgd_clipped"}) {
    SCOPED_TRACE(name);
    expect_trajectory(optimizer_case(name), run_case(optimizer_case(name), Path::Step));
    expect_trajectory(optimizer_case(name), run_case(optimizer_case(name), Path::Step, 2));
  }
}

// ---- global-norm clipping: SGD with lr 1 from zero params leaves -(the clipped grads).

struct ClipResult {
  Tensors params;
  float norm = 0;
};

// The case's grads, each tensor split over `world` ranks (rank r holds elements
// [r n / world, (r + 1) n / world) of a tensor zero-padded to a multiple of world, as FSDP
// shards it); each rank's slices, put back together.
ClipResult clip_on_ranks(const json& c, int world) {
  const Tensors grads = c.at("grads").get<Tensors>();
  ClipResult out;
  for (const auto& g : grads) out.params.emplace_back(g.size(), 0.0f);
  std::vector<float> norms(world);
  run_cpu_ranks(world, [&](int rank, Device& d, std::shared_ptr<Comm> comm) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    optim::OptimizerConfig config;
    config.kind = "sgd";
    config.sgd_lr = 1.0f;
    config.sgd_momentum = 0.0f;
    config.max_grad_norm = c.at("max_grad_norm").get<float>();
    std::vector<optim::ParamSpan> spans;
    std::vector<int64_t> first;
    for (size_t i = 0; i < grads.size(); ++i) {
      const int64_t n = static_cast<int64_t>(grads[i].size());
      const int64_t shard = (n + world - 1) / world;
      std::vector<float> slice(static_cast<size_t>(shard), 0.0f);
      for (int64_t k = 0; k < shard && rank * shard + k < n; ++k) slice[k] = grads[i][rank * shard + k];
      auto* p = static_cast<float*>(d.alloc(shard * sizeof(float), s, MemTag::ShardedState));
      auto* g = static_cast<float*>(d.alloc(shard * sizeof(float), s, MemTag::ShardedState));
      d.fill(s, p, DType::F32, shard, 0.0f);
      d.copy_from_host(s, g, slice.data(), slice.size() * sizeof(float));
      spans.push_back({p, g, shard, world > 1 ? comm.get() : nullptr, "tensor " + std::to_string(i)});
      first.push_back(rank * shard);
    }
    {
      optim::Optimizer optimizer(d, s, spans, config);
      optimizer.begin_step(s, config.sgd_lr);
      optimizer.compute_grad_squares(s);
      optimizer.step(s);
      std::vector<float> sq(optimizer.grad_square_names().size());
      d.copy_to_host(s, sq.data(), optimizer.grad_squares(), sq.size() * sizeof(float));
      d.synchronize_stream(s);
      double sum = 0;
      for (float v : sq) sum += v;
      norms[rank] = static_cast<float>(std::sqrt(sum));
      for (size_t i = 0; i < spans.size(); ++i) {
        std::vector<float> p(static_cast<size_t>(spans[i].numel));
        d.copy_to_host(s, p.data(), spans[i].param, p.size() * sizeof(float));
        d.synchronize_stream(s);
        for (size_t k = 0; k < p.size() && first[i] + k < out.params[i].size(); ++k)
          out.params[i][first[i] + k] = p[k];  // disjoint slices: no two ranks write one element
      }
    }
    for (const optim::ParamSpan& sp : spans) {
      d.free(sp.param, s);
      d.free(sp.grad, s);
    }
    d.synchronize();
  });
  for (int r = 1; r < world; ++r) EXPECT_EQ(norms[r], norms[0]) << "every rank sees one norm";
  out.norm = norms[0];
  return out;
}

TEST(GoldenClipGradNorm, GlobalNormAndClippedGradsMatchTorch) {
  for (const json& c : fixture().at("clip")) {
    for (int world : {1, 2}) {
      const std::string name = c.at("name").get<std::string>() + " on " + std::to_string(world);
      SCOPED_TRACE(name);
      json with_bound = c;
      with_bound["max_grad_norm"] = c.at("max_norm");
      const ClipResult r = clip_on_ranks(with_bound, world);
      expect_close({r.norm}, {c.at("total_norm").get<double>()}, 1e-6, 0, name + " norm");
      const auto want = c.at("clipped").get<std::vector<std::vector<double>>>();
      for (size_t i = 0; i < want.size(); ++i) {
        std::vector<double> minus;
        for (double v : want[i]) minus.push_back(-v);
        expect_close(r.params[i], minus, 1e-6, 1e-3 * c.at("max_norm").get<double>(),
                     name + " tensor " + std::to_string(i));
      }
    }
  }
}

// ---- the lr at every step of every schedule: PyTorch's LambdaLR over the documented formula.

TEST(GoldenLrSchedule, EveryStepOfEveryScheduleMatchesLambdaLR) {
  int checked = 0;
  for (const json& c : fixture().at("lr_schedules")) {
    optim::LrSchedule s;
    s.kind = c.at("kind").get<std::string>();
    s.warmup_steps = c.at("warmup_steps").get<int>();
    s.min_lr = c.at("min_lr").get<float>();
    s.total_steps = c.at("total_steps").get<int>();
    const float peak = c.at("peak").get<float>();
    const auto want = c.at("lrs").get<std::vector<double>>();
    ASSERT_EQ(static_cast<int>(want.size()), s.total_steps);
    std::vector<float> got;
    for (int step = 0; step < s.total_steps; ++step) got.push_back(s.at(step, peak));
    expect_close(got, want, 3e-7, 0,
                 s.kind + " warm-up " + std::to_string(s.warmup_steps) + " of " +
                     std::to_string(s.total_steps) + " min " + std::to_string(s.min_lr));
    checked += s.total_steps;
  }
  EXPECT_GT(checked, 100);
}

}  // namespace
}  // namespace fsdp::testing
