// Waiting for the processes of a local launch (one per rank, `fsdp train --nproc N`).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace fsdp::launch {

// Waits for every child in `pids` (pids[i] runs rank first_rank + i) and reaps all of them. When one
// fails (exits non-zero or dies by a signal), the others are sent SIGTERM at once and
// SIGKILL `grace_s` seconds later if they are still there, so a dead rank never leaves the
// rest waiting for it in a collective. Returns "" when all exited with status 0, otherwise
// the first failure: "rank 1 was killed by signal 9 (Killed)" or "rank 0 exited with
// status 1". `on_first_failure(rank, description)`, when given, runs once, before the others
// are stopped (to record the failure where ranks on other hosts can read it);
// `on_reaped(rank)` runs as each child is reaped, before that (to count the ranks out).
// Every launch form that forks ranks waits through this one function.
std::string wait_for_rank_processes(
    const std::vector<pid_t>& pids, int first_rank = 0, double grace_s = 10,
    const std::function<void(int rank, const std::string& failure)>& on_first_failure = {},
    const std::function<void(int rank)>& on_reaped = {});

// How `status` (from waitpid) ended rank `rank`; "" for a clean exit.
std::string describe_rank_exit(int rank, int status);

}  // namespace fsdp::launch
