// The perf binaries end to end: one short sweep, then its exit code and its table. The host-backend run works
// everywhere (CI included); the GPU run (NCCL side by side) skips without a GPU.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tests/child_test.h"
#include "tests/gpu_util.h"

namespace {

using BinaryRun = zptest::ChildRun;

BinaryRun runBinary(const std::string& name, const std::string& flags) {
  return zptest::runCommand(std::string(ZP_PERF_DIR) + "/" + name + " " + flags + " 2>&1");
}

// The table's data rows (lines starting with a size), split into columns.
std::vector<std::vector<std::string>> tableRows(const std::string& output) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::vector<std::string> columns;
    for (std::string w; words >> w;) columns.push_back(w);
    if (!columns.empty() && std::isdigit(static_cast<unsigned char>(columns[0][0]))) rows.push_back(columns);
  }
  return rows;
}

void expectCleanTable(const BinaryRun& run, size_t sizes) {
  EXPECT_EQ(run.exitCode, 0) << run.output;
  const auto rows = tableRows(run.output);
  ASSERT_EQ(rows.size(), sizes) << run.output;
  for (const auto& row : rows) {
    ASSERT_GE(row.size(), 14u) << run.output;
    // size count type redop bits | out of place: time algbw busbw #wrong | in place: time algbw busbw #wrong | ...
    EXPECT_EQ(row[8], "0") << "out-of-place #wrong\n" << run.output;
    EXPECT_GT(std::stod(row[5]), 0.0) << "time\n" << run.output;
    EXPECT_EQ(row[12], "0") << "in-place #wrong\n" << run.output;
  }
  EXPECT_NE(run.output.find("# Out of bounds values : 0 OK"), std::string::npos) << run.output;
}

TEST(PerfBinaries, QwzAndQgzOnTheHostBackendGiveCleanTables) {
  expectCleanTable(runBinary("qwz_perf", "-H -t 4 -N 2 -b 64K -e 256K -f 2 -n 2 -w 1"), 3);
  expectCleanTable(runBinary("qgz_perf", "-H -t 4 -N 2 -b 64K -e 256K -f 2 -n 2 -w 1 -o avg"), 3);
}

TEST(PerfBinaries, BadFlagsExitTwo) {
  const BinaryRun run = runBinary("qwz_perf", "-H -B 6");
  EXPECT_EQ(run.exitCode, 2) << run.output;
}

TEST(PerfBinaries, QwzOnGpusWithNcclSideBySide) {
  ZP_REQUIRE_GPUS(1);
  // Two rounds (-r): zpccl's calls and NCCL's timed in turn, twice.
  const BinaryRun run = runBinary("qwz_perf", "-b 1M -e 4M -f 2 -n 3 -w 1 -r 2");
  expectCleanTable(run, 3);
  for (const auto& row : tableRows(run.output)) EXPECT_GT(std::stod(row.back()), 0.0) << "speedup\n" << run.output;
}

TEST(PerfBinaries, ReduceKernelsRefuseTheHostBackend) {
  const BinaryRun run = runBinary("reduce_perf", "-H");
  EXPECT_EQ(run.exitCode, 2) << run.output;
  EXPECT_NE(run.output.find("no host backend"), std::string::npos) << run.output;
}

TEST(PerfBinaries, ReduceKernelsOnOneGpu) {
  ZP_REQUIRE_GPUS(1);
  const BinaryRun run = runBinary("reduce_perf", "-b 1M -e 4M -f 4 -n 3 -w 1 -B 4 -G 64");
  EXPECT_EQ(run.exitCode, 0) << run.output;
  const auto rows = tableRows(run.output);
  ASSERT_EQ(rows.size(), 7u * 2u) << "seven kernels, two sizes\n" << run.output;
  for (const auto& row : rows) {
    // size count type redop bits | time algbw busbw #wrong | memcpy: time busbw | speedup (no in-place variant)
    ASSERT_EQ(row.size(), 12u) << run.output;
    EXPECT_EQ(row[8], "0") << "#wrong\n" << run.output;
    EXPECT_GT(std::stod(row[5]), 0.0) << "time\n" << run.output;
    EXPECT_GT(std::stod(row[9]), 0.0) << "memcpy time\n" << run.output;
  }
  EXPECT_EQ(run.output.find("FAILED"), std::string::npos) << run.output;
}

}  // namespace
