// The --nproc parent's wait (rank_processes.h). It polls each child with WNOHANG rather than
// waitpid(-1): only its own children are reaped (a caller may have others), and it can act
// the moment any one of them fails, whatever the order they end in.
#include "launch/rank_processes.h"

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
#include <thread>

#include "fsdp/error.h"

namespace fsdp::launch {

namespace {

volatile sig_atomic_t g_stop_signal = 0;
constexpr size_t kMaxRankErrorBytes = 64 << 10;

void record_stop(int sig) { g_stop_signal = sig; }

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = record_stop;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    ::sigaction(kSignals[i], nullptr, &old_[i]);
    if (old_[i].sa_handler == SIG_IGN) continue;  // nohup's SIGHUP: it stays ignored
    ::sigaction(kSignals[i], &sa, nullptr);
    installed_[i] = true;
  }
}

StopSignals::~StopSignals() { end_if_received(); }

void StopSignals::reset_in_child() {
  for (int sig : kSignals) {
    struct sigaction now {};
    if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == record_stop)
      ::signal(sig, SIG_DFL);
  }
  g_stop_signal = 0;
  // A rank that dies closes its sockets; the next write to one raises SIGPIPE, which would end
  // this rank too, silently, before it can say which peer it lost. Ignored, the write fails
  // with EPIPE and the rank reports it (Gloo's and the store's writes alike).
  ::signal(SIGPIPE, SIG_IGN);
}

int StopSignals::received() { return g_stop_signal; }

void StopSignals::end_if_received() {
  if (restored_) return;
  restored_ = true;
  for (size_t i = 0; i < std::size(kSignals); ++i)
    if (installed_[i]) ::sigaction(kSignals[i], &old_[i], nullptr);
  const int sig = g_stop_signal;
  g_stop_signal = 0;
  if (sig == 0) return;
  // Handled now as it would have been without us: by default, the end of this process.
  std::fflush(stdout);
  std::fflush(stderr);
  ::raise(sig);
}

std::string make_results_dir(const std::string& prefix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "XXXXXX";
  FSDP_USER_CHECK(::mkdtemp(path.data()), "cannot make a temporary directory ", path, ": ",
                  std::strerror(errno), " (is TMPDIR a writable directory?)");
  return path;
}

std::string describe_rank_exit(int rank, int status) {
  if (WIFEXITED(status))
    return WEXITSTATUS(status) == 0
               ? std::string()
               : detail::concat("rank ", rank, " exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return detail::concat("rank ", rank, " was killed by signal ", WTERMSIG(status),
                          name ? detail::concat(" (", name, ")") : std::string());
  }
  return detail::concat("rank ", rank, " ended with wait status ", status);
}

std::string wait_for_rank_processes(
    const std::vector<pid_t>& pids, int first_rank, double grace_s,
    const std::function<void(int rank, const std::string& failure)>& on_first_failure,
    const std::function<void(int rank)>& on_reaped,
    const std::function<std::string(int rank)>& own_error) {
  using Clock = std::chrono::steady_clock;
  std::vector<bool> reaped(pids.size(), false);
  size_t left = pids.size();
  std::string first_failure;
  Clock::time_point kill_at{};
  bool killed = false;
  bool stopping = false;
  while (left > 0) {
    if (const int sig = StopSignals::received(); sig != 0 && !stopping) {
      // This launcher was told to stop: so are its ranks, and the grace is theirs too.
      stopping = true;
      const char* name = ::strsignal(sig);
      if (first_failure.empty())
        first_failure = detail::concat("stopped by signal ", sig,
                                       name ? detail::concat(" (", name, ")") : std::string());
      for (size_t r = 0; r < pids.size(); ++r)
        if (!reaped[r]) ::kill(pids[r], sig);
      if (!killed && kill_at == Clock::time_point{})
        kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(grace_s));
    }
    bool progressed = false;
    for (size_t r = 0; r < pids.size(); ++r) {
      if (reaped[r]) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got == 0) continue;
      reaped[r] = true;
      --left;
      progressed = true;
      // A pid that is not our child any more (reaped elsewhere) cannot be accounted for.
      const int rank = first_rank + static_cast<int>(r);
      if (on_reaped) on_reaped(rank);
      std::string failure =
          got < 0 ? detail::concat("rank ", rank, " could not be waited for: ", std::strerror(errno))
                  : describe_rank_exit(rank, status);
      if (!failure.empty() && got > 0 && WIFEXITED(status) && own_error)
        if (const std::string own = own_error(rank); !own.empty())
          failure = detail::concat("rank ", rank, ": ", own);
      if (failure.empty() || !first_failure.empty()) continue;
      // The first failure: the others would wait for this rank forever, so stop them now.
      first_failure = failure;
      if (on_first_failure) on_first_failure(rank, failure);
      for (size_t other = 0; other < pids.size(); ++other)
        if (!reaped[other]) ::kill(pids[other], SIGTERM);
      kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(grace_s));
    }
    if (left == 0) break;
    if (!first_failure.empty() && !killed && kill_at != Clock::time_point{} &&
        Clock::now() >= kill_at) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (!reaped[r]) ::kill(pids[r], SIGKILL);
      killed = true;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return first_failure;
}

bool write_rank_error(const std::string& path, const std::string& what) noexcept {
  try {
    std::string line = what.substr(0, kMaxRankErrorBytes);
    std::replace(line.begin(), line.end(), '\n', ' ');  // one line, whatever the error held
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << line;
    out.close();
    return out.good();
  } catch (...) {
    return false;  // the rank prints its error itself, and its launcher names its exit
  }
}

std::string read_rank_error(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return "";
  std::string text(kMaxRankErrorBytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

}  // namespace fsdp::launch
