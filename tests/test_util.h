// Helpers shared by the engine tests: run FSDP on CPU ranks (threads or processes), run the
// reference.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "runtime/launch.h"
#include "runtime/trainer.h"

namespace fsdp::testing {

// How a test's CPU ranks run: threads of this process sharing memory, or processes that
// exchange data over Gloo (docs/cpu_processes.md).
enum class RanksAs { Threads, Processes };

inline const char* ranks_as_name(RanksAs as) {
  return as == RanksAs::Threads ? "threads" : "processes";
}

// Skips the calling test when ranks as processes are wanted but this build has no Gloo.
#define FSDP_SKIP_WITHOUT_PROCESSES(as)                                                    \
  if ((as) == ::fsdp::testing::RanksAs::Processes && !::fsdp::cpu_processes_built())       \
  GTEST_SKIP() << "this build has no Gloo (libgloo-dev), which CPU ranks as processes need"

inline std::vector<runtime::RankResult> run_fsdp(int world, const runtime::TrainConfig& config,
                                                 cpu::CpuOptions options = {},
                                                 RanksAs as = RanksAs::Threads) {
  if (as == RanksAs::Processes) {
    if (options.collective_timeout_s <= 0) options.collective_timeout_s = 60;
    return runtime::run_cpu_process_training(world, options, {}, config);
  }
  std::vector<runtime::RankResult> results(world);
  runtime::run_cpu_ranks(world, options, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    results[rank] = runtime::train_rank(device, comm, config);
  });
  return results;
}

inline runtime::RankResult run_reference(const runtime::TrainConfig& config, int world) {
  runtime::RankResult result;
  runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm>) {
    result = runtime::train_local_reference(device, config, world);
  });
  return result;
}

// ||a - b|| / ||b|| over all params.
inline double relative_error(const std::vector<std::vector<float>>& a,
                             const std::vector<std::vector<float>>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) {
      const double d = static_cast<double>(a[i][j]) - b[i][j];
      diff += d * d;
      norm += static_cast<double>(b[i][j]) * b[i][j];
    }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

inline int64_t tag_peak_live(const runtime::RankResult& r, MemTag tag) {
  return r.memory.tag_peak_live[static_cast<int>(tag)];
}

// A plain mlp of `layers` blocks of width `dim` (for placement and bad-input tests).
inline nn::ModelConfig tiny_mlp_config(int layers, int dim) {
  nn::ModelConfig c;
  c.kind = "mlp";
  c.layers = layers;
  c.dim = dim;
  return c;
}

// A tiny llama-style transformer: grouped-query attention, and a vocab (61) whose embedding
// and head rows never divide evenly over ranks; two sequences of 8 tokens per rank.
// A few-parameter model of any family (mlp, moe, transformer, ...): 3 blocks of width `dim`,
// 8 tokens a step, for the tests that compare two schedules bit for bit on every family.
inline runtime::TrainConfig tiny_config_of_kind(const std::string& kind, int dim = 16) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = 3;
  c.model.dim = dim;
  c.model.classes = kind == "transformer" ? 0 : 4;
  c.model.hidden = 10;
  c.model.experts = 3;
  c.model.heads = 2;
  c.model.ffn_dim = 24;
  c.model.seq_len = 4;
  c.model.vocab = 29;
  c.tokens = 8;
  return c;
}

// Chaos delays on every stream, on the virtual clock: they reorder the streams without taking
// wall-clock time.
inline cpu::CpuOptions chaos_options(uint64_t seed) {
  cpu::CpuOptions o;
  o.chaos = true;
  o.chaos_seed = seed;
  o.virtual_clock = true;
  return o;
}

inline runtime::TrainConfig tiny_transformer_config(int steps) {
  runtime::TrainConfig c;
  c.model.kind = "transformer";
  c.model.layers = 2;
  c.model.dim = 32;
  c.model.heads = 4;
  c.model.kv_heads = 2;
  c.model.ffn_dim = 40;
  c.model.seq_len = 8;
  c.model.vocab = 61;
  c.tokens = 16;
  c.steps = steps;
  c.collect_params = true;
  return c;
}

// A tiny MoE transformer (layer 0 dense, layer 1 MoE) for tests that train it on a few ranks.
inline runtime::TrainConfig tiny_moe_transformer_config(int ep, int experts, int steps) {
  runtime::TrainConfig c;
  c.model.kind = "moe-transformer";
  c.model.layers = 2;
  c.model.dim = 16;
  c.model.heads = 2;
  c.model.ffn_dim = 24;
  c.model.expert_ffn_dim = 8;
  c.model.experts = experts;
  c.model.top_k = 2;
  c.model.ep = ep;
  c.model.seq_len = 4;
  c.model.vocab = 23;
  c.tokens = 8;  // two sequences per rank
  c.steps = steps;
  c.optimizer.adamw.lr = 3e-3f;
  c.collect_params = true;
  return c;
}

// The OptionError a call raises (its option and message); empty option when none.
inline std::pair<std::string, std::string> option_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const OptionError& e) {
    return {e.option(), e.what()};
  } catch (const Error& e) {
    return {"", std::string("not an OptionError: ") + e.what()};
  }
  return {"", "no error"};
}

}  // namespace fsdp::testing
