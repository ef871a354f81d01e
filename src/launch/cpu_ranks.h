// The CPU launcher with the backend's own options (tests and the trainer set every field of
// cpu::CpuOptions); the public fsdp::run_cpu_ranks maps CpuLaunchOptions onto it.
#pragma once

#include "backend/cpu/cpu_backend.h"
#include "fsdp/launch.h"

namespace fsdp::launch {

void run_cpu_world(int world_size, const cpu::CpuOptions& options, const RankBody& body);

}  // namespace fsdp::launch

namespace fsdp::launch {

// Ranks as processes (Note [CPU ranks as processes]): `options` configures each rank's
// device, and its collective_timeout_s bounds every collective and rendezvous wait; the
// rest of `where` (its cpu field aside) places the ranks.
CpuProcessLaunch run_cpu_process_world(int nproc, const cpu::CpuOptions& options,
                                       const CpuProcessOptions& where,
                                       const RankBodyWithResult& body);

}  // namespace fsdp::launch
