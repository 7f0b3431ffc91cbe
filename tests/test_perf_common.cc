// The perf harness's host-side pieces: flags, the size sweep, buffer sizes, bandwidth and wire-byte formulas,
// deterministic data and references, the JSON writer and reader with the files' provenance, the NCCL settings of
// the matched baseline, the rank layout, and the file rendezvous of multi-process runs.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "host/base/params.h"
#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "perf/common.h"
#include "perf/json_out.h"
#include "perf/options.h"
#include "perf/proc_group.h"
#include "perf/provenance.h"
#include "perf/rank_layout.h"
#include "tools/model/json_in.h"

namespace zp {
namespace perf {
namespace {

ParseResult parse(std::vector<std::string> args, Options* o, std::string* error) {
  args.insert(args.begin(), "perf");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(&a[0]);
  return parseOptions(int(argv.size()), argv.data(), o, error);
}

TEST(PerfOptions, ParseBytes) {
  size_t b = 0;
  EXPECT_TRUE(parseBytes("64", &b));
  EXPECT_EQ(b, 64u);
  EXPECT_TRUE(parseBytes("1K", &b));
  EXPECT_EQ(b, 1024u);
  EXPECT_TRUE(parseBytes("32M", &b));
  EXPECT_EQ(b, size_t(32) << 20);
  EXPECT_TRUE(parseBytes("1g", &b));
  EXPECT_EQ(b, size_t(1) << 30);
  EXPECT_TRUE(parseBytes("2GB", &b));
  EXPECT_EQ(b, size_t(2) << 30);
  EXPECT_TRUE(parseBytes("4MiB", &b));
  EXPECT_EQ(b, size_t(4) << 20);
  EXPECT_TRUE(parseBytes("0", &b));
  EXPECT_EQ(b, 0u);
  for (const char* bad : {"", "abc", "-1", "1X", "1.5M", "M", "1MM", "99999999999999999999", "20000000000T"})
    EXPECT_FALSE(parseBytes(bad, &b)) << bad;
}

TEST(PerfOptions, Defaults) {
  Options o;
  std::string error;
  ASSERT_EQ(parse({}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.minBytes, size_t(32) << 20);
  EXPECT_EQ(o.maxBytes, size_t(32) << 20);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmup, 5);
  EXPECT_EQ(o.rounds, 0);  // the harness's default: kDefaultComparedRounds against a baseline, else 1
  EXPECT_GE(kDefaultComparedRounds, 5);
  EXPECT_EQ(o.check, 1);
  EXPECT_EQ(o.type, -1);
  EXPECT_EQ(o.blockSize, 256);
  EXPECT_EQ(o.inPlace, 1);
  EXPECT_EQ(o.host, 0);
  EXPECT_EQ(o.nprocs, 0);
  EXPECT_EQ(o.shareGpus, 0);
}

TEST(PerfOptions, EveryFlag) {
  Options o;
  std::string error;
  ASSERT_EQ(parse({"-b", "1M",   "-e", "1G",  "-f", "4", "-i", "2M", "-n", "7", "-w", "3",   "-c", "0",
                   "-d", "half", "-o", "avg", "-g", "1", "-t", "2",  "-B", "4", "-G", "128", "-J", "out.json",
                   "-R", "net",  "-H", "1",   "-N", "2", "-p", "0",  "-r", "4", "-S", "1"},
                  &o, &error),
            ParseResult::kOk)
      << error;
  EXPECT_EQ(o.minBytes, size_t(1) << 20);
  EXPECT_EQ(o.maxBytes, size_t(1) << 30);
  EXPECT_EQ(o.stepFactor, 4.0);
  EXPECT_EQ(o.stepBytes, size_t(2) << 20);
  EXPECT_EQ(o.iters, 7);
  EXPECT_EQ(o.warmup, 3);
  EXPECT_EQ(o.check, 0);
  EXPECT_EQ(o.type, zpFloat16);
  EXPECT_EQ(o.redOp, zpAvg);
  EXPECT_EQ(o.threads, 2);
  EXPECT_EQ(o.bits, 4);
  EXPECT_EQ(o.blockSize, 128);
  EXPECT_EQ(o.json, "out.json");
  EXPECT_EQ(o.regime, "net");
  EXPECT_EQ(o.host, 1);
  EXPECT_EQ(o.nodes, 2);
  EXPECT_EQ(o.inPlace, 0);
  EXPECT_EQ(o.rounds, 4);
  EXPECT_EQ(o.shareGpus, 1);
}

TEST(PerfOptions, LongAndAttachedForms) {
  Options o;
  std::string error;
  ASSERT_EQ(parse({"--minbytes=4K", "--maxbytes", "64K", "-f2", "-dbf16", "--procindex=1", "--nprocs=2", "--rendezvous",
                   "/tmp/x"},
                  &o, &error),
            ParseResult::kOk)
      << error;
  EXPECT_EQ(o.minBytes, 4096u);
  EXPECT_EQ(o.maxBytes, 65536u);
  EXPECT_EQ(o.stepFactor, 2.0);
  EXPECT_EQ(o.type, zpBfloat16);
  EXPECT_EQ(o.nprocs, 2);
  EXPECT_EQ(o.procIndex, 1);
  EXPECT_EQ(o.rendezvousDir, "/tmp/x");
}

TEST(PerfOptions, HostSwitchTakesAnOptionalValue) {
  Options o;
  std::string error;
  ASSERT_EQ(parse({"-H", "-t", "8", "-N", "2"}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.host, 1);
  EXPECT_EQ(o.threads, 8);
  ASSERT_EQ(parse({"-H", "0", "-t", "8"}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.host, 0);
  ASSERT_EQ(parse({"-b", "1K", "-H"}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.host, 1);
  ASSERT_EQ(parse({"--host=0"}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.host, 0);
  ASSERT_EQ(parse({"--host"}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.host, 1);
  ASSERT_EQ(parse({"-H1"}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.host, 1);
}

TEST(PerfOptions, Help) {
  Options o;
  std::string error;
  EXPECT_EQ(parse({"-h"}, &o, &error), ParseResult::kHelp);
  EXPECT_EQ(parse({"-b", "1M", "--help"}, &o, &error), ParseResult::kHelp);
}

TEST(PerfOptions, BadFlagsAreRejected) {
  unsetenv("ZP_PERF_RENDEZVOUS");
  const std::vector<std::vector<std::string>> bad = {
      {"-x", "1"},
      {"-b"},
      {"-b", "huge"},
      {"-b", "2M", "-e", "1M"},
      {"-f", "0.5"},
      {"-n", "0"},
      {"-w", "-1"},
      {"-r", "0"},
      {"-r", "1001"},
      {"-c", "2"},
      {"-d", "complex"},
      {"-o", "prod"},
      {"-g", "2"},
      {"-B", "5"},
      {"-G", "100"},
      {"-G", "16384"},
      {"-t", "0"},
      {"-H", "2"},
      {"-S", "2"},
      {"-N", "0"},
      {"-P", "2"},
      {"-P", "2", "-I", "2", "-D", "/tmp"},
      {"-I", "0"},
      {"-P", "2", "-I", "0"},
      {"-H", "1", "-P", "2", "-I", "0", "-D", "/tmp"},
      {"-b", "0", "-e", "1G", "-i", "1"},
      {"-i", "0", "-b", "1K", "-e", "2K"},
      {"--nosuchflag=1"},
      {"--json="},
      {"stray"},
  };
  for (const auto& args : bad) {
    Options o;
    std::string error;
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(parse(args, &o, &error), ParseResult::kError) << joined;
    EXPECT_FALSE(error.empty()) << joined;
  }
}

TEST(PerfOptions, RendezvousFromEnvironment) {
  setenv("ZP_PERF_RENDEZVOUS", "/tmp/rdv", 1);
  Options o;
  std::string error;
  EXPECT_EQ(parse({"-P", "2", "-I", "1"}, &o, &error), ParseResult::kOk) << error;
  EXPECT_EQ(o.rendezvousDir, "/tmp/rdv");
  unsetenv("ZP_PERF_RENDEZVOUS");
}

TEST(PerfOptions, DataTypesAndOps) {
  EXPECT_EQ(parseDataType("half"), zpFloat16);
  EXPECT_EQ(parseDataType("bfloat16"), zpBfloat16);
  EXPECT_EQ(parseDataType("float"), zpFloat32);
  EXPECT_EQ(parseDataType("FLOAT"), zpFloat32);
  EXPECT_EQ(parseDataType("int8"), zpInt8);
  EXPECT_EQ(parseDataType("uint64"), zpUint64);
  EXPECT_EQ(parseDataType("double"), zpFloat64);
  EXPECT_EQ(parseDataType("f8e4m3"), -1);
  EXPECT_EQ(parseRedOp("sum"), zpSum);
  EXPECT_EQ(parseRedOp("avg"), zpAvg);
  EXPECT_EQ(parseRedOp("max"), -1);
}

std::vector<size_t> sweep(std::vector<std::string> args) {
  Options o;
  std::string error;
  EXPECT_EQ(parse(args, &o, &error), ParseResult::kOk) << error;
  return sizeSweep(o);
}

TEST(PerfSweep, Multiplicative) {
  const size_t M = size_t(1) << 20;
  EXPECT_EQ(sweep({"-b", "1M", "-e", "1G", "-f", "4"}),
            (std::vector<size_t>{M, 4 * M, 16 * M, 64 * M, 256 * M, 1024 * M}));
  // The maximum is included only when the steps land on it.
  EXPECT_EQ(sweep({"-b", "1M", "-e", "10M", "-f", "4"}), (std::vector<size_t>{M, 4 * M}));
  EXPECT_EQ(sweep({"-b", "0", "-e", "4", "-f", "2"}), (std::vector<size_t>{0, 1, 2, 4}));
  EXPECT_EQ(sweep({"-b", "10", "-e", "20", "-f", "1.01"}).size(), 11u);  // never stalls
}

TEST(PerfSweep, Additive) {
  EXPECT_EQ(sweep({"-b", "1K", "-e", "4K", "-i", "1K"}), (std::vector<size_t>{1024, 2048, 3072, 4096}));
  EXPECT_EQ(sweep({"-b", "1K", "-e", "4500", "-i", "1K"}), (std::vector<size_t>{1024, 2048, 3072, 4096}));
  EXPECT_EQ(sweep({"-b", "8M", "-e", "8M"}), (std::vector<size_t>{size_t(8) << 20}));
  EXPECT_EQ(sweep({"-b", "8M", "-e", "8M", "-i", "0"}), (std::vector<size_t>{size_t(8) << 20}));
}

// ---- sizes, bandwidth and wire bytes -----------------------------------------------------------------------

PerfOp opWithFill(Fill fill) {
  PerfOp op;
  op.name = "test";
  op.fill = fill;
  return op;
}

SizeArgs sizeArgs(const PerfOp* op, size_t bytes, zpDataType_t type, int rank, int nranks) {
  SizeArgs s;
  s.op = op;
  s.bytes = bytes;
  s.type = type;
  s.rank = rank;
  s.nranks = nranks;
  return s;
}

TEST(PerfCounts, AllGatherRoundsDownToWholeElementsPerRank) {
  OpCounts c;
  countsAllGather(sizeArgs(nullptr, 1000, zpBfloat16, 2, 3), &c);
  EXPECT_EQ(c.paramCount, 166u);  // 1000 / (2 * 3)
  EXPECT_EQ(c.bytes, 996u);
  EXPECT_EQ(c.count, 498u);
  EXPECT_EQ(c.sendBytes, 332u);
  EXPECT_EQ(c.recvBytes, 996u);
  EXPECT_EQ(c.ipSendOffset, 664u);  // recvbuff + rank * sendcount
  EXPECT_EQ(c.ipRecvOffset, 0u);
}

TEST(PerfCounts, ReduceScatterAndAllToAll) {
  OpCounts c;
  countsReduceScatter(sizeArgs(nullptr, size_t(1) << 20, zpFloat32, 1, 4), &c);
  EXPECT_EQ(c.paramCount, 65536u);
  EXPECT_EQ(c.sendBytes, size_t(1) << 20);
  EXPECT_EQ(c.recvBytes, size_t(1) << 18);
  EXPECT_EQ(c.ipSendOffset, 0u);
  EXPECT_EQ(c.ipRecvOffset, size_t(1) << 18);  // sendbuff + rank * recvcount
  countsAllToAll(sizeArgs(nullptr, 4096, zpFloat16, 0, 8), &c);
  EXPECT_EQ(c.paramCount, 256u);
  EXPECT_EQ(c.sendBytes, 4096u);
  EXPECT_EQ(c.recvBytes, 4096u);
}

TEST(PerfBandwidth, CollectiveFactorIsNMinusOneOverN) {
  PerfOp op = opWithFill(Fill::kSpread);
  SizeArgs s = sizeArgs(&op, 0, zpBfloat16, 0, 4);
  OpCounts c;
  c.bytes = 2000000000;
  double alg = 0, bus = 0;
  bwCollective(s, c, 2.0, &alg, &bus);
  EXPECT_DOUBLE_EQ(alg, 1.0);
  EXPECT_DOUBLE_EQ(bus, 0.75);
  s.nranks = 1;
  bwCollective(s, c, 2.0, &alg, &bus);
  EXPECT_DOUBLE_EQ(bus, 0.0);
  EXPECT_DOUBLE_EQ(busFactorCollective(2), 0.5);
  EXPECT_DOUBLE_EQ(busFactorCollective(8), 0.875);
  c.sendBytes = 3000000000;
  c.recvBytes = 1000000000;
  bwLocal(s, c, 2.0, &alg, &bus);  // read + written
  EXPECT_DOUBLE_EQ(alg, 2.0);
  EXPECT_DOUBLE_EQ(bus, 2.0);
  bwCollective(s, c, 0.0, &alg, &bus);
  EXPECT_EQ(alg, 0.0);
}

TEST(PerfWire, RingAndDirect) {
  // 8 ranks, 2 nodes, 800 bytes: each rank sends 7/8 * 800 = 700; 2 of 8 ring edges cross.
  WireBytes w = ringWire(800, 8, 2);
  EXPECT_DOUBLE_EQ(w.inter, 175.0);
  EXPECT_DOUBLE_EQ(w.intra, 525.0);
  // Per node: 4 ranks * 175 = 700 = (n-1)/n of the data leaves each node.
  w = ringWire(800, 8, 1);
  EXPECT_DOUBLE_EQ(w.inter, 0.0);
  EXPECT_DOUBLE_EQ(w.intra, 700.0);
  w = ringWire(800, 8, 8);  // one rank per node: everything crosses
  EXPECT_DOUBLE_EQ(w.inter, 700.0);
  EXPECT_DOUBLE_EQ(w.intra, 0.0);
  w = directWire(10, 8, 2);
  EXPECT_DOUBLE_EQ(w.intra, 30.0);
  EXPECT_DOUBLE_EQ(w.inter, 40.0);
  w = ringWire(800, 1, 1);
  EXPECT_DOUBLE_EQ(w.intra + w.inter, 0.0);
}

// The perf binaries' wire bytes take qgZ's and the all-reduce's two-hop path where the library does: equal nodes
// of several ranks, wherever the nodes' ranks sit; an uneven layout is one hop even when the node count divides
// the rank count.
TEST(PerfWire, TwoHopsWhereTheLibraryTakesThem) {
  struct Layout {
    std::vector<int> nodeOf;
    bool twoHops;
  };
  const Layout layouts[] = {{{0, 0, 1, 1}, true},        {{0, 1, 0, 1}, true},  {{0, 0, 1, 1, 2, 2}, true},
                            {{0, 0, 0, 0}, false},       {{0, 1, 2, 3}, false}, {{0, 0, 0, 1}, false},
                            {{0, 0, 1, 1, 1, 1}, false}, {{0}, false}};
  for (const Layout& l : layouts) {
    SizeArgs s;
    s.nranks = static_cast<int>(l.nodeOf.size());
    s.nodes = *std::max_element(l.nodeOf.begin(), l.nodeOf.end()) + 1;
    s.nodeOf = l.nodeOf.data();
    for (s.rank = 0; s.rank < s.nranks; ++s.rank)
      EXPECT_EQ(zpTwoHops(s), l.twoHops) << "rank " << s.rank << " of " << ::testing::PrintToString(l.nodeOf);
  }
}

// ---- data and references -----------------------------------------------------------------------------------

TEST(PerfData, SpreadValuesAreDeterministicVariedAndInRange) {
  double minAbs = 1, maxAbs = 0;
  int zeros = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const float v = spreadValue(3, i);
    ASSERT_GE(v, -1.0f);
    ASSERT_LT(v, 1.0f);
    ASSERT_EQ(v, spreadValue(3, i));
    zeros += v == 0.0f;
    if (v != 0.0f) {
      minAbs = std::min(minAbs, double(std::fabs(v)));
      maxAbs = std::max(maxAbs, double(std::fabs(v)));
    }
  }
  EXPECT_LT(zeros, 10);
  EXPECT_GT(maxAbs, 0.99);
  EXPECT_LT(minAbs, 1e-4);
  EXPECT_NE(spreadValue(0, 5), spreadValue(1, 5));
}

TEST(PerfData, ExactValuesAreEighths) {
  int counts[16] = {};
  for (uint64_t i = 0; i < 10000; ++i) {
    const float v = exactValue(1, i);
    const float k = v * 8.0f;
    ASSERT_EQ(k, std::floor(k));
    ASSERT_GE(k, -8.0f);
    ASSERT_LE(k, 7.0f);
    counts[int(k) + 8]++;
  }
  for (int c : counts) EXPECT_GT(c, 400);
}

TEST(PerfData, HalfAndBf16RoundToNearestEven) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);             // tie to even (zero)
  EXPECT_EQ(floatToHalf(std::ldexp(3.0f, -25)), 0x0002);             // 1.5 units: tie to even (2)
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie to even
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie to even, upward
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(floatToHalf(NAN) & 0x7c00, 0x7c00);
  EXPECT_NE(floatToHalf(NAN) & 0x03ff, 0);
  for (uint32_t h = 0; h < 0x7c00; ++h) ASSERT_EQ(floatToHalf(halfToFloat(uint16_t(h))), h) << h;
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie to even
  EXPECT_EQ(floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie to even, upward
  EXPECT_EQ(bf16ToFloat(0xbf80), -1.0f);
  EXPECT_EQ(floatToBf16(NAN) & 0x7fc0, 0x7fc0);
}

TEST(PerfData, FillAndLoadEveryType) {
  for (int t : {zpInt8, zpUint8, zpInt32, zpUint32, zpInt64, zpUint64, zpFloat16, zpFloat32, zpFloat64, zpBfloat16}) {
    std::vector<char> buf(64 * 8);
    ASSERT_TRUE(fillData(zpDataType_t(t), Fill::kExact, 2, 100, 64, buf.data())) << t;
    bool nonzero = false;
    for (size_t i = 0; i < 64; ++i) {
      const double v = loadAsDouble(zpDataType_t(t), buf.data(), i);
      const bool isUnsigned = t == zpUint8 || t == zpUint32 || t == zpUint64;
      const bool integer = t != zpFloat16 && t != zpFloat32 && t != zpFloat64 && t != zpBfloat16;
      double expected = double(exactValue(2, 100 + i));
      if (integer) expected = expected * 8 + (isUnsigned ? 8 : 0);
      ASSERT_EQ(v, expected) << t << " " << i;
      nonzero = nonzero || v != 0;
    }
    EXPECT_TRUE(nonzero);
  }
  std::vector<char> buf(16);
  EXPECT_FALSE(fillData(zpFloat8e4m3, Fill::kSpread, 0, 0, 4, buf.data()));
}

TEST(PerfReference, AllGatherReduceScatterAllToAll) {
  const int n = 3;
  for (Fill fill : {Fill::kSpread, Fill::kExact}) {
    PerfOp op = opWithFill(fill);
    const SizeArgs s = sizeArgs(&op, 3 * 2 * 1000, zpBfloat16, 1, n);
    OpCounts c;
    countsAllGather(s, &c);
    std::vector<uint16_t> got(c.recvBytes / 2), mine(c.sendBytes / 2);
    expectedAllGather(s, c, nullptr, got.data());
    for (int r = 0; r < n; ++r) {
      const SizeArgs sr = sizeArgs(&op, s.bytes, zpBfloat16, r, n);
      initStandard(sr, c, mine.data());
      ASSERT_EQ(0, std::memcmp(got.data() + r * c.paramCount, mine.data(), c.sendBytes));
    }
    EXPECT_EQ(compareBitwise(s, c, got.data(), got.data()), 0u);
    std::vector<uint16_t> broken = got;
    broken[0] ^= 1;
    broken[7] ^= 0x8000;
    EXPECT_EQ(compareBitwise(s, c, broken.data(), got.data()), 2u);
  }
  PerfOp op = opWithFill(Fill::kExact);
  for (zpRedOp_t red : {zpSum, zpAvg}) {
    SizeArgs s = sizeArgs(&op, 4 * 2 * 3000, zpFloat16, 2, 4);
    s.redOp = red;
    OpCounts c;
    countsReduceScatter(s, &c);
    std::vector<uint16_t> got(c.recvBytes / 2), in(c.sendBytes / 2);
    expectedReduceScatter(s, c, nullptr, got.data());
    std::vector<double> sum(c.paramCount, 0.0);
    for (int r = 0; r < 4; ++r) {
      initStandard(sizeArgs(&op, s.bytes, zpFloat16, r, 4), c, in.data());
      for (size_t i = 0; i < c.paramCount; ++i) sum[i] += halfToFloat(in[2 * c.paramCount + i]);
    }
    for (size_t i = 0; i < c.paramCount; ++i) ASSERT_EQ(halfToFloat(got[i]), red == zpAvg ? sum[i] / 4 : sum[i]) << i;
  }
  {
    PerfOp spread = opWithFill(Fill::kSpread);
    const SizeArgs s = sizeArgs(&spread, 4 * 4 * 100, zpFloat32, 3, 4);
    OpCounts c;
    countsAllToAll(s, &c);
    std::vector<float> got(c.recvBytes / 4), peer(c.sendBytes / 4);
    expectedAllToAll(s, c, nullptr, got.data());
    for (int p = 0; p < 4; ++p) {
      initStandard(sizeArgs(&spread, s.bytes, zpFloat32, p, 4), c, peer.data());
      for (size_t i = 0; i < c.paramCount; ++i) ASSERT_EQ(got[p * c.paramCount + i], peer[3 * c.paramCount + i]);
    }
  }
}

TEST(PerfParallel, ParallelForCoversEveryItemOnce) {
  setHostThreads(4);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4097)}) {
    std::vector<std::atomic<int>> hits(n);
    parallelFor(n, 100, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) hits[i]++;
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
  }
  setHostThreads(0);
}

TEST(PerfParallel, QuantizeRefInPiecesEqualsOneCall) {
  setHostThreads(3);
  for (int bits : {8, 4})
    for (int block : {32, 256})
      for (size_t count : {size_t(1), size_t(1001), size_t(3) * (size_t(1) << 20) + 77}) {
        std::vector<float> in(count);
        fillData(zpFloat32, Fill::kSpread, 1, 0, count, in.data());
        const size_t bytes = quantPayloadBytes(count, bits, block);
        std::vector<unsigned char> one(bytes, 0xaa), pieces(bytes, 0x55);
        quantizeRef(in.data(), zpFloat32, count, bits, block, one.data());
        quantizeRefParallel(in.data(), zpFloat32, count, bits, block, pieces.data());
        ASSERT_EQ(0, std::memcmp(one.data(), pieces.data(), bytes)) << bits << " " << block << " " << count;
        std::vector<float> outOne(count), outPieces(count);
        dequantizeRef(one.data(), zpFloat32, count, bits, block, outOne.data());
        dequantizeRefParallel(one.data(), zpFloat32, count, bits, block, outPieces.data());
        ASSERT_EQ(0, std::memcmp(outOne.data(), outPieces.data(), count * 4)) << bits << " " << block << " " << count;
      }
  setHostThreads(0);
}

// ---- JSON --------------------------------------------------------------------------------------------------

// A strict little JSON syntax check: enough to prove that what the writer emits parses.
class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool valid() {
    skip();
    if (!value()) return false;
    skip();
    return i_ == s_.size();
  }

 private:
  void skip() {
    while (i_ < s_.size() && std::strchr(" \n\r\t", s_[i_])) ++i_;
  }
  bool lit(const char* w) {
    size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool str() {
    if (s_[i_] != '"') return false;
    for (++i_; i_ < s_.size(); ++i_) {
      if (s_[i_] == '"') {
        ++i_;
        return true;
      }
      if (static_cast<unsigned char>(s_[i_]) < 0x20) return false;
      if (s_[i_] == '\\') ++i_;
    }
    return false;
  }
  bool num() {
    size_t start = i_;
    if (s_[i_] == '-') ++i_;
    while (i_ < s_.size() && std::strchr("0123456789.eE+-", s_[i_])) ++i_;
    return i_ > start;
  }
  bool value() {
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      skip();
      if (s_[i_] == close) {
        ++i_;
        return true;
      }
      for (;;) {
        skip();
        if (c == '{') {
          if (!str()) return false;
          skip();
          if (s_[i_++] != ':') return false;
          skip();
        }
        if (!value()) return false;
        skip();
        if (s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (s_[i_] == close) {
          ++i_;
          return true;
        }
        return false;
      }
    }
    if (c == '"') return str();
    if (lit("null") || lit("true") || lit("false")) return true;
    return num();
  }
  const std::string& s_;
  size_t i_ = 0;
};

ResultRow sampleRow() {
  ResultRow row;
  row.op = "qwz_all_gather";
  row.regime = "net";
  row.backend = "cuda";
  row.size = 1048576;
  row.count = 524288;
  row.type = "bfloat16";
  row.bits = 8;
  row.block = 256;
  row.ranks = 2;
  row.nodes = 2;
  row.oop = {true, 1234.5, 0.85, 0.425, true, 0, 20.5, {}};
  row.ip = {true, 1300.25, 0.8, 0.4, true, 3, 21, {}};
  row.baselineName = "nccl";
  row.baseline = {true, 2469.0, 0.42, 0.21, false, 0, 7.25, {}};
  row.speedup = 2.0;
  return row;
}

TEST(PerfJson, RowMatchesExpectedText) {
  EXPECT_EQ(
      rowToJson(sampleRow()),
      "{\"op\": \"qwz_all_gather\", \"regime\": \"net\", \"backend\": \"cuda\", \"size\": 1048576, "
      "\"count\": 524288, \"type\": \"bfloat16\", \"redop\": null, \"bits\": 8, \"block\": 256, "
      "\"ranks\": 2, \"nodes\": 2, "
      "\"oop\": {\"time_us\": 1234.5, \"enqueue_us\": 20.5, \"algbw\": 0.85, \"busbw\": 0.425, \"wrong\": 0}, "
      "\"ip\": {\"time_us\": 1300.25, \"enqueue_us\": 21, \"algbw\": 0.8, \"busbw\": 0.4, \"wrong\": 3}, "
      "\"baseline\": \"nccl\", \"nccl\": {\"time_us\": 2469, \"enqueue_us\": 7.25, \"busbw\": 0.21}, \"speedup\": 2, "
      "\"nccl_config\": {\"min_ctas\": null, \"max_ctas\": null, \"net_channels_per_peer\": null}}");
}

TEST(PerfJson, TunablesOfTheRunAreWrittenWhenSet) {
  ResultRow row = sampleRow();
  row.env = {{"ZP_CHUNK_BYTES", "16777216"}, {"ZP_NCCL_SMS", "32"}};
  const std::string json = rowToJson(row);
  EXPECT_NE(
      json.find(
          "\"net_channels_per_peer\": null}, \"env\": {\"ZP_CHUNK_BYTES\": \"16777216\", \"ZP_NCCL_SMS\": \"32\"}}"),
      std::string::npos)
      << json;
  EXPECT_TRUE(JsonChecker(json).valid()) << json;
}

TEST(PerfJson, TunablesComeFromZpVariablesButNotDebugOnes) {
  setenv("ZP_TEST_TUNABLE", "7", 1);
  setenv("ZP_DEBUG_SUBSYS", "COLL", 1);
  setenv("ZP_GPU_CHECK_BITS", "4", 1);
  setenv("ZP_PERF_RENDEZVOUS_TIMEOUT", "60", 1);
  const auto env = zpTunablesInEnvironment();
  unsetenv("ZP_TEST_TUNABLE");
  unsetenv("ZP_DEBUG_SUBSYS");
  unsetenv("ZP_GPU_CHECK_BITS");
  unsetenv("ZP_PERF_RENDEZVOUS_TIMEOUT");
  for (const auto& [name, value] : env) {
    EXPECT_NE(name.rfind("ZP_GPU_CHECK_", 0), 0u) << name;
    EXPECT_NE(name.rfind("ZP_PERF_", 0), 0u) << name;
  }
  EXPECT_NE(std::find(env.begin(), env.end(), std::make_pair(std::string("ZP_TEST_TUNABLE"), std::string("7"))),
            env.end());
  for (const auto& [name, value] : env) EXPECT_NE(name.rfind("ZP_DEBUG", 0), 0u) << name;
  // Set or not, the settings that choose a collective's path are recorded with the values the library uses.
  for (const auto& [name, value] : pathTunables()) {
    const auto it = std::find_if(env.begin(), env.end(), [name = name](const auto& kv) { return kv.first == name; });
    ASSERT_NE(it, env.end()) << name;
    if (getenv(name) == nullptr) {
      EXPECT_EQ(it->second, std::to_string(value)) << name;
    }
  }
  EXPECT_TRUE(std::is_sorted(env.begin(), env.end()));
}

TEST(PerfJson, AbsentPartsAreNullAndMemcpyBaselineKeepsItsName) {
  ResultRow row = sampleRow();
  row.ip = Measure();
  row.oop.checked = false;
  row.baselineName = "memcpy";
  row.bits = 0;
  row.block = 0;
  row.redop = "sum";
  const std::string json = rowToJson(row);
  EXPECT_NE(json.find("\"ip\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"wrong\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"nccl\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"memcpy\": {\"time_us\": 2469"), std::string::npos) << json;
  EXPECT_NE(json.find("\"bits\": null, \"block\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"redop\": \"sum\""), std::string::npos) << json;
  EXPECT_TRUE(JsonChecker(json).valid()) << json;
  row.baselineName.clear();
  EXPECT_NE(rowToJson(row).find("\"baseline\": null, \"nccl\": null, \"speedup\": null"), std::string::npos);
}

TEST(PerfJson, EscapesAndNonFiniteNumbers) {
  ResultRow row = sampleRow();
  row.regime = "a\"b\\c\nd\x01";
  row.oop.busbw = NAN;
  row.speedup = INFINITY;
  row.hasWire = true;
  row.zpWire = {1.5e9, 2.5};
  const std::string json = rowToJson(row);
  EXPECT_NE(json.find("\"regime\": \"a\\\"b\\\\c\\nd\\u0001\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"busbw\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"speedup\": null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"wire_bytes_per_rank\": {\"zpccl\": {\"intra\": 1.5e+09, \"inter\": 2.5}"), std::string::npos)
      << json;
  EXPECT_TRUE(JsonChecker(json).valid()) << json;
}

TEST(PerfJson, EveryRoundIsWrittenWithItsMinimumAndMaximum) {
  ResultRow row = sampleRow();
  row.oop.roundsUs = {1300, 1234.5, 1200};
  row.baseline.roundsUs = {2500, 2469, 2400};
  row.speedupMin = 1.9230769;
  row.speedupMax = 2.0;
  const std::string json = rowToJson(row);
  EXPECT_NE(
      json.find("\"oop\": {\"time_us\": 1234.5, \"min_us\": 1200, \"max_us\": 1300, \"rounds_us\": [1300, 1234.5, "
                "1200], \"enqueue_us\": 20.5"),
      std::string::npos)
      << json;
  EXPECT_NE(
      json.find("\"nccl\": {\"time_us\": 2469, \"min_us\": 2400, \"max_us\": 2500, \"rounds_us\": [2500, 2469, 2400]"),
      std::string::npos)
      << json;
  EXPECT_NE(json.find("\"speedup\": 2, \"speedup_min\": 1.923077, \"speedup_max\": 2, "), std::string::npos) << json;
  // The in-place variant timed once has no rounds written.
  EXPECT_NE(json.find("\"ip\": {\"time_us\": 1300.25, \"enqueue_us\": 21,"), std::string::npos) << json;
  EXPECT_TRUE(JsonChecker(json).valid()) << json;
}

TEST(PerfJson, MatchedNcclBaselineBesideTheDefault) {
  ResultRow row = sampleRow();
  row.ncclConfig = {16, 32, 0};
  row.matched = {true, 1851.75, 0.5, 0.28, false, 0, 7.5, {}};
  row.speedupMatched = 1.5;
  const std::string json = rowToJson(row);
  EXPECT_NE(
      json.find(
          "\"nccl_config\": {\"min_ctas\": 16, \"max_ctas\": 32, \"net_channels_per_peer\": null}, "
          "\"nccl_matched\": {\"time_us\": 1851.75, \"enqueue_us\": 7.5, \"busbw\": 0.28}, \"speedup_matched\": 1.5}"),
      std::string::npos)
      << json;
  EXPECT_TRUE(JsonChecker(json).valid()) << json;
  // A memcpy baseline has no NCCL settings to match.
  row.baselineName = "memcpy";
  EXPECT_EQ(rowToJson(row).find("nccl_config"), std::string::npos);
  EXPECT_EQ(rowToJson(row).find("nccl_matched"), std::string::npos);
}

TEST(PerfNcclChannels, ZpcclsSettingsDecideTheMatchedBaseline) {
  ZpNcclFacts f;
  f.nodes = 1;
  f.nranks = 2;
  f.shmMinCtas = 16;
  EXPECT_FALSE(zpNcclChannelsFor(f).any());  // NVLink: NCCL's defaults, as the plain baseline
  f.p2pDisable = "1";
  NcclChannels c = zpNcclChannelsFor(f);  // one node over host shared memory: ZP_SHM_MIN_CTAS
  EXPECT_EQ(c.minCtas, 16);
  EXPECT_EQ(c.maxCtas, 32);
  EXPECT_EQ(c.netChannelsPerPeer, 0);
  f.shmMinCtas = 48;
  EXPECT_EQ(zpNcclChannelsFor(f).minCtas, 32);  // shmChannelsFor caps it at NCCL's usual maximum
  f.shmMinCtas = 16;
  f.shmDisable = "1";
  EXPECT_FALSE(zpNcclChannelsFor(f).any());  // sockets: no widening
  f.shmDisable = nullptr;
  f.nodes = 2;
  EXPECT_FALSE(zpNcclChannelsFor(f).any());  // two nodes: no widening
  f.ncclMinCtas = 40;                        // ZP_NCCL_MIN_CTAS asks every communicator, whatever the link
  c = zpNcclChannelsFor(f);
  EXPECT_EQ(c.minCtas, 40);
  EXPECT_EQ(c.maxCtas, 40);
  f.ncclMinCtas = 0;
  f.netChannelsPerPeer = 4;
  c = zpNcclChannelsFor(f);
  EXPECT_EQ(c.netChannelsPerPeer, 4);
  EXPECT_EQ(c.minCtas, 0);
  EXPECT_TRUE(c.any());
}

Provenance sampleProvenance() {
  Provenance p;
  p.commit = "d2970e1fd1cd9f4fb5dfb9620bf093c15e718fa9";
  p.dirty = 0;
  p.command = "build/perf/qwz_perf -b 1M -R 'net on1gpu'";
  p.cwd = "/src";
  p.env = {{"NCCL_P2P_DISABLE", "1"}, {"ZP_NCCL_SMS", "16"}};
  p.regime = "net-on1gpu";
  p.host = "h";
  p.timeUtc = "2026-12-05T10:00:00+00:00";
  p.gpuCount = 1;
  p.gpuModels = {"NVIDIA H200"};
  p.driver = "580.159.03";
  p.cudaRuntime = "13.0";
  p.ncclLoaded = "2.28.3";
  p.ncclFile = "/usr/lib/libnccl.so.2";
  p.zpcclVersion = "0.2.0";
  p.zpcclLibrary = "/src/build/perf/qwz_perf";
  return p;
}

TEST(PerfProvenance, RecordHasPythonsKeys) {
  const std::string json = provenanceToJson(sampleProvenance());
  EXPECT_EQ(
      json,
      "{\"schema\": \"zpccl-provenance/1\", \"commit\": \"d2970e1fd1cd9f4fb5dfb9620bf093c15e718fa9\", \"dirty\": "
      "false, "
      "\"command\": \"build/perf/qwz_perf -b 1M -R 'net on1gpu'\", \"cwd\": \"/src\", "
      "\"env\": {\"NCCL_P2P_DISABLE\": \"1\", \"ZP_NCCL_SMS\": \"16\"}, \"regime\": \"net-on1gpu\", \"host\": \"h\", "
      "\"time_utc\": \"2026-12-05T10:00:00+00:00\", \"python\": null, \"torch\": null, "
      "\"gpu\": {\"count\": 1, \"models\": [\"NVIDIA H200\"], \"driver\": \"580.159.03\"}, \"cuda_runtime\": \"13.0\", "
      "\"nccl\": {\"loaded\": \"2.28.3\", \"file\": \"/usr/lib/libnccl.so.2\", \"torch\": null}, "
      "\"zpccl\": {\"version\": \"0.2.0\", \"library\": \"/src/build/perf/qwz_perf\"}}");
  Provenance unknown;  // a build outside git, no GPU: nulls, count 0
  const std::string none = provenanceToJson(unknown);
  EXPECT_NE(none.find("\"commit\": null, \"dirty\": null"), std::string::npos) << none;
  EXPECT_NE(none.find("\"gpu\": {\"count\": 0, \"models\": [], \"driver\": null}"), std::string::npos) << none;
  EXPECT_TRUE(JsonChecker(none).valid()) << none;
}

TEST(PerfProvenance, PiecesOfTheRecord) {
  std::string commit;
  int dirty = 5;
  parseSourceState("d2970e1fd1cd9f4fb5dfb9620bf093c15e718fa9", &commit, &dirty);
  EXPECT_EQ(commit, "d2970e1fd1cd9f4fb5dfb9620bf093c15e718fa9");
  EXPECT_EQ(dirty, 0);
  parseSourceState("d2970e1fd1cd9f4fb5dfb9620bf093c15e718fa9-dirty", &commit, &dirty);
  EXPECT_EQ(commit, "d2970e1fd1cd9f4fb5dfb9620bf093c15e718fa9");
  EXPECT_EQ(dirty, 1);
  for (const char* unknown : {"unknown", "", "d2970e1-dirty", "v0.2-3-gd2970e1"}) {
    parseSourceState(unknown, &commit, &dirty);
    EXPECT_EQ(commit, "") << unknown;
    EXPECT_EQ(dirty, -1) << unknown;
  }
  EXPECT_EQ(shellQuote("-b"), "-b");
  EXPECT_EQ(shellQuote("build/perf/qwz_perf"), "build/perf/qwz_perf");
  EXPECT_EQ(shellQuote(""), "''");
  EXPECT_EQ(shellQuote("a b"), "'a b'");
  EXPECT_EQ(shellQuote("it's"), "'it'\"'\"'s'");
  std::vector<std::string> words = {"qgz_perf", "-R", "net on1gpu", "-B", "4"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(&w[0]);
  EXPECT_EQ(commandLine(int(argv.size()), argv.data()), "qgz_perf -R 'net on1gpu' -B 4");
  EXPECT_EQ(isoTimeUtc(0), "1970-01-01T00:00:00+00:00");
  EXPECT_EQ(isoTimeUtc(1796464703), "2026-12-05T09:58:23+00:00");
  std::vector<std::string> entries = {"ZP_NCCL_SMS=16",         "PATH=/bin",         "NCCL_P2P_DISABLE=1",
                                      "CUDA_VISIBLE_DEVICES=0", "OMP_NUM_THREADS=1", "ZPCCL_LIBRARY=/x",
                                      "NOT_NCCL_X=1",           "TORCH_X=a=b"};
  std::vector<char*> env;
  for (auto& e : entries) env.push_back(&e[0]);
  env.push_back(nullptr);
  const auto steering = steeringEnvironment(env.data());
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"CUDA_VISIBLE_DEVICES", "0"}, {"NCCL_P2P_DISABLE", "1"}, {"OMP_NUM_THREADS", "1"}, {"TORCH_X", "a=b"},
      {"ZPCCL_LIBRARY", "/x"},       {"ZP_NCCL_SMS", "16"}};
  EXPECT_EQ(steering, expected);
}

TEST(PerfProvenance, CollectedFromThisProcess) {
  setenv("ZP_TEST_PROVENANCE", "7", 1);
  std::vector<std::string> words = {"qwz_perf", "-R", "host"};
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(&w[0]);
  const Provenance p = collectProvenance(int(argv.size()), argv.data(), "host");
  unsetenv("ZP_TEST_PROVENANCE");
  EXPECT_EQ(p.command, "qwz_perf -R host");
  EXPECT_EQ(p.regime, "host");
  EXPECT_FALSE(p.cwd.empty());
  EXPECT_FALSE(p.host.empty());
  EXPECT_EQ(p.timeUtc.size(), 25u) << p.timeUtc;
  EXPECT_NE(std::find(p.env.begin(), p.env.end(), std::make_pair(std::string("ZP_TEST_PROVENANCE"), std::string("7"))),
            p.env.end());
  // Built from a git checkout (CI's), the commit is known; outside one it is null, never something else.
  EXPECT_TRUE(p.commit.empty() ? p.dirty == -1 : p.commit.size() == 40 && p.dirty >= 0) << p.commit;
  EXPECT_GE(p.gpuCount, 0);  // 0 without a GPU
  EXPECT_LE(p.gpuModels.size(), size_t(p.gpuCount));
  EXPECT_FALSE(p.ncclLoaded.empty());  // the binaries link NCCL, GPU or not
  EXPECT_FALSE(p.ncclFile.empty());
  int version = 0;
  ASSERT_EQ(zpGetVersion(&version), zpSuccess);
  EXPECT_EQ(p.zpcclVersion, std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
                                std::to_string(version % 100));
  EXPECT_FALSE(p.zpcclLibrary.empty());
  EXPECT_TRUE(JsonChecker(provenanceToJson(p)).valid()) << provenanceToJson(p);
}

TEST(PerfJson, FileRoundTrip) {
  char dir[] = "/tmp/zp_perf_json_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/rows.json";
  const Provenance provenance = sampleProvenance();
  std::string error;
  ASSERT_TRUE(writeJsonFile(path, provenance, {}, &error)) << error;
  {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(text.str(), "{\"provenance\": " + provenanceToJson(provenance) + ",\n \"rows\": [\n ]}\n");
    EXPECT_TRUE(JsonChecker(text.str()).valid());
  }
  std::vector<ResultRow> rows = {sampleRow(), sampleRow()};
  rows[1].size = 2;
  rows[1].oop.roundsUs = {1234.5, 1300};
  rows[1].baseline.roundsUs = {2469, 2600};
  ASSERT_TRUE(writeJsonFile(path, provenance, rows, &error)) << error;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "{\"provenance\": " + provenanceToJson(provenance) + ",\n \"rows\": [\n  " +
                            rowToJson(rows[0]) + ",\n  " + rowToJson(rows[1]) + "\n ]}\n");
  EXPECT_TRUE(JsonChecker(text.str()).valid());
  EXPECT_FALSE(JsonChecker("[{\"a\": 1,}]").valid());  // the checker does reject bad JSON
  EXPECT_NE(access((path + ".tmp").c_str(), F_OK), 0);
  EXPECT_FALSE(writeJsonFile(std::string(dir) + "/no/such/dir/x.json", provenance, rows, &error));
  std::remove(path.c_str());
  rmdir(dir);

