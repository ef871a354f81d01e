// The trainer on CPU ranks that are processes (Note [CPU ranks as processes]): each rank's
// RankResult travels back to its launcher as JSON.
#include "runtime/launch.h"
#include "runtime/rank_result_json.h"

namespace fsdp::runtime {

std::vector<RankResult> run_cpu_process_training(
    int nproc, const cpu::CpuOptions& options, const CpuProcessOptions& where,
    const TrainConfig& config, const std::function<void(const StepReport&)>& on_step) {
  const CpuProcessLaunch launch = launch::run_cpu_process_world(
      nproc, options, where, [&](int rank, Device& device, std::shared_ptr<Comm> world) {
        return rank_result_to_json(train_rank(device, world, config, rank == 0 ? on_step : nullptr));
      });
  std::vector<RankResult> results;
  for (const std::string& r : launch.results) results.push_back(rank_result_from_json(r));
  return results;
}

}  // namespace fsdp::runtime
