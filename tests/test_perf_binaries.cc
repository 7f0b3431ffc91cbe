// The perf binaries end to end: one short sweep, then its exit code and its table. The host-backend run works
// everywhere (CI included); the GPU run (NCCL side by side) skips without a GPU.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/child_test.h"
#include "tests/gpu_util.h"
#include "tools/model/json_in.h"

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

// The all-reduce on one hop (one node of 4), two hops (2x2) and one hop across nodes of 1, an odd count of fp16
// elements, int8 in blocks of 32: every output equal to the host reference, out of place and in place.
TEST(PerfBinaries, AllReduceOnTheHostBackendGivesCleanTables) {
  expectCleanTable(runBinary("all_reduce_perf", "-H -t 4 -N 1 -b 64K -e 256K -f 2 -n 2 -w 1 -o avg"), 3);
  expectCleanTable(runBinary("all_reduce_perf", "-H -t 4 -N 2 -b 1K -e 1M -f 32 -n 2 -w 1"), 3);
  expectCleanTable(runBinary("all_reduce_perf", "-H -t 3 -N 3 -b 2002 -e 2002 -n 1 -w 0 -d half -B 8 -G 32"), 1);
}

TEST(PerfBinaries, JsonCarriesProvenanceAndEveryRound) {
  char dir[] = "/tmp/zp_perf_binary_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/qwz.json";
  const BinaryRun run = runBinary("qwz_perf", "-H -t 4 -N 2 -b 64K -e 128K -f 2 -n 2 -w 1 -r 3 -R host -J " + path);
  expectCleanTable(run, 2);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  rmdir(dir);
  EXPECT_EQ(text.str().rfind("{\"provenance\": {\"schema\": \"zpccl-provenance/1\", \"commit\": ", 0), 0u)
      << text.str();
  EXPECT_NE(text.str().find("\"command\": \"" + std::string(ZP_PERF_DIR) + "/qwz_perf -H -t 4 -N 2 -b 64K"),
            std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("\"regime\": \"host\""), std::string::npos) << text.str();
  std::vector<zp::perf::PerfRow> rows;
  std::string error;
  ASSERT_TRUE(zp::perf::parsePerfJson(text.str(), &rows, &error)) << error;
  ASSERT_EQ(rows.size(), 2u) << text.str();
  for (const auto& row : rows) {
    EXPECT_EQ(row.op, "qwz_all_gather");
    EXPECT_EQ(row.wrong, 0);
    ASSERT_EQ(row.roundsUs.size(), 3u) << text.str();  // -r 3: each round kept, the median is the time
    std::vector<double> sorted = row.roundsUs;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_DOUBLE_EQ(row.timeUs, sorted[1]);
  }
}

TEST(PerfBinaries, BadFlagsExitTwo) {
  const BinaryRun run = runBinary("qwz_perf", "-H -B 6");
  EXPECT_EQ(run.exitCode, 2) << run.output;
}

TEST(PerfBinaries, QwzOnGpusWithNcclSideBySide) {
  ZP_REQUIRE_GPUS(1);
  // The default rounds against a baseline: zpccl's calls and NCCL's timed in turn, five times.
  const BinaryRun run = runBinary("qwz_perf", "-b 1M -e 4M -f 2 -n 3 -w 1");
  expectCleanTable(run, 3);
  for (const auto& row : tableRows(run.output)) {
    // ... | nccl: time busbw speedup rounds(min-max) [| nccl matched: time speedup]
    ASSERT_GE(row.size(), 17u) << run.output;
    EXPECT_GT(std::stod(row[15]), 0.0) << "speedup\n" << run.output;
    EXPECT_NE(row[16].find('-'), std::string::npos) << "the rounds' least and greatest speedups\n" << run.output;
  }
  EXPECT_NE(run.output.find("rounds 5"), std::string::npos) << run.output;
}

// The all-reduce against ncclAllReduce in the same run: every output equal to the host backend's, counts of whole
// shards and others (4 MiB of bf16 on one GPU: whole; 1000003 bytes of fp16: the padded copy).
TEST(PerfBinaries, AllReduceOnGpusWithNcclSideBySide) {
  ZP_REQUIRE_GPUS(1);
  expectCleanTable(runBinary("all_reduce_perf", "-b 1M -e 4M -f 2 -n 3 -w 1"), 3);
  expectCleanTable(runBinary("all_reduce_perf", "-b 1000003 -e 1000003 -n 3 -w 1 -d half -B 8 -G 64"), 1);
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
    // size count type redop bits | time algbw busbw #wrong | memcpy: time busbw speedup rounds (no in-place variant)
    ASSERT_EQ(row.size(), 13u) << run.output;
    EXPECT_EQ(row[8], "0") << "#wrong\n" << run.output;
    EXPECT_GT(std::stod(row[5]), 0.0) << "time\n" << run.output;
    EXPECT_GT(std::stod(row[9]), 0.0) << "memcpy time\n" << run.output;
  }
  EXPECT_EQ(run.output.find("FAILED"), std::string::npos) << run.output;
}

}  // namespace
