// Starting ranks: threads on the CPU backend, processes (one per GPU) on CUDA.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "fsdp/comm.h"
#include "fsdp/device.h"

namespace fsdp::runtime {

using RankBody = std::function<void(int rank, Device& device, std::shared_ptr<Comm> world)>;

// Runs `body` on `world_size` rank threads sharing one CpuWorld. If any rank throws, the
// world is aborted (so the others stop instead of hanging) and the first error is rethrown.
void run_cpu_ranks(int world_size, const cpu::CpuOptions& options, const RankBody& body);

}  // namespace fsdp::runtime
