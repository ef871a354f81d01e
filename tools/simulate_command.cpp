// `fsdp simulate`: see simulate_command.h and docs/simulate.md.
#include "tools/simulate_command.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fsdp/error.h"
#include "models/model_family.h"
#include "runtime/launch_sim.h"
#include "runtime/trace_metrics.h"

#ifndef FSDP_SOURCE_DIR
#define FSDP_SOURCE_DIR ""
#endif

namespace fsdp::tools {

namespace {

// The calibration committed with the source (bench/calibrations/), when it is there.
std::string default_calibration() {
  const std::string path = std::string(FSDP_SOURCE_DIR) + "/bench/calibrations/h200.json";
  std::error_code ec;
  return std::string(FSDP_SOURCE_DIR).empty() || !std::filesystem::exists(path, ec) ? "" : path;
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

// The train flags that mean nothing on a simulated cluster.
constexpr const char* kNotSimulated[] = {
    "--backend", "--world-size", "--nproc", "--chaos", "--nnodes", "--node-rank",
    "--master-addr", "--master-port", "--timeout", "--save-dir", "--save-every", "--keep-last",
    "--resume", "--init-from", "--data", "--eval-every", "--eval-batches", "--check-collectives",
    "--log-every", "--json", "--trace"};

std::string describe_cluster(const sim::SimOptions& o) {
  const int nodes = std::max(1, o.gpus / o.gpus_per_node);
  return detail::concat(o.gpus, " x ", o.calibration.device, " (", nodes,
                        nodes == 1 ? " node" : " nodes", " of ", std::min(o.gpus, o.gpus_per_node),
                        "; NVLink ", o.calibration.nvlink.peak_gbps(), " GB/s, network ",
                        o.calibration.network.peak_gbps(), " GB/s per GPU)");
}

}  // namespace

SimulateOptions::SimulateOptions() {
  train.config.steps = 4;
  train.config.warmup = 1;
  train.quiet = true;
  calibration_path = default_calibration();
}

CLI::App* add_simulate_command(CLI::App& app, SimulateOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "simulate", "predict a training step on a simulated cluster (docs/simulate.md)");
  add_train_options(*cmd, o.train);
  for (const char* name : kNotSimulated)
    if (CLI::Option* opt = cmd->get_option_no_throw(name)) cmd->remove_option(opt);
  o.train.world_size_opt = o.train.nproc_opt = nullptr;
  cmd->add_option("--gpus", o.gpus, "GPUs of the simulated cluster (the world size)");
  cmd->add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node, joined by NVLink");
  cmd->add_option("--nvlink-gbps", o.nvlink_gbps,
                  "NVLink bus bandwidth per GPU, GB/s [default: the calibration's]");
  cmd->add_option("--net-gbps", o.net_gbps,
                  "network bandwidth per GPU, GB/s (a 400 Gb/s NIC: 50) [default: the "
                  "calibration's]");
  cmd->add_option("--calibration", o.calibration_path,
                  "calibration file (bench/calibrations/, docs/simulate.md)");
  cmd->add_flag("--sweep", o.sweep,
                "also simulate every setting of --rs-max-input-buffers 1|2, --separate-rs-group "
                "0|1, --hsdp (none, one node per shard group) and --reshard-after-forward 1|0|"
                "node, and name the best");
  cmd->add_option("--moe-load", o.moe_load, "moe-transformer, dropless: balanced | skewed")
      ->check(CLI::IsMember({"balanced", "skewed"}));
  cmd->add_option("--moe-max-load", o.moe_max_load,
                  "with --moe-load skewed: the busiest expert's share of the top-k assignments");
  cmd->add_option("--json", o.train.json_path, "write the numbers to this file");
  cmd->add_option("--trace", o.train.trace_path,
                  "write the simulated rank's trace (the format of fsdp train --trace)");
  cmd->add_option("--rs-reclaim", o.rs_reclaim,
                  "how the RS ring reclaims its buffers: bounded (the engine's) | fsdp2.12 "
                  "(PyTorch 2.12's drain by the last group, for comparison)")
      ->check(CLI::IsMember({"bounded", "fsdp2.12"}));
  cmd->add_option("--cost-log", o.cost_log_path,
                  "write every op's class, bytes, flops and time by label (JSON lines), for "
                  "calibration fits");
  return cmd;
}

SimulatedStep simulate_step(const sim::SimOptions& so, const runtime::TrainConfig& config_in,
                            runtime::RankResult* result_out, sim::CostLog* costs_out) {
  runtime::TrainConfig config = config_in;
  config.timeline = true;
  sim::SimWorld world(so);
  runtime::RankResult r = runtime::run_simulated_training(world, config);
  const Timeline& t = r.timeline;
  const int compute = runtime::find_stream(t, "compute");
  FSDP_CHECK(compute >= 0, "the simulated step recorded no compute stream");
  std::vector<double> ends;
  double first = 1e300;
  for (const TimelineOp& op : t.ops) {
    first = std::min(first, op.start_us);
    // The trainer's fill that ends each step (the copies after it carry the same label).
    if (op.stream == compute && op.kind == OpKind::Kernel && op.label == runtime::kStepEndLabel)
      ends.push_back(op.end_us);
  }
  std::sort(ends.begin(), ends.end());
  FSDP_CHECK(!ends.empty(), "the simulated run recorded no step end");
  const double step_us = ends.size() >= 2 ? (ends.back() - ends.front()) / (ends.size() - 1)
                                          : ends.back() - first;
  const runtime::TimelineMetrics m =
      runtime::compute_metrics(t, compute, static_cast<double>(ends.size()));
  SimulatedStep s;
  s.step_ms = step_us / 1e3;
  const double tokens = static_cast<double>(config.tokens) * config.micro_batches;
  s.tokens_per_s_per_gpu = tokens / (step_us * 1e-6);
  s.mfu = models::flops_per_token(config.model) * s.tokens_per_s_per_gpu /
          (so.calibration.peak_tflops * 1e12);
  s.exposed_comm_ms = m.exposed_comm_ms;
  s.exposed_ag_ms = m.exposed_ag_ms;
  s.rs_recycle_stall_ms = m.rs_recycle_stall_ms;
  s.rs_drain_ms = m.rs_drain_ms;
  s.other_comm_ms = m.other_comm_ms;
  s.ag_rs_overlap_ms = m.ag_rs_overlap_ms;
  s.peak_bytes = r.memory.peak_bytes;
  s.peak_bytes_by_step = r.peak_bytes_by_step;
  s.rs_inputs_in_flight_max = r.memory.tag_peak_live[static_cast<int>(MemTag::RsInput)];
  const double capacity = so.calibration.device_memory_gib * 1024.0 * 1024.0 * 1024.0;
  s.fits = capacity <= 0 || static_cast<double>(s.peak_bytes) <= capacity;
  if (costs_out) *costs_out = world.cost_log();
  if (result_out) *result_out = std::move(r);
  return s;
}

nlohmann::json to_json(const SimulatedStep& s) {
  return {{"setting", s.setting},
          {"step_ms", s.step_ms},
          {"tokens_per_s_per_gpu", s.tokens_per_s_per_gpu},
          {"mfu", s.mfu},
          {"exposed_comm_ms", s.exposed_comm_ms},
          {"exposed_ag_ms", s.exposed_ag_ms},
          {"rs_recycle_stall_ms", s.rs_recycle_stall_ms},
          {"rs_drain_ms", s.rs_drain_ms},
          {"other_comm_ms", s.other_comm_ms},
          {"ag_rs_overlap_ms", s.ag_rs_overlap_ms},
          {"peak_mem_bytes", s.peak_bytes},
          {"peak_mem_bytes_by_step", s.peak_bytes_by_step},
          {"rs_inputs_in_flight_max", s.rs_inputs_in_flight_max},
          {"fits", s.fits}};
}

namespace {

void print_step(const SimulatedStep& s) {
  std::printf("step %.2f ms, %.0f tokens/s/GPU, MFU %.1f%%\n", s.step_ms, s.tokens_per_s_per_gpu,
              100 * s.mfu);
  std::printf("exposed communication %.3f ms a step: all-gather waits %.3f, RS recycle stall "
              "%.3f, RS drain %.3f, other %.3f (AG/RS overlap %.3f)\n",
              s.exposed_comm_ms, s.exposed_ag_ms, s.rs_recycle_stall_ms, s.rs_drain_ms,
              s.other_comm_ms, s.ag_rs_overlap_ms);
  std::printf("peak memory %.2f GiB per rank%s", gib(s.peak_bytes),
              s.fits ? "" : " (more than the GPU has)");
  if (s.peak_bytes_by_step.size() > 2)
    std::printf(" (after step 1: %.2f GiB, after step %zu: %.2f GiB)",
                gib(s.peak_bytes_by_step.front()), s.peak_bytes_by_step.size(),
                gib(s.peak_bytes_by_step.back()));
  std::printf("; RS inputs in flight at most %lld\n", static_cast<long long>(s.rs_inputs_in_flight_max));
}

struct Setting {
  std::string name;
  runtime::TrainConfig config;
};

// --sweep: k, the separate RS group, HSDP (none, or a node per shard group) and reshard after
// forward (on, off, to a node's ranks), each combination that the engine accepts.
std::vector<Setting> sweep_settings(const runtime::TrainConfig& base, int gpus, int per_node) {
  std::vector<int> replicas{0};
  if (gpus > per_node && gpus % per_node == 0) replicas.push_back(gpus / per_node);
  std::vector<Setting> out;
  for (int k : {1, 2})
    for (bool sep : {false, true})
      for (int r : replicas)
        for (int raf : {1, 0, per_node}) {
          const int shard = r > 0 ? gpus / r : gpus;
          if (raf == per_node && (per_node <= 1 || shard <= per_node || shard % per_node != 0)) continue;
          Setting s{detail::concat("--rs-max-input-buffers ", k, " --separate-rs-group ", sep ? 1 : 0,
                                   " --hsdp ", r, " --reshard-after-forward ", raf),
                    base};
          s.config.rs_max_input_buffers = k;
          s.config.separate_rs_group = sep;
          s.config.hsdp_replicas = r;
          s.config.reshard_after_forward = raf != 0;
          s.config.reshard_after_forward_size = raf > 1 ? raf : 0;
          out.push_back(std::move(s));
        }
  return out;
}

void write_cost_log(const std::string& path, const sim::CostLog& costs, int steps) {
  std::string text;
  for (const auto& [key, e] : costs)
    text += nlohmann::json{{"label", key.first}, {"op", key.second}, {"ops", e.ops},
                           {"bytes", e.bytes}, {"flops", e.flops}, {"us", e.us},
                           {"steps", steps}}.dump() + "\n";
  write_output_file("--cost-log", path, text);
}

}  // namespace

int run_simulate(SimulateOptions& o) {
  FSDP_USER_CHECK(o.gpus >= 1, "--gpus must be >= 1, got ", o.gpus);
  FSDP_USER_CHECK(o.gpus_per_node >= 1, "--gpus-per-node must be >= 1, got ", o.gpus_per_node);
  FSDP_USER_CHECK(o.gpus <= o.gpus_per_node || o.gpus % o.gpus_per_node == 0, "--gpus (", o.gpus,
                  ") must fill whole nodes of --gpus-per-node (", o.gpus_per_node, ")");
  FSDP_USER_CHECK(o.gpus <= (1 << 20), "--gpus must be at most ", 1 << 20, ", got ", o.gpus);
  FSDP_USER_CHECK(std::isfinite(o.nvlink_gbps) && o.nvlink_gbps >= 0 && std::isfinite(o.net_gbps) &&
                      o.net_gbps >= 0,
                  "--nvlink-gbps and --net-gbps must be >= 0 (0: the calibration's)");
  FSDP_USER_CHECK(o.moe_load == "skewed" || o.moe_max_load == 0,
                  "--moe-max-load needs --moe-load skewed");
  FSDP_USER_CHECK(!o.calibration_path.empty(), "--calibration FILE is needed (none is committed "
                  "beside this binary's source)");
  sim::SimOptions so;
  so.calibration = sim::read_calibration(o.calibration_path);
  std::string plan_line;  // with --memory-budget (auto: the calibration's GPU memory)
  runtime::TrainConfig config = simulate_config_of(
      o.train, o.gpus,
      static_cast<int64_t>(so.calibration.device_memory_gib * 1024.0 * 1024.0 * 1024.0),
      &plan_line);
  check_writable("--cost-log", o.cost_log_path);
  try {
    runtime::check_simulated_config(so.calibration, config);
  } catch (const OptionError& e) {  // Note [Options checked once]
    throw UserError(e.spelled(flag_of));
  }

  if (o.nvlink_gbps > 0) so.calibration.nvlink.scale_to(o.nvlink_gbps);
  if (o.net_gbps > 0) so.calibration.network.scale_to(o.net_gbps);
  so.gpus = o.gpus;
  so.gpus_per_node = o.gpus_per_node;
  so.host_costs = !o.train.cuda_graph;  // a replayed graph costs the host nothing per op
  so.seed = config.seed;
  so.cost_log = !o.cost_log_path.empty();
  if (o.moe_load == "skewed") {
    const int experts = std::max(config.model.experts, 1);
    FSDP_USER_CHECK(o.moe_max_load > 1.0 / experts && o.moe_max_load <= 1.0,
                    "--moe-max-load must be in (1 / experts, 1] = (", 1.0 / experts,
                    ", 1], got ", o.moe_max_load);
    so.moe_load = {true, o.moe_max_load, std::max(config.model.top_k, 1)};
  }
  config.cuda_graph = false;
  if (o.rs_reclaim == "fsdp2.12") config.rs_policy = RsReclaimPolicy::Fsdp2_12LastGroupDrains;  // simulated: the graph's effect is its host cost (none)

  std::printf("simulated: %s; calibration %s\n", describe_cluster(so).c_str(),
              o.calibration_path.c_str());
  std::printf("one rank is simulated (rank %d) and stands for all %d: every rank runs the same "
              "schedule (docs/simulate.md)\n", o.gpus - 1, o.gpus);
  std::printf("losses and grad norms: not computed (the simulation does no arithmetic)\n");
  if (!plan_line.empty()) std::printf("%s\n", plan_line.c_str());
  if (config.fp8 != Fp8Recipe::None) {  // Note [Simulated fp8]
    const bool rowwise = config.fp8 == Fp8Recipe::Rowwise;
    std::printf("fp8 %s: the blocks' GEMMs at %.3f x their bf16 time (the calibration's "
                "gemm.fp8), casts and transposes as memory-bound passes; %s all-gather\n",
                fp8_recipe_name(config.fp8),
                rowwise ? so.calibration.fp8.rowwise : so.calibration.fp8.tensorwise,
                !rowwise && config.fp8_all_gather ? "float8" : "bf16");
  }
  std::fflush(stdout);
  runtime::RankResult result;
  sim::CostLog costs;
  SimulatedStep base = simulate_step(so, config, &result, &costs);
  print_step(base);
  nlohmann::json summary = {{"backend", "sim"},
                            {"gpus", o.gpus},
                            {"gpus_per_node", o.gpus_per_node},
                            {"calibration", o.calibration_path},
                            {"device", so.calibration.device},
                            {"fp8", fp8_recipe_name(config.fp8)},
                            {"fp8_all_gather",
                             config.fp8 == Fp8Recipe::Tensorwise && config.fp8_all_gather},
                            {"simulated_rank", o.gpus - 1},
                            {"step", to_json(base)},
                            {"memory_plan", config.memory_plan},
                            {"predicted_peak_bytes", result.predicted_peak_bytes}};
  if (!o.cost_log_path.empty()) write_cost_log(o.cost_log_path, costs, config.steps);
  if (!o.train.trace_path.empty()) write_trace_file(o.train.trace_path, {result});
  if (o.sweep) {
    std::printf("\nsweep (%s):\n", describe_cluster(so).c_str());
    std::printf("%-90s %9s %10s %6s %9s %9s %8s\n", "setting", "step ms", "tok/s/GPU", "MFU",
                "exposed", "recycle", "peak GiB");
    nlohmann::json rows = nlohmann::json::array();
    const SimulatedStep* best = nullptr;
    std::vector<SimulatedStep> done;
    const std::vector<Setting> settings = sweep_settings(config, o.gpus, o.gpus_per_node);
    done.reserve(settings.size());
    for (const Setting& s : settings) {
      try {
        runtime::check_train_config(s.config, o.gpus);
        done.push_back(simulate_step(so, s.config));
      } catch (const OptionError& e) {  // in the flags' names (Note [Options checked once])
        std::printf("%-90s not valid: %s\n", s.name.c_str(), e.spelled(flag_of).c_str());
        continue;
      } catch (const UserError& e) {
        std::printf("%-90s not valid: %s\n", s.name.c_str(), e.what());
        continue;
      }
      SimulatedStep& r = done.back();
      r.setting = s.name;
      std::printf("%-90s %9.2f %10.0f %5.1f%% %9.3f %9.3f %8.2f%s\n", s.name.c_str(), r.step_ms,
                  r.tokens_per_s_per_gpu, 100 * r.mfu, r.exposed_comm_ms, r.rs_recycle_stall_ms,
                  gib(r.peak_bytes), r.fits ? "" : " (does not fit)");
      std::fflush(stdout);
      rows.push_back(to_json(r));
    }
    for (const SimulatedStep& r : done)
      if (r.fits && (!best || r.step_ms < best->step_ms)) best = &r;
    if (best) {
      std::printf("best: %s (%.2f ms, MFU %.1f%%, %.2f GiB)\n", best->setting.c_str(), best->step_ms,
                  100 * best->mfu, gib(best->peak_bytes));
      summary["best"] = best->setting;
    } else {
      std::printf("best: none of the settings fits the GPU's memory\n");
    }
    summary["sweep"] = rows;
  }
  if (!o.train.json_path.empty()) write_output_file("--json", o.train.json_path, summary.dump(2) + "\n");
  return 0;
}

}  // namespace fsdp::tools