  // The reader takes the rows back, each with the file's commit and its rounds.
  std::vector<PerfRow> read;
  ASSERT_TRUE(parsePerfJson(text.str(), &read, &error)) << error;
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].op, "qwz_all_gather");
  EXPECT_EQ(read[0].commit, provenance.commit);
  EXPECT_EQ(read[1].commit, provenance.commit);
  EXPECT_DOUBLE_EQ(read[1].size, 2);
  EXPECT_DOUBLE_EQ(read[1].timeUs, 1234.5);
  EXPECT_DOUBLE_EQ(read[1].ncclTimeUs, 2469);
  EXPECT_EQ(read[1].roundsUs, (std::vector<double>{1234.5, 1300}));
  EXPECT_EQ(read[1].ncclRoundsUs, (std::vector<double>{2469, 2600}));
  EXPECT_TRUE(read[0].roundsUs.empty());
  EXPECT_LT(read[0].ncclMatchedTimeUs, 0);
}

TEST(PerfJson, ReaderKeepsReadingFilesWithoutProvenance) {
  // The files written before provenance are bare arrays of rows: read as before, with no commit.
  std::vector<PerfRow> rows;
  std::string error;
  ASSERT_TRUE(parsePerfJson("[\n  " + rowToJson(sampleRow()) + "\n]\n", &rows, &error)) << error;
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].commit, "");
  EXPECT_DOUBLE_EQ(rows[0].timeUs, 1234.5);
  // A provenance's own arrays (gpu models) are not rows, and a matched baseline is read.
  ResultRow matched = sampleRow();
  matched.ncclConfig = {16, 32, 0};
  matched.matched = {true, 1851.75, 0.5, 0.28, false, 0, 7.5, {}};
  rows.clear();
  ASSERT_TRUE(parsePerfJson(perfFileJson(sampleProvenance(), {matched}), &rows, &error)) << error;
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].ncclMatchedTimeUs, 1851.75);
}

