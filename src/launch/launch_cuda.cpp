// Note [Launching on GPUs]
// fork() per GPU works only if the parent never touched CUDA (the children then fail with
// "initialization error"). So the parent asks a throwaway child for the GPU count, makes the
// NCCL unique id (which does not initialize CUDA), then forks one child per GPU. Each child
// runs its rank and writes the body's result into a file that the parent reads back.
// Under an external launcher (torchrun --no-python), RANK and WORLD_SIZE are set: this
// process is one rank; rank 0 makes the unique id and hands it out over TCP on
// MASTER_ADDR:(MASTER_PORT + 1), since torchrun's own store holds MASTER_PORT.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "launch/rank_processes.h"

namespace fsdp {

namespace {

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

std::string run_one_rank(int rank, int world, int local_rank, const cuda::UniqueId& id,
                         const RankBodyWithResult& body) {
  this_thread_identity() = {rank, "cuda:" + std::to_string(local_rank)};
  cuda::set_exit_when_hung(true);  // this process is one rank (Note [NCCL watchdog])
  std::unique_ptr<Device> device = cuda::make_device(local_rank);
  std::shared_ptr<Comm> comm = cuda::make_world_comm(*device, id, rank, world);
  std::string result = body(rank, *device, comm);
  device->synchronize();
  comm.reset();
  return result;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

// Under an external launcher: rank 0 hands the unique id to the others over TCP.
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

bool cuda_backend_built() { return cuda::compiled_with_cuda(); }

int visible_gpu_count() {
  if (!cuda::compiled_with_cuda()) return 0;
  pid_t pid = ::fork();
  if (pid == 0) _exit(std::min(cuda::device_count(), 100));
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

bool under_external_launcher() { return std::getenv("RANK") && std::getenv("WORLD_SIZE"); }

CudaLaunch run_cuda_ranks_with_results(int nproc, const RankBodyWithResult& body) {
  FSDP_CHECK(cuda::compiled_with_cuda(),
             "this build has no CUDA backend (configure with nvcc and NCCL present)");
  CudaLaunch launch;
  if (under_external_launcher()) {
    const int rank = env_int("RANK", 0), world = env_int("WORLD_SIZE", 1);
    const int local_rank = env_int("LOCAL_RANK", rank);
    launch.world_size = world;
    launch.this_rank = rank;
    const cuda::UniqueId id = exchange_unique_id(rank, world);
    launch.results.push_back(run_one_rank(rank, world, local_rank, id, body));
    return launch;
  }
  FSDP_CHECK(nproc >= 0, "the number of processes must be >= 0 (0: one per GPU), got ", nproc);
  const int gpus = visible_gpu_count();
  FSDP_CHECK(gpus > 0, "no CUDA GPU is visible");
  const int world = nproc > 0 ? nproc : gpus;
  FSDP_CHECK(world <= gpus, world, " processes were asked for but only ", gpus,
             " GPUs are visible");
  launch.world_size = world;
  const cuda::UniqueId id = cuda::make_unique_id();
  // Each child writes its result (which can be large) to a file here.
  char dir_template[] = "/tmp/fsdp-ranks-XXXXXX";
  FSDP_CHECK(::mkdtemp(dir_template), "cannot make a temporary directory: ", std::strerror(errno));
  const std::string dir = dir_template;
  auto result_path = [&](int rank) { return dir + "/rank" + std::to_string(rank) + ".out"; };
  std::vector<pid_t> pids;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int rank = 0; rank < world; ++rank) {
    pid_t pid = ::fork();
    FSDP_CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        const std::string result = run_one_rank(rank, world, rank, id, body);
        std::ofstream(result_path(rank), std::ios::binary) << result;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "fsdp: error: %s\n", e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::_Exit(code);  // a child must not run the parent's atexit handlers
    }
    pids.push_back(pid);
  }
  // If one child fails, the others would wait in NCCL forever: they are stopped at once, and
  // the error names the rank that failed first (rank_processes.h).
  const std::string first_failure = launch::wait_for_rank_processes(pids);
  bool failed = !first_failure.empty();
  launch.results.resize(world);
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(result_path(rank), std::ios::binary);
    if (!in.good()) failed = true;
    else launch.results[rank].assign(std::istreambuf_iterator<char>(in), {});
    ::unlink(result_path(rank).c_str());
  }
  ::rmdir(dir.c_str());
  if (!first_failure.empty())
    FSDP_FAIL(first_failure, "; the other ranks were stopped (any errors they printed are above)");
  FSDP_CHECK(!failed, "a GPU rank left no result");
  return launch;
}

int run_cuda_ranks(int nproc, const RankBody& body) {
  return run_cuda_ranks_with_results(nproc, [&](int rank, Device& device,
                                                std::shared_ptr<Comm> world) {
           body(rank, device, std::move(world));
           return std::string();
         }).world_size;
}

}  // namespace fsdp
