// Note [Launching on GPUs]
// fork() per GPU works only if the parent never touched CUDA (the children then fail with
// "initialization error"). So the parent asks a throwaway child for the GPU count, makes the
// NCCL unique id (which does not initialize CUDA), then forks one child per GPU. Each child
// trains and writes its RankResult as JSON into a pipe; the parent collects them.
// Under an external launcher (torchrun --no-python), RANK and WORLD_SIZE are set: this
// process is one rank; rank 0 makes the unique id and hands it out over TCP on
// MASTER_ADDR:(MASTER_PORT + 1), since torchrun's own store holds MASTER_PORT.
#include "runtime/launch_cuda.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"

namespace fsdp::runtime {

namespace {

nlohmann::json timeline_to_json(const Timeline& t) {
  nlohmann::json ops = nlohmann::json::array(), memory = nlohmann::json::array();
  for (const TimelineOp& op : t.ops)
    ops.push_back({op.label, op.stream, static_cast<int>(op.kind), op.start_us, op.end_us, op.waited_for});
  for (const MemSample& m : t.memory) memory.push_back({m.time_us, m.bytes});
  return {{"streams", t.stream_names}, {"ops", ops}, {"memory", memory}};
}

Timeline timeline_from_json(const nlohmann::json& j) {
  Timeline t;
  t.stream_names = j["streams"].get<std::vector<std::string>>();
  for (const auto& o : j["ops"])
    t.ops.push_back({o[0], o[1], static_cast<OpKind>(o[2].get<int>()), o[3], o[4], o[5]});
  for (const auto& m : j["memory"]) t.memory.push_back({m[0], m[1]});
  return t;
}

nlohmann::json to_json(const RankResult& r) {
  const MemStats& m = r.memory;
  return {{"rank", r.rank},
          {"timeline", timeline_to_json(r.timeline)},
          {"losses", r.losses},
          {"step_ms", r.step_ms},
          {"host_us", r.host_schedule_us_per_unit},
          {"peak", m.peak_bytes},
          {"rs_live", m.tag_peak_live[static_cast<int>(MemTag::RsInput)]},
          {"params", r.param_count},
          {"max_expert_loads", r.max_expert_loads}};
}

RankResult from_json(const nlohmann::json& j) {
  RankResult r;
  r.rank = j["rank"];
  r.losses = j["losses"].get<std::vector<float>>();
  r.step_ms = j["step_ms"].get<std::vector<double>>();
  r.host_schedule_us_per_unit = j["host_us"];
  r.memory.peak_bytes = j["peak"];
  r.memory.tag_peak_live[static_cast<int>(MemTag::RsInput)] = j["rs_live"];
  r.param_count = j["params"];
  r.max_expert_loads = j["max_expert_loads"].get<std::vector<double>>();
  r.timeline = timeline_from_json(j["timeline"]);
  return r;
}

void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
  return s;
}

RankResult train_one_rank(int rank, int world, int local_rank, const cuda::UniqueId& id,
                          const TrainConfig& config,
                          const std::function<void(const StepReport&)>& on_step) {
  this_thread_identity() = {rank, "cuda:" + std::to_string(local_rank)};
  std::unique_ptr<Device> device = cuda::make_device(local_rank);
  std::shared_ptr<Comm> comm = cuda::make_world_comm(*device, id, rank, world);
  RankResult r = train_rank(*device, comm, config, rank == 0 ? on_step : nullptr);
  device->synchronize();
  comm.reset();
  return r;
}

// ---- torchrun mode: hand the unique id from rank 0 to the others over TCP
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

cuda::UniqueId exchange_unique_id(int rank, int world) {
  const char* addr = std::getenv("MASTER_ADDR");
  const int port = env_int("MASTER_PORT", 29500) + 1;
  FSDP_CHECK(addr, "RANK is set but MASTER_ADDR is not (the torchrun contract needs both)");
  cuda::UniqueId id;
  if (rank == 0) {
    id = cuda::make_unique_id();
    int server = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<uint16_t>(port));
    FSDP_CHECK(::bind(server, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0,
               "cannot listen on port ", port, " for the NCCL id: ", std::strerror(errno));
    ::listen(server, world);
    for (int i = 1; i < world; ++i) {
      int c = ::accept(server, nullptr, nullptr);
      FSDP_CHECK(c >= 0, "accept failed: ", std::strerror(errno));
      write_all(c, std::string(id.bytes.data(), id.bytes.size()));
      ::close(c);
    }
    ::close(server);
    return id;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  FSDP_CHECK(::getaddrinfo(addr, std::to_string(port).c_str(), &hints, &res) == 0 && res,
             "cannot resolve MASTER_ADDR '", addr, "'");
  for (int attempt = 0; attempt < 600; ++attempt) {  // up to 60 s for rank 0 to come up
    int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(s, res->ai_addr, res->ai_addrlen) == 0) {
      std::string got = read_all(s);
      ::close(s);
      ::freeaddrinfo(res);
      FSDP_CHECK(got.size() == id.bytes.size(), "short NCCL id from rank 0");
      std::memcpy(id.bytes.data(), got.data(), got.size());
      return id;
    }
    ::close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ::freeaddrinfo(res);
  FSDP_FAIL("rank ", rank, " could not reach rank 0 at ", addr, ":", port, " for the NCCL id");
}

}  // namespace

int visible_gpu_count() {
  if (!cuda::compiled_with_cuda()) return 0;
  pid_t pid = ::fork();
  if (pid == 0) _exit(std::min(cuda::device_count(), 100));
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

std::vector<RankResult> run_cuda_training(int nproc, const TrainConfig& config,
                                          const std::function<void(const StepReport&)>& on_step,
                                          int& world_out) {
  if (std::getenv("RANK") && std::getenv("WORLD_SIZE")) {
    const int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1);
    const int local_rank = env_int("LOCAL_RANK", rank);
    world_out = world;
    const cuda::UniqueId id = exchange_unique_id(rank, world);
    RankResult r = train_one_rank(rank, world, local_rank, id, config, on_step);
    if (rank != 0) std::_Exit(0);  // only rank 0 reports
    return {r};
  }
  const int gpus = visible_gpu_count();
  FSDP_CHECK(gpus > 0, "--backend cuda: no CUDA GPU is visible");
  const int world = nproc > 0 ? nproc : gpus;
  FSDP_CHECK(world <= gpus, "--nproc ", world, " but only ", gpus, " GPUs are visible");
  world_out = world;
  const cuda::UniqueId id = cuda::make_unique_id();
  // Each child writes its result (timeline included, so it can be large) to a file here.
  char dir_template[] = "/tmp/fsdp-ranks-XXXXXX";
  FSDP_CHECK(::mkdtemp(dir_template), "cannot make a temporary directory: ", std::strerror(errno));
  const std::string dir = dir_template;
  auto result_path = [&](int rank) { return dir + "/rank" + std::to_string(rank) + ".json"; };
  std::vector<pid_t> pids;
  std::fflush(stdout);
  for (int rank = 0; rank < world; ++rank) {
    pid_t pid = ::fork();
    FSDP_CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        RankResult r = train_one_rank(rank, world, rank, id, config, on_step);
        std::ofstream(result_path(rank)) << to_json(r).dump();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "fsdp: error: %s\n", e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::_Exit(code);  // a child must not run the parent's atexit handlers
    }
    pids.push_back(pid);
  }
  // Wait for every child; if one fails, the others would wait in NCCL forever: stop them.
  bool failed = false;
  for (int done = 0; done < world; ++done) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (!failed)
        for (pid_t other : pids)
          if (other != pid) ::kill(other, SIGTERM);
      failed = true;
    }
  }
  std::vector<RankResult> results(world);
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(result_path(rank));
    if (!in.good()) failed = true;
    else if (!failed) results[rank] = from_json(nlohmann::json::parse(in));
    ::unlink(result_path(rank).c_str());
  }
  ::rmdir(dir.c_str());
  FSDP_CHECK(!failed, "one or more GPU ranks failed (their errors are above)");
  return results;
}

}  // namespace fsdp::runtime
