// Runs the fsdp command (build/fsdp) from a test: its exit code and everything it printed.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace fsdp::testing {

struct CommandResult {
  int code;  // -1 when it did not exit normally (a crash)
  std::string output;
};

inline CommandResult run_fsdp_command_prefixed(const std::string& prefix, const std::string& args) {
  const std::string cmd = prefix + std::string(FSDP_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

inline CommandResult run_fsdp_command(const std::string& args) { return run_fsdp_command_prefixed("", args); }

}  // namespace fsdp::testing
