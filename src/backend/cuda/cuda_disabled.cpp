// Built when nvcc or NCCL is missing: --backend cuda then fails with this message.
#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"

namespace fsdp::cuda {
bool compiled_with_cuda() { return false; }
std::string build_versions() { return "built without CUDA and NCCL"; }
int device_count() { return 0; }
GpuMemory device_memory(int) { return {}; }
void set_collective_timeout_s(double) {}  // nothing to watch without NCCL
void set_exit_when_hung(bool) {}
void set_lost_rank_reader(std::function<std::string(double)>) {}
void abort_communicators(int, const std::string&) {}
UniqueId make_unique_id() { FSDP_FAIL("this build of fsdp has no CUDA backend (nvcc or NCCL missing at build time)"); }
std::unique_ptr<Device> make_device(int) { FSDP_FAIL("this build of fsdp has no CUDA backend (nvcc or NCCL missing at build time)"); }
std::unique_ptr<Comm> make_world_comm(Device&, const UniqueId&, int, int) { FSDP_FAIL("this build of fsdp has no CUDA backend (nvcc or NCCL missing at build time)"); }
}  // namespace fsdp::cuda
