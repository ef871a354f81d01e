// Waiting for the processes of a local launch (one per rank, `fsdp train --nproc N`).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace fsdp::launch {

// Waits for every child in `pids` (pids[i] runs rank first_rank + i) and reaps all of them.
// When one fails (exits non-zero or dies by a signal), the others are sent SIGTERM at once and
// SIGKILL `grace_s` seconds later if they are still there, so a dead rank never leaves the
// rest waiting for it in a collective; a signal that StopSignals recorded stops them all so
// too (with that signal). Returns "" when all exited with status 0, otherwise the first
// failure: "rank 1 was killed by signal 9 (Killed)", "rank 0 exited with status 1", or
// "stopped by signal 15 (Terminated)". `on_first_failure(rank, description)`, when given,
// runs once, before the others are stopped (to record the failure where ranks on other hosts
// can read it); `on_reaped(rank)` runs as each child is reaped, before that (to count the
// ranks out). `own_error(rank)`, when given, is the error a rank that exited non-zero left
// (read_rank_error): the failure is then "rank 0: out of memory on cuda:0 ...", its own line,
// not only its exit status. Every launch form that forks ranks waits through this one function.
std::string wait_for_rank_processes(
    const std::vector<pid_t>& pids, int first_rank = 0, double grace_s = 10,
    const std::function<void(int rank, const std::string& failure)>& on_first_failure = {},
    const std::function<void(int rank)>& on_reaped = {},
    const std::function<std::string(int rank)>& own_error = {});

// A failing rank process leaves its one-line error at `path` before it exits (never throws:
// it is on the way out), so its launcher's message and JSON summary say what went wrong; the
// launcher reads it back (at most 64 KiB; "" when there is none).
bool write_rank_error(const std::string& path, const std::string& what) noexcept;  // false: not written
std::string read_rank_error(const std::string& path);

// How `status` (from waitpid) ended rank `rank`; "" for a clean exit.
std::string describe_rank_exit(int rank, int status);

// The signals that end a process by default and that a user or a system sends to stop it
// (SIGTERM, SIGINT, SIGHUP when its terminal goes, SIGQUIT), while a launcher runs its ranks:
// recorded instead of ending the process at once, so that wait_for_rank_processes ends the
// ranks (the signal, then SIGKILL after its grace) and the launcher removes its files before
// it goes, by the same signal. One that the process ignores (nohup's SIGHUP) stays ignored.
class StopSignals {
 public:
  StopSignals();   // installs the handlers
  ~StopSignals();  // end_if_received(), if not called before
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // In a child forked meanwhile: the default actions again (a rank dies of them as before).
  static void reset_in_child();
  // The signal received since the handlers were installed; 0 for none.
  static int received();
  // Puts the previous handlers back and raises the signal received, if one was, so that it
  // is handled as it would have been without these: by default, this process ends by it.
  void end_if_received();

 private:
  static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  struct sigaction old_[std::size(kSignals)] {};
  bool installed_[std::size(kSignals)] = {};
  bool restored_ = false;
};

// A new private directory for the ranks' result files: $TMPDIR (else /tmp)/<prefix>XXXXXX.
std::string make_results_dir(const std::string& prefix);

}  // namespace fsdp::launch