// ---- file rendezvous ---------------------------------------------------------------------------------------

std::string freshDir() {
  char dir[] = "/tmp/zp_perf_rdv_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

TEST(PerfProcGroup, FileRendezvousExchangesAmongThreeProcesses) {
  const std::string dir = freshDir();
  const int n = 3;
  std::vector<std::vector<int>> seen(n);
  std::vector<int> roots(n, -1);
  std::vector<std::string> errors(n);
  std::vector<std::thread> procs;
  for (int p = 0; p < n; ++p)
    procs.emplace_back([&, p] {
      auto g = makeFileProcGroup(dir, n, p, 30.0, &errors[p]);
      if (!g) return;
      EXPECT_EQ(g->rank(), p);
      EXPECT_EQ(g->size(), n);
      for (int round = 0; round < 5; ++round) {
        int mine = p * 100 + round;
        std::vector<int> all(n);
        if (!g->allGather(&mine, sizeof(mine), all.data(), &errors[p])) return;
        for (int q = 0; q < n; ++q) EXPECT_EQ(all[q], q * 100 + round);
        seen[p] = all;
      }
      int value = p == 1 ? 42 : -1;
      if (!g->broadcast(&value, sizeof(value), 1, &errors[p])) return;
      roots[p] = value;
      EXPECT_TRUE(g->barrier(&errors[p]));
    });
  for (auto& t : procs) t.join();
  for (int p = 0; p < n; ++p) {
    EXPECT_TRUE(errors[p].empty()) << errors[p];
    EXPECT_EQ(roots[p], 42);
  }
  // Only the last exchange's files stay behind.
  std::string cmd = "ls " + dir + " | wc -l";
  FILE* ls = popen(cmd.c_str(), "r");
  int files = -1;
  ASSERT_EQ(fscanf(ls, "%d", &files), 1);
  pclose(ls);
  EXPECT_EQ(files, n);
  std::system(("rm -rf " + dir).c_str());
}

TEST(PerfProcGroup, FileRendezvousRefusesAStaleDirectoryAndTimesOut) {
  const std::string dir = freshDir();
  std::string error;
  FILE* f = std::fopen((dir + "/hello.0").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(makeFileProcGroup(dir, 2, 0, 1.0, &error), nullptr);
  EXPECT_NE(error.find("earlier run"), std::string::npos) << error;
  // With no process 0 at all, the wait times out.
  const std::string empty = freshDir();
  error.clear();
  EXPECT_EQ(makeFileProcGroup(empty, 2, 1, 0.2, &error), nullptr);
  EXPECT_NE(error.find("timed out"), std::string::npos) << error;
  EXPECT_EQ(makeFileProcGroup(dir + "/missing", 2, 0, 0.2, &error), nullptr);
  std::system(("rm -rf " + dir + " " + empty).c_str());
}

TEST(PerfProcGroup, SingleProcess) {
  auto g = makeSingleProcGroup();
  std::string error;
  int v = 7, out = 0;
  EXPECT_TRUE(g->allGather(&v, sizeof(v), &out, &error));
  EXPECT_EQ(out, 7);
  EXPECT_TRUE(g->barrier(&error));
  EXPECT_EQ(g->size(), 1);
}

ProcInfo procOn(const char* hostname, const char* nodeKey, int devices, int threads = 0) {
  ProcInfo p;
  std::memset(&p, 0, sizeof(p));
  std::snprintf(p.hostname, sizeof(p.hostname), "%s", hostname);
  std::snprintf(p.nodeKey, sizeof(p.nodeKey), "%s", nodeKey);
  p.deviceCount = devices;
  p.threads = threads;
  return p;
}

TEST(PerfRankLayout, HostBackendEmulatesTwoNodesOfAnEvenCount) {
  RankLayout l;
  std::string error;
  ASSERT_TRUE(layOutRanks({procOn("a", "a", 0)}, 0, true, false, 0, &l, &error)) << error;
  EXPECT_EQ(l.nranks, 8);
  EXPECT_EQ(l.localRanks, 8);
  EXPECT_EQ(l.nodes, 2);
  EXPECT_EQ(l.nodeOf, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_TRUE(l.devices.empty());
  ASSERT_TRUE(layOutRanks({procOn("a", "a", 0, 3)}, 0, true, false, 0, &l, &error)) << error;
  EXPECT_EQ(l.nodes, 1);  // odd: one node
  ASSERT_TRUE(layOutRanks({procOn("a", "a", 0, 6)}, 0, true, false, 3, &l, &error)) << error;
  EXPECT_EQ(l.nodeOf, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_FALSE(layOutRanks({procOn("a", "a", 0, 6)}, 0, true, false, 4, &l, &error));
  EXPECT_NE(error.find("-N 4 does not divide 6 ranks"), std::string::npos) << error;
}

TEST(PerfRankLayout, ProcessesOfAHostTakeItsGpusInTurnOrShareThem) {
  // Two processes on one host of 4 GPUs, a third alone on another host of 2.
  const std::vector<ProcInfo> procs = {procOn("a", "a", 4), procOn("a", "a", 4), procOn("b", "b", 2)};
  RankLayout l;
  std::string error;
  ASSERT_TRUE(layOutRanks(procs, 1, false, false, 0, &l, &error)) << error;
  EXPECT_EQ(l.nranks, 6);
  EXPECT_EQ(l.rankBase, 2);
  EXPECT_EQ(l.localRanks, 2);
  EXPECT_EQ(l.maxLocalRanks, 2);
  EXPECT_EQ(l.devices, (std::vector<int>{2, 3}));  // after process 0's two
  EXPECT_EQ(l.nodes, 2);                           // one per node key
  EXPECT_EQ(l.nodeOf, (std::vector<int>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(l.nodeName, (std::vector<std::string>{"a", "b"}));
  // Sharing: every process numbers its GPUs from 0 and takes all of them.
  ASSERT_TRUE(layOutRanks(procs, 1, false, true, 0, &l, &error)) << error;
  EXPECT_EQ(l.nranks, 10);
  EXPECT_EQ(l.devices, (std::vector<int>{0, 1, 2, 3}));
  // Distinct node keys on one host (NCCL_HOSTID) make distinct nodes.
  ASSERT_TRUE(layOutRanks({procOn("a", "x", 1, 1), procOn("a", "y", 1, 1)}, 0, false, true, 0, &l, &error)) << error;
  EXPECT_EQ(l.nodeOf, (std::vector<int>{0, 1}));
}

TEST(PerfRankLayout, MoreRanksThanGpusAreRefused) {
  RankLayout l;
  std::string error;
  EXPECT_FALSE(layOutRanks({procOn("a", "a", 2, 3)}, 0, false, false, 0, &l, &error));
  EXPECT_NE(error.find("3 ranks on host a but only 2 GPUs visible there"), std::string::npos) << error;
  EXPECT_FALSE(layOutRanks({procOn("a", "a", 2), procOn("a", "a", 2, 2)}, 0, false, false, 0, &l, &error));
  EXPECT_NE(error.find("3 ranks on host a"), std::string::npos) << error;
}

}  // namespace
}  // namespace perf
}  // namespace zp
