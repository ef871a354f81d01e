// The checks `fsdp train` makes before it starts any rank (Note [Command defaults]).
//
// Note [Command defaults]
// The command's defaults train at every size it accepts: every model has a target (a head of
// 16 classes and cross-entropy), resmlp and moe blocks have a pre-norm, AdamW's peak lr
// shrinks with the width past 256 (optim::default_adamw_lr), warms up over a tenth of the
// steps and then decays (cosine) to a tenth of the peak, and gradients are clipped to a global
// norm of 1. Clipping needs every gradient before any step, so the
// optimizer runs after backward unless clipping is turned off (--clip-grad-norm 0), where the
// faster optimizer-in-backward schedule is the default.
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

void check_ranges(const TrainOptions& o) {
  const runtime::TrainConfig& c = o.config;
  const nn::ModelConfig& m = c.model;
  FSDP_USER_CHECK(o.world_size >= 1, "--world-size must be >= 1, got ", o.world_size);
  FSDP_USER_CHECK(o.nproc >= 0, "--nproc must be >= 0 (0: every GPU), got ", o.nproc);
  FSDP_USER_CHECK(m.hidden >= 0, "--hidden must be >= 1 (or 0 for the default), got ", m.hidden);
  FSDP_USER_CHECK(m.experts >= 1, "--experts must be >= 1, got ", m.experts);
  FSDP_USER_CHECK(m.classes >= 1, "--classes must be >= 1, got ", m.classes);
  FSDP_USER_CHECK(c.warmup >= 0 && c.warmup < c.steps, "--warmup must be in [0, --steps), got ",
                  c.warmup);
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

// The "auto" defaults (Note [Command defaults]).
void resolve_defaults(TrainOptions& o) {
  runtime::TrainConfig& c = o.config;
  c.param_dtype = parse_dtype(o.param_dtype);
  c.reduce_dtype = parse_dtype(o.reduce_dtype);
  c.reshard_after_forward = o.reshard_after_forward != 0;
  c.reshard_after_forward_size = o.reshard_after_forward >= 2 ? o.reshard_after_forward : 0;
  c.separate_rs_group = o.separate_rs_group != 0;
  c.prefetch_next_step = o.prefetch_next_step != 0;
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
  optim::validate(c.schedule, opt.base_lr());
  if (o.optimizer_in_backward == -1) {
    c.optimizer_in_backward = opt.max_grad_norm <= 0;
  } else {
    c.optimizer_in_backward = o.optimizer_in_backward != 0;
    FSDP_USER_CHECK(!(c.optimizer_in_backward && opt.max_grad_norm > 0),
                    "--optimizer-in-backward 1 cannot clip gradients (clipping needs every "
                    "gradient before any step); add --clip-grad-norm 0 to use it");
  }
  c.optimizer_in_forward = o.optimizer_in_forward != 0;
  FSDP_USER_CHECK(!(c.optimizer_in_forward && c.optimizer_in_backward),
                  "--optimizer-in-forward 1 and --optimizer-in-backward 1 exclude each other "
                  "(with --clip-grad-norm 0 the optimizer is in backward unless "
                  "--optimizer-in-backward 0)");
  const models::ModelFamily& family = models::family(c.model.kind);
  const int ep = family.expert_parallel_size(models::resolved(c.model));
  FSDP_USER_CHECK(c.model.ep == 1 || ep > 1, "--ep applies to models with experts split over "
                  "ranks (--model moe-transformer), not --model ", c.model.kind);
  FSDP_USER_CHECK(o.backend != "cpu" || o.world_size % ep == 0, "--world-size (", o.world_size,
                  ") must be divisible by --ep (", ep, ")");
  c.timeline = !o.trace_path.empty();
}

std::string choose_backend(TrainOptions& o, std::string& why) {
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
    // Under torchrun, srun or mpirun each process is one rank.
    o.cpu_place.external = launch::detect_launcher(flags) != launch::Launcher::Fsdp;
    o.cpu_processes = nproc_given || o.cpu_place.external;
    if (!o.cpu_processes) {
      FSDP_USER_CHECK(!o.nnodes && !o.node_rank && !o.master_addr && !o.master_port,
                      "--nnodes, --node-rank, --master-addr and --master-port need --nproc on "
                      "the CPU backend (ranks as processes); without it the ranks are threads "
                      "of this process", chose);
      o.effective_world = o.world_size;
      return backend;
    }
    FSDP_USER_CHECK(cpu_processes_built(), "--backend cpu --nproc: this build has no Gloo "
                    "(libgloo-dev), which CPU ranks as processes need", chose);
    FSDP_USER_CHECK(o.cpu_place.external || o.nproc >= 1, "--nproc must be >= 1 on the CPU "
                    "backend (ranks as processes of this host), got ", o.nproc);
    FSDP_USER_CHECK(!world_given, "give --world-size (ranks as threads) or --nproc (ranks as "
                    "processes, per host) on the CPU backend, not both");
    const launch::LaunchEnv env = launch::resolve_launch(flags);
    o.cpu_place.nnodes = env.nnodes;
    o.cpu_place.node_rank = env.node_rank;
    o.cpu_place.master_addr = env.master_addr;
    o.cpu_place.master_port = env.master_port;
    o.cpu_place.timeout_s = o.timeout_s;
    o.effective_world = env.world_size;
    return backend;
  }
  FSDP_USER_CHECK(cuda::compiled_with_cuda(),
                  "--backend cuda: this build has no CUDA backend (nvcc or NCCL missing at build time)");
  FSDP_USER_CHECK(!chaos_given, "--chaos applies to the CPU backend only");
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
  o.effective_world = used;
  return backend;
}

