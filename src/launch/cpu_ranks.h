// The CPU launcher with the backend's own options (tests and the trainer set every field of
// cpu::CpuOptions); the public fsdp::run_cpu_ranks maps CpuLaunchOptions onto it.
#pragma once

#include "backend/cpu/cpu_backend.h"
#include "fsdp/launch.h"

namespace fsdp::launch {

void run_cpu_world(int world_size, const cpu::CpuOptions& options, const RankBody& body);

}  // namespace fsdp::launch
