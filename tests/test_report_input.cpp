// `fsdp report`'s input: gzip-compressed traces read directly, and short one-line errors for a
// directory given as the trace, for a negative count, and for a trace whose fields are not
// what the writer writes (Note [Checked JSON]).
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "command_util.h"

namespace fsdp::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void gzip_file(const std::string& from, const std::string& to) {
  const std::string text = read_file(from);
  gzFile out = gzopen(to.c_str(), "wb");
  ASSERT_TRUE(out);
  ASSERT_EQ(gzwrite(out, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(out), Z_OK);
}

// The report without its first line, which names the file it read.
std::string without_first_line(const std::string& out) { return out.substr(out.find('\n') + 1); }

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// A small real trace, one file per test (ctest runs the tests in parallel processes).
std::string small_trace() {
  const std::string path = ::testing::TempDir() + "report_input_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                           ".json";
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 32 --tokens 8 "
      "--steps 2 --quiet --trace " + path);
  EXPECT_EQ(r.code, 0) << r.output;
  return path;
}

TEST(ReportInput, ReadsAGzippedTraceAsThePlainOne) {
  const std::string trace = small_trace();
  const std::string gz = trace + ".gz";
  gzip_file(trace, gz);
  ASSERT_NE(read_file(gz), read_file(trace));  // really compressed
  const CommandResult plain = run_fsdp_command("report " + trace + " --top 3");
  const CommandResult packed = run_fsdp_command("report " + gz + " --top 3");
  ASSERT_EQ(plain.code, 0) << plain.output;
  ASSERT_EQ(packed.code, 0) << packed.output;
  EXPECT_NE(plain.output.find("exposed_comm_ms"), std::string::npos) << plain.output;
  EXPECT_EQ(without_first_line(packed.output), without_first_line(plain.output));
}

TEST(ReportInput, ADirectoryAsTheTraceIsAOneLineError) {
  const CommandResult r = run_fsdp_command("report " + ::testing::TempDir());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(count_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("is a directory"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal"), std::string::npos) << r.output;
}

TEST(ReportInput, ACorruptGzipIsAnError) {
  const std::string gz = ::testing::TempDir() + "report_input_cut.json.gz";
  gzip_file(small_trace(), gz);
  const std::string whole = read_file(gz);
  std::ofstream(gz, std::ios::binary) << whole.substr(0, whole.size() / 2);
  const CommandResult r = run_fsdp_command("report " + gz);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(count_lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("report_input_cut.json.gz"), std::string::npos) << r.output;
}

TEST(ReportInput, NegativeCountsAreRefusedBriefly) {
  const std::string trace = small_trace();
  for (const std::string flag : {"--top -1", "--top -7", "--rank -1", "--top many"}) {
    const CommandResult r = run_fsdp_command("report " + trace + " " + flag);
    EXPECT_EQ(r.code, 2) << flag << ": " << r.output;
    EXPECT_EQ(count_lines(r.output), 1) << flag << ": " << r.output;
    EXPECT_LT(r.output.size(), 120u) << flag << ": " << r.output;
    EXPECT_NE(r.output.find(">= 0"), std::string::npos) << flag << ": " << r.output;
  }
}

// A trace edited by hand or by anyone: every field is checked where it is read, so a bad one is
// one line naming the file and the event, never an allocation sized from it (a tid of 2^31
// made 2^31 stream names), an internal error in the JSON library's words, or a source line.
TEST(ReportInput, TracesWithFieldsOfTheWrongKindOrSizeAreOneLineErrors) {
  const nlohmann::json good = nlohmann::json::parse(read_file(small_trace()));
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json t = good;
    edit(t);
    return t.dump();
  };
  auto first_x = [](nlohmann::json& t) -> nlohmann::json& {
    for (nlohmann::json& e : t["traceEvents"])
      if (e["ph"] == "X") return e;
    return t;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {edited([](nlohmann::json& t) {
         t["traceEvents"].push_back(
             {{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", 2000000000}, {"args", {{"name", "x"}}}});
       }),
       "tid must be an integer in [0, 1024]"},
      {edited([](nlohmann::json& t) {
         t["traceEvents"].push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", 2}, {"args", 5}});
       }),
       "args must be an object"},
      {edited([&](nlohmann::json& t) { first_x(t)["dur"] = -1e300; }), "dur must be a time"},
      {edited([&](nlohmann::json& t) { first_x(t)["cat"] = "gizmo"; }), "cat is 'gizmo', not one of"},
      {edited([&](nlohmann::json& t) { first_x(t)["pid"] = "zero"; }), "pid must be an integer"},
      {edited([](nlohmann::json& t) { t["traceEvents"] = 5; }), "traceEvents must be an array"},
      {edited([](nlohmann::json& t) { t["otherData"]["fsdp"]["ranks"] = {{{"rank", "x"}}}; }),
       "rank must be an integer"},
      {"{\"traceEvents\": [", "is corrupt: not valid JSON"},
      {std::string(100000, '['), "nests deeper than 32 levels"},
  };
  const std::string path = ::testing::TempDir() + "report_input_edited.json";
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << cases[i].first;
    const CommandResult r = run_fsdp_command("report " + path + " --svg " + path + ".svg");
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(count_lines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find(path), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(cases[i].second), std::string::npos) << r.output;
    for (const char* crash : {"internal error", "json.exception", ".cpp:"})
      EXPECT_EQ(r.output.find(crash), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace fsdp::testing