void check_capacity(const TrainOptions& o, const std::string& backend) {
  const int world = o.effective_world;
  if (backend == "cpu") {
    const int64_t limit = thread_limit();
    const int64_t threads = static_cast<int64_t>(world) * kThreadsPerCpuRank;
    FSDP_USER_CHECK(limit <= 0 || threads <= limit / 2, "--world-size ", world,
                    " needs about ", threads, " threads on the CPU backend (a thread per rank "
                    "and per stream); this machine allows ", limit, " in all");
  }
  // HSDP shards over world / --hsdp ranks (docs/memory.md).
  const int shard = world / std::max(o.config.hsdp_replicas, 1);
  const double per_rank = static_cast<double>(estimate_rank_bytes(o.config, std::max(shard, 1)));
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

// The option names of the API (runtime::check_train_config, fully_shard's settings) that the
// command line spells otherwise; any other name is its flag with '_' as '-'.
std::string flag_of(const std::string& option) {
  static const std::map<std::string, std::string> flags{
      {"hsdp_replicas", "--hsdp"},
      {"reduce_scatter_max_input_buffers", "--rs-max-input-buffers"},
      {"reshard_after_forward_size", "--reshard-after-forward"},
  };
  if (auto it = flags.find(option); it != flags.end()) return it->second;
  std::string flag = "--" + option;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// The config against the world size, with the API's rules (Note [Options checked once]).
void check_config(const TrainOptions& o) {
  runtime::check_train_config(o.config, o.effective_world);
}

// --micro-batches N splits each rank's --tokens into N micro-batches of tokens / N (idempotent:
// the config then holds the per-micro-batch count, as TrainConfig::tokens means).
void split_micro_batches(TrainOptions& o) {
  runtime::TrainConfig& c = o.config;
  FSDP_USER_CHECK(o.micro_batches >= 1, "--micro-batches must be >= 1, got ", o.micro_batches);
  if (o.micro_batches == c.micro_batches) return;
  FSDP_USER_CHECK(c.tokens % o.micro_batches == 0, "--tokens (", c.tokens,
                  ") must be divisible by --micro-batches (", o.micro_batches, ")");
  const bool sequences = models::family(c.model.kind).batch_kind() == models::BatchKind::Tokens;
  FSDP_USER_CHECK(!sequences || (c.tokens / o.micro_batches) % c.model.seq_len == 0,
                  "--tokens / --micro-batches (", c.tokens / o.micro_batches,
                  ") must be a multiple of --seq-len (", c.model.seq_len, ")");
  c.tokens /= o.micro_batches;
  c.micro_batches = o.micro_batches;
}

// Note [Captured steps] (src/runtime/captured_step.h).
void check_cuda_graph(TrainOptions& o, const std::string& backend) {
  if (!o.cuda_graph) return;
  FSDP_USER_CHECK(backend != "cpu", "--cuda-graph needs the CUDA backend (--backend cuda); the "
                  "CPU backend cannot capture CUDA graphs");
  o.config.cuda_graph = true;
  o.config.prefetch_next_step = false;  // a prefetch crosses the step boundary
}

namespace {

std::string check_train_options_in_api_terms(TrainOptions& o, std::string& why) {
  check_ranges(o);
  split_micro_batches(o);
  resolve_defaults(o);
  const std::string backend = choose_backend(o, why);
  check_cuda_graph(o, backend);
  check_config(o);
  attach_token_data(o);
  check_capacity(o, backend);
  check_writable("--json", o.json_path);
  check_writable("--trace", o.trace_path);
  return backend;
}

}  // namespace

void check_simulate_options(TrainOptions& o, int gpus) {
  try {
    check_ranges(o);
    split_micro_batches(o);
    resolve_defaults(o);
    o.effective_world = gpus;
    if (o.cuda_graph) o.config.prefetch_next_step = false;  // as check_cuda_graph
    check_config(o);
    check_writable("--json", o.json_path);
    check_writable("--trace", o.trace_path);
  } catch (const OptionError& e) {  // Note [Options checked once]
    throw UserError(flag_of(e.option()) + e.rest());
  }
}

std::string check_train_options(TrainOptions& o, std::string& why) {
  try {
    return check_train_options_in_api_terms(o, why);
  } catch (const OptionError& e) {  // Note [Options checked once]: the flag's name instead
    throw UserError(flag_of(e.option()) + e.rest());
  }
}

}  // namespace fsdp::tools
