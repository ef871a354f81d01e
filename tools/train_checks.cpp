// The checks `fsdp train` makes before it starts any rank (Note [Command defaults]).
//
// Note [Command defaults]
// The command's defaults train at every size it accepts: every model has a target (a head of
// 16 classes and cross-entropy), resmlp and moe blocks have a pre-norm, AdamW's peak lr
// shrinks with the width past 256 (optim::default_adamw_lr), warms up over a tenth of the
// steps and then decays (cosine) to a tenth of the peak, and gradients are clipped to a global
// norm of 1. Clipping needs every gradient before any step, so the
// optimizer runs after backward unless clipping is turned off (--clip-grad-norm 0), where the
// faster optimizer-in-backward schedule is the default (unless the optimizer is in forward).
// Every default is resolved in one place, resolve_defaults below.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"
#include "io/file_io.h"
#include "launch/launch_env.h"
#include "models/model_family.h"
#include "runtime/launch_cuda.h"
#include "runtime/memory_estimate.h"
#include "tools/train_command.h"

namespace fsdp::tools {

namespace {

constexpr int kThreadsPerCpuRank = 6;  // the rank's own thread and its streams' workers

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// MemAvailable from /proc/meminfo; 0 when unknown.
int64_t available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

int64_t thread_limit() {
  int64_t limit = 0;
  std::ifstream in("/proc/sys/kernel/threads-max");
  in >> limit;
  rlimit r{};
  if (getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    limit = limit > 0 ? std::min<int64_t>(limit, static_cast<int64_t>(r.rlim_cur))
                      : static_cast<int64_t>(r.rlim_cur);
  return limit;
}

// The flags' own ranges, before anything is resolved from them.
void check_ranges(const TrainOptions& o) {
  const runtime::TrainConfig& c = o.config;
  const nn::ModelConfig& m = c.model;
  FSDP_USER_CHECK(o.world_size >= 1, "--world-size must be >= 1, got ", o.world_size);
  FSDP_USER_CHECK(o.nproc >= 0, "--nproc must be >= 0 (0: every GPU), got ", o.nproc);
  FSDP_USER_CHECK(m.experts >= 1, "--experts must be >= 1, got ", m.experts);
  FSDP_USER_CHECK(m.classes >= 1, "--classes must be >= 1, got ", m.classes);
  // (--steps itself is the library's to refuse: check_train_config)
  FSDP_USER_CHECK(c.warmup >= 0 && (c.steps < 1 || c.warmup < c.steps),
                  "--warmup must be in [0, --steps), got ", c.warmup);
  FSDP_USER_CHECK(!o.lr || (std::isfinite(*o.lr) && *o.lr > 0),
                  "--lr must be a positive number, got ", o.lr.value_or(0));
  FSDP_USER_CHECK(!o.min_lr || (std::isfinite(*o.min_lr) && *o.min_lr >= 0),
                  "--min-lr must be >= 0, got ", o.min_lr.value_or(0));
  FSDP_USER_CHECK(!o.warmup_steps || *o.warmup_steps >= 0, "--warmup-steps must be >= 0, got ",
                  o.warmup_steps.value_or(0));
  FSDP_USER_CHECK(std::isfinite(o.clip_grad_norm) && o.clip_grad_norm >= 0,
                  "--clip-grad-norm must be >= 0 (0: no clipping), got ", o.clip_grad_norm);
  FSDP_USER_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
                  "--weight-decay must be >= 0, got ", o.weight_decay);
  FSDP_USER_CHECK(!o.chaos_seed || *o.chaos_seed >= 0, "--chaos takes a seed >= 0, got ",
                  o.chaos_seed.value_or(0));
  FSDP_USER_CHECK(o.log_every >= 1, "--log-every must be >= 1, got ", o.log_every);
  FSDP_USER_CHECK(std::isfinite(o.peak_tflops) && o.peak_tflops > 0,
                  "--peak-tflops must be > 0, got ", o.peak_tflops);
  FSDP_USER_CHECK(!o.eval_every || *o.eval_every >= 0, "--eval-every must be >= 0 (0: never), got ",
                  o.eval_every.value_or(0));
  FSDP_USER_CHECK(o.eval_batches >= 1, "--eval-batches must be >= 1, got ", o.eval_batches);
  FSDP_USER_CHECK(!o.data_dir.empty() || o.eval_every.value_or(0) == 0,
                  "--eval-every needs --data (the validation tokens)");
  // ---- multi-node launch and rendezvous (the rest is checked with the environment, below)
  FSDP_USER_CHECK(std::isfinite(o.timeout_s) && o.timeout_s > 0 && o.timeout_s <= 1e6,
                  "--timeout must be in (0, 1e6] seconds, got ", o.timeout_s);
  FSDP_USER_CHECK(!o.nnodes || *o.nnodes >= 1, "--nnodes must be >= 1, got ", o.nnodes.value_or(0));
  FSDP_USER_CHECK(!o.node_rank || *o.node_rank >= 0, "--node-rank must be >= 0, got ",
                  o.node_rank.value_or(0));
  FSDP_USER_CHECK(!o.master_port || (*o.master_port >= 1 && *o.master_port <= 65535),
                  "--master-port must be a TCP port (1 to 65535), got ", o.master_port.value_or(0));
  FSDP_USER_CHECK(!o.master_addr || !o.master_addr->empty(), "--master-addr must not be empty");
}

// --micro-batches N splits each rank's --tokens into N micro-batches of tokens / N.
void check_micro_batches(const TrainOptions& o) {
  const runtime::TrainConfig& c = o.config;
  FSDP_USER_CHECK(o.micro_batches >= 1, "--micro-batches must be >= 1, got ", o.micro_batches);
  FSDP_USER_CHECK(c.tokens % o.micro_batches == 0, "--tokens (", c.tokens,
                  ") must be divisible by --micro-batches (", o.micro_batches, ")");
  const bool sequences = models::family(c.model.kind).batch_kind() == models::BatchKind::Tokens;
  FSDP_USER_CHECK(!sequences || (c.tokens / o.micro_batches) % c.model.seq_len == 0,
                  "--tokens / --micro-batches (", c.tokens / o.micro_batches,
                  ") must be a multiple of --seq-len (", c.model.seq_len, ")");
}

// The "auto" defaults and the flags that the config spells otherwise (Note [Command defaults]).
void resolve_defaults(const TrainOptions& o, runtime::TrainConfig& c) {
  c.tokens = o.config.tokens / o.micro_batches;  // TrainConfig::tokens is per micro-batch
  c.micro_batches = o.micro_batches;
  c.param_dtype = parse_dtype(o.param_dtype);
  c.reduce_dtype = parse_dtype(o.reduce_dtype);
  c.fp8 = parse_fp8_recipe(o.fp8);
  c.fp8_all_gather = o.fp8_all_gather != 0;
  c.activation_checkpoint = nn::parse_activation_checkpoint(o.activation_checkpointing);
  c.reshard_after_forward = o.reshard_after_forward != 0;
  c.reshard_after_forward_size = o.reshard_after_forward >= 2 ? o.reshard_after_forward : 0;
  c.separate_rs_group = o.separate_rs_group != 0;
  c.prefetch_next_step = o.prefetch_next_step != 0 && !o.cuda_graph;  // Note [Captured steps]
  c.cuda_graph = o.cuda_graph;
  c.model.norm = o.norm != 0;
  optim::OptimizerConfig& opt = c.optimizer;
  if (o.lr)
    opt.adamw.lr = opt.sgd_lr = static_cast<float>(*o.lr);
  else if (models::family(c.model.kind).width_scaled_lr())
    opt.adamw.lr = optim::default_adamw_lr(c.model.dim);
  opt.adamw.weight_decay = static_cast<float>(o.weight_decay);
  opt.max_grad_norm = static_cast<float>(o.clip_grad_norm);
  c.schedule.total_steps = c.steps;
  c.schedule.warmup_steps = o.warmup_steps.value_or(c.steps / 10);
  c.schedule.min_lr = o.min_lr ? static_cast<float>(*o.min_lr) : opt.base_lr() / 10;
  // -1: in backward exactly when clipping is off and the optimizer is not in forward.
  c.optimizer_in_forward = o.optimizer_in_forward != 0;
  c.offload_optimizer = o.offload == "optimizer";
  FSDP_USER_CHECK(o.host_memory_limit_mib >= 0 && o.host_memory_limit_mib <= (int64_t{1} << 40),
                  "--host-memory-limit-mib must be in [0, 2^40], got ", o.host_memory_limit_mib);
  FSDP_USER_CHECK(o.host_memory_limit_mib == 0 || c.offload_optimizer,
                  "--host-memory-limit-mib applies to --offload optimizer only");
  c.offload.host_memory_limit = o.host_memory_limit_mib * 1024 * 1024;
  c.optimizer_in_backward = o.optimizer_in_backward == -1
                                ? opt.max_grad_norm <= 0 && !c.optimizer_in_forward &&
                                      !c.offload_optimizer
                                : o.optimizer_in_backward != 0;
  c.zero_grad_set_to_none = o.zero_grad_set_to_none == -1 ? !runtime::grads_outlive_step(c)
                                                          : o.zero_grad_set_to_none != 0;
  c.timeline = !o.trace_path.empty();
  c.checkpoint.verbose = !o.quiet;
  c.return_on_nonfinite = true;  // the summary is written first, then the error
}

// The backend and where the ranks run: run.backend, run.why (for --backend auto), run.world and
// the CPU processes' placement.
void choose_backend(const TrainOptions& o, TrainRun& run) {
  std::string& why = run.why;
  const bool world_given = o.world_size_opt && o.world_size_opt->count() > 0;
  const bool nproc_given = o.nproc_opt && o.nproc_opt->count() > 0;
  const bool chaos_given = o.chaos_seed.has_value();
  std::string backend = o.backend;
  int gpus = -1;
  if (backend == "auto") {
    if (!cuda::compiled_with_cuda()) {
      backend = "cpu";
      why = "this build has no CUDA backend";
    } else if ((gpus = runtime::visible_gpu_count()) == 0) {
      backend = "cpu";
      why = "no GPU is visible";
    } else {
      backend = "cuda";
      why = std::to_string(gpus) + (gpus == 1 ? " GPU is" : " GPUs are") + " visible";
    }
  }
  if (backend == "cpu") {
    const std::string chose = why.empty() ? "" : " (--backend auto chose cpu: " + why + ")";
    // Ranks as threads (--world-size), or as processes over Gloo (--nproc per host, and
    // --nnodes hosts; docs/cpu_processes.md).
    launch::LaunchFlags flags;
    if (nproc_given) flags.nproc = o.nproc;
    flags.nnodes = o.nnodes;
    flags.node_rank = o.node_rank;
    flags.master_addr = o.master_addr;
    flags.master_port = o.master_port;
    run.backend = backend;
    // Under torchrun, srun or mpirun each process is one rank.
    run.cpu_place.external = launch::detect_launcher(flags) != launch::Launcher::Fsdp;
    run.cpu_processes = nproc_given || run.cpu_place.external;
    if (!run.cpu_processes) {
      FSDP_USER_CHECK(!o.nnodes && !o.node_rank && !o.master_addr && !o.master_port,
                      "--nnodes, --node-rank, --master-addr and --master-port need --nproc on "
                      "the CPU backend (ranks as processes); without it the ranks are threads "
                      "of this process", chose);
      run.world = o.world_size;
      return;
    }
    FSDP_USER_CHECK(cpu_processes_built(), "--backend cpu --nproc: this build has no Gloo "
                    "(libgloo-dev), which CPU ranks as processes need", chose);
    FSDP_USER_CHECK(run.cpu_place.external || o.nproc >= 1, "--nproc must be >= 1 on the CPU "
                    "backend (ranks as processes of this host), got ", o.nproc);
    FSDP_USER_CHECK(!world_given, "give --world-size (ranks as threads) or --nproc (ranks as "
                    "processes, per host) on the CPU backend, not both");
    const launch::LaunchEnv env = launch::resolve_launch(flags);
    run.cpu_place.nnodes = env.nnodes;
    run.cpu_place.node_rank = env.node_rank;
    run.cpu_place.master_addr = env.master_addr;
    run.cpu_place.master_port = env.master_port;
    run.cpu_place.timeout_s = o.timeout_s;
    run.world = env.world_size;
    return;
  }
  FSDP_USER_CHECK(cuda::compiled_with_cuda(),
                  "--backend cuda: this build has no CUDA backend (nvcc or NCCL missing at build time)");
  FSDP_USER_CHECK(!chaos_given, "--chaos applies to the CPU backend only");
  FSDP_USER_CHECK(o.cpu_memory_mib == 0, "--cpu-memory-mib applies to the CPU backend only (a GPU "
                  "has the memory it has)");
  if (gpus < 0) gpus = runtime::visible_gpu_count();
  FSDP_USER_CHECK(gpus > 0, "--backend cuda: no GPU is visible");
  // Where the ranks come from (Note [Launch environments]): one-line errors before any starts.
  launch::LaunchFlags flags;
  flags.nnodes = o.nnodes;
  flags.node_rank = o.node_rank;
  flags.master_addr = o.master_addr;
  flags.master_port = o.master_port;
  if (nproc_given) flags.nproc = std::max(o.nproc, 1);
  if (launch::detect_launcher(flags) == launch::Launcher::Fsdp) {
    FSDP_USER_CHECK(o.nproc <= gpus, "--nproc ", o.nproc, " needs ", o.nproc, " GPUs; ", gpus,
                    gpus == 1 ? " is" : " are", " visible");
    flags.nproc = o.nproc > 0 ? o.nproc : gpus;
  }
  const launch::LaunchEnv env = launch::resolve_launch(flags);
  const int used = env.world_size;
  FSDP_USER_CHECK(!world_given || o.world_size == used, "--world-size ", o.world_size,
                  " does not match the ", used, " GPU", used == 1 ? "" : "s",
                  " the CUDA backend would use (one rank per GPU; pick them with --nproc",
                  env.launcher == launch::Launcher::Fsdp ? " and --nnodes)"
                      : std::string(" and ") + launch::launcher_name(env.launcher) + ")");
  run.backend = backend;
  run.world = used;
}

void check_capacity(const TrainRun& run) {
  const std::string& backend = run.backend;
  const int world = run.world;
  if (backend == "cpu") {
    const int64_t limit = thread_limit();
    const int64_t threads = static_cast<int64_t>(world) * kThreadsPerCpuRank;
    FSDP_USER_CHECK(limit <= 0 || threads <= limit / 2, "--world-size ", world,
                    " needs about ", threads, " threads on the CPU backend (a thread per rank "
                    "and per stream); this machine allows ", limit, " in all");
  }
  // HSDP shards over world / --hsdp ranks (docs/memory.md).
  const int shard = world / std::max(run.config.hsdp_replicas, 1);
  const double per_rank = static_cast<double>(estimate_rank_bytes(run.config, std::max(shard, 1)));
  if (backend == "cpu") {
    const double total = per_rank * world;  // every CPU rank lives in this process
    const int64_t available = available_host_bytes();
    FSDP_USER_CHECK(available <= 0 || total <= 0.9 * static_cast<double>(available),
                    "this run needs about ", gib(total), " of memory (", gib(per_rank),
                    " per rank x ", world, " ranks, docs/memory.md) but the machine has ",
                    gib(static_cast<double>(available)),
                    " available; lower --dim, --layers, --tokens or --world-size");
  }
}

}  // namespace

int64_t estimate_rank_bytes(const runtime::TrainConfig& c, int world) {
  const runtime::MemoryEstimate e = runtime::estimate_rank_memory(c, world);
  return e.device_bytes + e.host_bytes;
}

void check_writable(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  FSDP_USER_CHECK(!fs::is_directory(path, ec), flag, " '", path, "' is a directory, not a file");
  try {
    io::check_output_path(path);  // Note [Output paths]
  } catch (const UserError& e) {
    FSDP_USER_FAIL(flag, ": ", e.what());
  }
  if (fs::exists(path, ec)) {
    FSDP_USER_CHECK(::access(path.c_str(), W_OK) == 0, "cannot write ", flag, " file '", path,
                    "': ", std::strerror(errno));
    return;
  }
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  FSDP_USER_CHECK(fs::is_directory(dir, ec), "cannot write ", flag, " file '", path,
                  "': the directory '", dir.string(), "' does not exist");
  FSDP_USER_CHECK(::access(dir.c_str(), W_OK) == 0, "cannot write ", flag, " file '", path,
                  "': ", std::strerror(errno));
}

// The option names of the API (runtime::check_train_config, the model's and the schedule's
// checks, fully_shard's settings) that the command line spells otherwise; any other name is
// its flag with '_' as '-'.
std::string flag_of(const std::string& option) {
  static const std::map<std::string, std::string> flags{
      {"activation_checkpoint", "--activation-checkpointing"},
      {"hsdp_replicas", "--hsdp"},
      {"max_grad_norm", "--clip-grad-norm"},
      {"reduce_scatter_max_input_buffers", "--rs-max-input-buffers"},
      {"reshard_after_forward_size", "--reshard-after-forward"},
  };
  if (auto it = flags.find(option); it != flags.end()) return it->second;
  std::string flag = "--" + option;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

void check_fp8_sizes_for_cuda(const runtime::TrainConfig& c) {
  if (c.fp8 == Fp8Recipe::None) return;
  FSDP_USER_CHECK(c.tokens % 16 == 0, "--fp8 on CUDA needs the tokens per micro-batch (",
                  c.tokens, ") to be a multiple of 16 (cuBLASLt's fp8 GEMMs)");
  std::unique_ptr<nn::Model> model = models::build_model(models::resolved(c.model));
  nn::enable_fp8(*model, c.fp8);
  model->visit([](Module& m) {
    for (const auto& p : m.params()) {
      // A GEMM's weight is the last two dims: a grouped expert's [E, out, in] is E of them.
      const std::vector<int64_t>& shape = p->shape();
      const int64_t out = shape.size() >= 2 ? shape[shape.size() - 2] : p->rows();
      const int64_t in = shape.empty() ? 1 : shape.back();
      FSDP_USER_CHECK(p->fp8 == Fp8Recipe::None || (out % 16 == 0 && in % 16 == 0),
                      "--fp8 on CUDA needs every fp8 weight's sizes to be multiples of 16 "
                      "(cuBLASLt's fp8 GEMMs); ", m.fqn(), ".", p->name(), " is ", out, "x", in);
    }
  });
}

namespace {

// What the resolved run needs besides the flags' ranges: the backend can run it, the API's
// rules (runtime::check_train_config, Note [Options checked once]), the machine's capacity,
// and outputs that can be written.
void check_train_run(const TrainOptions& o, const TrainRun& run) {
  const runtime::TrainConfig& c = run.config;
  // Note [Captured steps] (src/runtime/captured_step.h).
  FSDP_USER_CHECK(!c.cuda_graph || run.backend != "cpu", "--cuda-graph needs the CUDA backend "
                  "(--backend cuda); the CPU backend cannot capture CUDA graphs");
  const int ep = models::family(c.model.kind).expert_parallel_size(models::resolved(c.model));
  FSDP_USER_CHECK(c.model.ep == 1 || ep > 1, "--ep applies to models with experts split over "
                  "ranks (--model moe-transformer), not --model ", c.model.kind);
  FSDP_USER_CHECK(run.backend != "cpu" || run.world % ep == 0, "--world-size (", run.world,
                  ") must be divisible by --ep (", ep, ")");
  optim::validate(c.schedule, c.optimizer.base_lr());  // the command's schedule
  runtime::check_train_config(c, run.world);
  if (run.backend == "cuda") check_fp8_sizes_for_cuda(c);
  check_capacity(run);
  check_writable("--json", o.json_path);
  check_writable("--trace", o.trace_path);
}

}  // namespace

void check_train_options(const TrainOptions& o) {
  check_ranges(o);
  models::resolved(o.config.model);  // the model's sizes, before anything divides by them
  check_micro_batches(o);
}

TrainRun resolve_train_run(const TrainOptions& o) {
  TrainRun run;
  run.config = o.config;
  apply_hf_model(o, run);  // first: the model's sizes set the defaults (the lr's, say)
  resolve_defaults(o, run.config);
  choose_backend(o, run);
  attach_token_data(o, run);
  apply_memory_budget(o, run);  // last: it plans for the run as resolved
  return run;
}

runtime::TrainConfig simulate_config_of(const TrainOptions& o, int gpus, int64_t capacity,
                                        std::string* plan_line) {
  try {
    check_train_options(o);
    TrainRun run;
    run.config = o.config;
    apply_hf_model(o, run);
    resolve_defaults(o, run.config);
    runtime::check_train_config(run.config, gpus);
    check_fp8_sizes_for_cuda(run.config);  // the simulated GPUs run CUDA's fp8 GEMMs
    run.backend = "sim";
    run.world = gpus;
    apply_memory_budget(o, run, capacity);
    if (plan_line) *plan_line = run.memory_plan_line;
    check_writable("--json", o.json_path);
    check_writable("--trace", o.trace_path);
    return run.config;
  } catch (const OptionError& e) {  // Note [Options checked once]
    throw UserError(e.spelled(flag_of));
  }
}

TrainRun train_run_of(const TrainOptions& o) {
  try {
    check_train_options(o);
    TrainRun run = resolve_train_run(o);
    check_train_run(o, run);
    return run;
  } catch (const OptionError& e) {  // Note [Options checked once]: the flags' names instead
    throw UserError(e.spelled(flag_of));
  }
}

}  // namespace fsdp::tools
