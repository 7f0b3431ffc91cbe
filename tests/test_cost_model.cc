// The cost model (tools/model/cost_model.h): bytes and times of each collective against numbers worked out by hand
// here from the formulas' definitions (links, kernels per kind and quantize per code width, the chunk pipeline's
// overlap, one-chunk calls as the plain sum of their stages), the paper's 3M -> 0.75M cross-node claim (exact in
// the paper's accounting, approximate with block scales), single-node, one-GPU-per-node and uneven layouts
// (fallbacks said in notes), calibration recovering known links, kernels and overlaps from synthetic perf rows
// (qwZ's overlap per configuration: kernels on every SM or in a green context), qgZ's two-rank exchanges as one
// all-gather (ZP_PAIR_ALLGATHER), the links' small-message lines, the measured points averaged over repeats, and the
// calibration on the measured rows of two H200 (perf/results/).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "host/coll_plan.h"
#include "host/topology.h"
#include "tools/model/cost_model.h"

namespace zp {
namespace {

bool anyMentions(const std::vector<std::string>& notes, const std::string& word) {
  for (const std::string& n : notes)
    if (n.find(word) != std::string::npos) return true;
  return false;
}

// Kernels: quantize 1000 GB/s + 5 us a launch (both code widths; CostModelTime.QuantizePerBits sets them apart),
// dequantize 2000 GB/s + 1 us, reduce 100 G element-sources/s + 2 us, copy 4000 GB/s + 10 us.
KernelParams handKernels() {
  KernelParams k;
  k.quantizeInt8 = k.quantizeInt4 = KernelCost{1000, 5};
  k.dequantize = KernelCost{2000, 1};
  k.reduce = KernelCost{100, 2};
  k.copy = KernelCost{4000, 10};
  return k;
}

// 2 nodes x 4 GPUs; intra 100 GB/s and 1 us/step per GPU, inter 10 GB/s and 10 us/step per node; the kernels
// above; pipelines hide half (qwZ, its kernels on every SM: ZP_NCCL_SMS=0) and a quarter (qgZ) of what an ideal
// pipeline would. The green context's qwZ overlap is set apart (0.9), so that a test using the wrong one fails.
ClusterSpec twoByFour() {
  ClusterSpec c = ClusterSpec::even(2, 4);
  c.intra = LinkParams::uniform(100, 1);
  c.inter = LinkParams::uniform(10, 10);
  c.kernel = handKernels();
  c.pipeline.ncclSms = 0;
  c.pipeline.qwzOverlap = 0.5;
  c.pipeline.qwzGreenOverlap = 0.9;
  c.pipeline.qgzOverlap = 0.25;
  return c;
}

// ---- volumes ---------------------------------------------------------------------------------------------------

TEST(CostModelVolume, RingAllGatherHandComputed) {
  const ClusterSpec c = twoByFour();
  // 16384 bytes gathered by 8 ranks: each sends 7/8 of it = 14336; it leaves each node once per ring; 2 of the
  // 8 hops cross nodes: 3584 per GPU across, 10752 inside.
  const Traffic t = ringAllGatherCost(c, 16384);
  EXPECT_DOUBLE_EQ(t.nodeEgressBytes, 14336);
  EXPECT_DOUBLE_EQ(t.interBytes, 3584);
  EXPECT_DOUBLE_EQ(t.intraBytes, 10752);
  EXPECT_DOUBLE_EQ(t.kernelBytes, 0);
  const Traffic rs = ringReduceScatterCost(c, 16384);
  EXPECT_DOUBLE_EQ(rs.nodeEgressBytes, 14336);
  EXPECT_DOUBLE_EQ(rs.interBytes, 3584);
}

TEST(CostModelVolume, QwzPayloadHandComputed) {
  const ClusterSpec c = twoByFour();
  // 1024 elements per rank, int8, blocks of 256: 4 scales = 16 bytes, 1024 code bytes: payload 1040.
  const Traffic t = qwzAllGatherCost(c, 1024, 2, 8, 256);
  EXPECT_DOUBLE_EQ(t.nodeEgressBytes, 7.0 / 8 * 8 * 1040);  // 7280
  EXPECT_DOUBLE_EQ(t.interBytes, 7280.0 * 2 / 8);
  EXPECT_DOUBLE_EQ(t.intraBytes, 7280.0 * 6 / 8);
  // Quantize 2048 -> 1040, dequantize 8 * 1040 -> 8 * 2048.
  EXPECT_DOUBLE_EQ(t.kernelBytes, 2048 + 1040 + 8320 + 16384);
  EXPECT_DOUBLE_EQ(t.launches, 2);
  // int4, 1000 elements: 4 blocks -> 16 bytes of scales, 500 code bytes padded to 512: payload 528.
  const Traffic t4 = qwzAllGatherCost(c, 1000, 2, 4, 256);
  EXPECT_DOUBLE_EQ(t4.nodeEgressBytes, 7.0 / 8 * 8 * 528);
}

TEST(CostModelVolume, HpzStaysInsideTheNode) {
  const ClusterSpec c = twoByFour();
  std::string note;
  // 8192 elements of 2 bytes, groups of 4: 3/4 of 16384 over NVLink, nothing across nodes.
  Traffic t = hpzAllGatherCost(c, 8192, 2, 0, &note);
  EXPECT_DOUBLE_EQ(t.intraBytes, 12288);
  EXPECT_DOUBLE_EQ(t.interBytes, 0);
  EXPECT_DOUBLE_EQ(t.nodeEgressBytes, 0);
  EXPECT_TRUE(note.empty()) << note;
  t = hpzAllGatherCost(c, 8192, 2, 2, &note);  // groups of 2: half of it
  EXPECT_DOUBLE_EQ(t.intraBytes, 8192);
}

TEST(CostModelVolume, QgzTwoHopsHandComputed) {
  const ClusterSpec c = twoByFour();
  std::string note;
  // recvcount 1024, int4, blocks of 256: payload 16 + 512 = 528 per destination slice.
  const Traffic t = qgzReduceScatterCost(c, 1024, 2, 4, 256, &note);
  EXPECT_TRUE(note.empty()) << note;
  EXPECT_DOUBLE_EQ(t.intraBytes, 3.0 * 2 * 528);  // hop 1: N=2 slices to each of 3 local peers
  EXPECT_DOUBLE_EQ(t.interBytes, 528);            // hop 2: one partial to the other node
  EXPECT_DOUBLE_EQ(t.nodeEgressBytes, 4 * 528);   // 4 GPUs of the node do it at once
  // quantize 16384 -> 8*528; reduce-requantize reads 4*2*528, writes 2*528; final reads 2*528, writes 2048; and,
  // hop 2 being a pair across nodes (the default ZP_PAIR_ALLGATHER=2 gathers it), the copy of the kept 528-byte
  // slot, read + written.
  EXPECT_DOUBLE_EQ(t.kernelBytes, 16384 + 8 * 528 + 5 * 2 * 528 + 2 * 528 + 2048 + 2 * 528);
  // One quantize launch per local peer's run of slots (4), the reduce-requantize, the final reduce and the copy.
  EXPECT_DOUBLE_EQ(t.launches, 7);
  // With send/recv (ZP_PAIR_ALLGATHER=0) the same bytes cross the links, without the copy.
  ClusterSpec sendRecv = c;
  sendRecv.pipeline.pairAllGather = 0;
  const Traffic s = qgzReduceScatterCost(sendRecv, 1024, 2, 4, 256, &note);
  EXPECT_DOUBLE_EQ(s.kernelBytes, t.kernelBytes - 2 * 528);
  EXPECT_DOUBLE_EQ(s.launches, 6);
  EXPECT_DOUBLE_EQ(s.nodeEgressBytes, t.nodeEgressBytes);
  EXPECT_DOUBLE_EQ(s.intraBytes, t.intraBytes);
}

TEST(CostModelVolume, PaperClaimThreeMToPointSevenFiveM) {
  ZeroppOptions z;  // qwZ int8, hpZ, qgZ int4
  const PaperVolume base = paperCrossNodeVolume(z, false);
  const PaperVolume zpp = paperCrossNodeVolume(z, true);
  EXPECT_DOUBLE_EQ(base.total(), 3.0);
  EXPECT_DOUBLE_EQ(zpp.forward, 0.5);
  EXPECT_DOUBLE_EQ(zpp.backward, 0.0);
  EXPECT_DOUBLE_EQ(zpp.gradient, 0.25);
  EXPECT_DOUBLE_EQ(zpp.total(), 0.75);
  // One technique at a time.
  ZeroppOptions only = z;
  only.hpz = only.qgz = false;
  EXPECT_DOUBLE_EQ(paperCrossNodeVolume(only, true).total(), 2.5);
  only = z;
  only.qwz = only.qgz = false;
  EXPECT_DOUBLE_EQ(paperCrossNodeVolume(only, true).total(), 2.0);
  only = z;
  only.qwz = only.hpz = false;
  EXPECT_DOUBLE_EQ(paperCrossNodeVolume(only, true).total(), 2.25);
  only.weightBits = 4;
  only.qwz = true;
  EXPECT_DOUBLE_EQ(paperCrossNodeVolume(only, true).forward, 0.25);

  // Exact accounting at 128 nodes x 8: 16384 elements per rank (no padding): ring volumes carry (n-1)/n, int8
  // payloads 1 + 4/256 bytes per element (0.5078125 of bf16), int4 0.5 + 4/256 (0.2578125), qgZ's inter hop
  // (N-1)/N.
  ClusterSpec c = ClusterSpec::even(128, 8);
  StepConfig s;
  s.params = 1024.0 * 16384;
  std::string error;
  const Comparison r = compareStep(c, s, z, &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_NEAR(r.zero3.crossNodeM, 3.0 * 1023 / 1024, 1e-12);
  EXPECT_NEAR(r.zeropp.crossNodeM, 0.5078125 * 1023 / 1024 + 0.2578125 * 127 / 128, 1e-12);
  EXPECT_NEAR(r.zeropp.crossNodeM, 0.75, 0.02);  // approximately the paper's number
  EXPECT_DOUBLE_EQ(r.zeropp.backward.traffic.nodeEgressBytes, 0);
  EXPECT_DOUBLE_EQ(r.paperZero3.total(), 3.0);
  EXPECT_DOUBLE_EQ(r.paperZeropp.total(), 0.75);
  // The scale overhead shrinks with the block: at 8192 the exact volume is within 1% of the claim's.
  z.blockSize = 8192;
  const Comparison big = compareStep(c, s, z, &error);
  EXPECT_NEAR(big.zeropp.crossNodeM / (0.5 * 1023 / 1024 + 0.25 * 127 / 128), 1.0, 0.01);
}

// ---- times -----------------------------------------------------------------------------------------------------

TEST(CostModelTime, RingHandComputed) {
  const ClusterSpec c = twoByFour();
  // 1e9 bytes: 0.875e9 leave each node at 10 GB/s = 87500 us; 0.65625e9 per GPU on NVLink at 100 GB/s = 6562.5
  // us, hidden under it; 7 steps of 10 us.
  const Traffic t = ringAllGatherCost(c, 1e9);
  EXPECT_DOUBLE_EQ(t.linkUs, 87500);
  EXPECT_DOUBLE_EQ(t.latencyUs, 70);
  EXPECT_DOUBLE_EQ(t.timeUs(), 87570);
  // One node of 8: 0.875e9 on NVLink, 7 steps of 1 us.
  ClusterSpec one = twoByFour();
  one.gpusPerNode = {8};
  EXPECT_DOUBLE_EQ(ringAllGatherCost(one, 1e9).timeUs(), 8750 + 7);
}

TEST(CostModelTime, QwzHandComputed) {
  const ClusterSpec c = twoByFour();
  // 2^20 elements per rank, int8, 16 MiB logical: one chunk (nothing to overlap). Payload 16384 + 1048576 =
  // 1064960; gathered 8 * that = 8519680, 7/8 of it leaves each node (7454720 B at 10 GB/s = 745.472 us); 7 steps
  // of 10 us. Quantize reads + writes 2097152 + 1064960 = 3162112 B at 1000 GB/s = 3.162112 us + 5; dequantize
  // 8519680 + 16777216 = 25296896 B at 2000 GB/s = 12.648448 us + 1.
  const Traffic t = qwzAllGatherCost(c, 1 << 20, 2, 8, 256);
  EXPECT_NEAR(t.linkUs, 745.472, 1e-9);
  EXPECT_NEAR(t.latencyUs, 70, 1e-12);
  EXPECT_NEAR(t.kernelUs, 3.162112 + 5 + 12.648448 + 1, 1e-9);
  EXPECT_DOUBLE_EQ(t.hiddenUs, 0);
  EXPECT_NEAR(t.timeUs(), 837.28256, 1e-9);
}

TEST(CostModelTime, QwzPipelineHandComputed) {
  // One node of 2 GPUs, links 100 GB/s with no per-step cost. 2^26 elements per rank, int8: 256 MiB logical, so
  // 4 chunks of 2^24 elements (65536 blocks each), payload 262144 + 16777216 = 17039360 per chunk.
  //   Q per chunk: quantize 33554432 + 17039360 = 50593792 B at 1000 GB/s = 50.593792 us + 5 -> x4 = 222.375168
  //   M per chunk: ring all-gather of 2 payloads, each rank sends 17039360 B at 100 GB/s = 170.3936 -> x4 = 681.5744
  //   F per chunk: dequantize 34078720 + 67108864 = 101187584 B at 2000 GB/s = 50.593792 + 1 -> x4 = 206.375168
  // sum 1110.324736; ideal = sum/4 + 3/4 * 681.5744 = 788.761984; overlap 0.5 hides half of 321.562752.
  ClusterSpec c = twoByFour();
  c.gpusPerNode = {2};
  c.intra = LinkParams::uniform(100, 0);
  const Traffic t = qwzAllGatherCost(c, 1 << 26, 2, 8, 256);
  EXPECT_NEAR(t.linkUs, 681.5744, 1e-9);
  EXPECT_NEAR(t.kernelUs, 222.375168 + 206.375168, 1e-9);
  EXPECT_DOUBLE_EQ(t.launches, 8);
  EXPECT_NEAR(t.hiddenUs, 160.781376, 1e-9);
  EXPECT_NEAR(t.timeUs(), 949.54336, 1e-9);
  // Overlap 0: the stages add up; 1: the ideal pipeline.
  c.pipeline.qwzOverlap = 0;
  EXPECT_NEAR(qwzAllGatherCost(c, 1 << 26, 2, 8, 256).timeUs(), 1110.324736, 1e-9);
  c.pipeline.qwzOverlap = 1;
  EXPECT_NEAR(qwzAllGatherCost(c, 1 << 26, 2, 8, 256).timeUs(), 788.761984, 1e-9);
  // In a green context (ZP_NCCL_SMS non-zero, the library's default), the green overlap: 0.8 hides 0.8 of
  // 321.562752; qwzOverlap does not count there, and the kernels and links cost the same.
  c.pipeline.ncclSms = 32;
  c.pipeline.qwzGreenOverlap = 0.8;
  const Traffic green = qwzAllGatherCost(c, 1 << 26, 2, 8, 256);
  EXPECT_NEAR(green.hiddenUs, 0.8 * 321.562752, 1e-9);
  EXPECT_NEAR(green.kernelUs, t.kernelUs, 1e-9);
  EXPECT_NEAR(green.linkUs, t.linkUs, 1e-9);
  EXPECT_TRUE(c.pipeline.greenContext());
  EXPECT_DOUBLE_EQ(c.pipeline.gatherOverlap(), 0.8);
  c.pipeline.ncclSms = 0;
  EXPECT_DOUBLE_EQ(c.pipeline.gatherOverlap(), 1);
  // A default PipelineParams is the library's default configuration: the green context.
  EXPECT_EQ(PipelineParams().ncclSms, 32);
  EXPECT_DOUBLE_EQ(PipelineParams().gatherOverlap(), PipelineParams().qwzGreenOverlap);
  // ZP_MAX_CHUNKS=1: one chunk, nothing hidden.
  c.pipeline.maxChunks = 1;
  EXPECT_NEAR(qwzAllGatherCost(c, 1 << 26, 2, 8, 256).timeUs(), 1110.324736 - 3 * (5 + 1), 1e-9);
}

TEST(CostModelTime, QgzHandComputed) {
  const ClusterSpec c = twoByFour();
  // recvcount 2^20, int4, 16 MiB logical: one chunk. Payload 16384 + 524288 = 540672.
  // hop 1: 3 peers x 2 slices = 3244032 B at 100 GB/s = 32.44032 us, 3 steps of 1 us.
  // hop 2: 4 GPUs x 1 partial leave the node: 2162688 B at 10 GB/s = 216.2688 us, 1 step of 10 us.
  // quantize: 16777216 + 8*540672 = 21102592 B at 1000 GB/s = 21.102592 us + 4 launches of 5 us.
  // reduce + requantize: 2 partials of 4 sources of 2^20 = 8388608 element-sources at 100 G/s = 83.88608 us + 2;
  // final reduce: 2 sources of 2^20 = 2097152 element-sources = 20.97152 us + 2.
  // hop 2 is a pair across nodes, gathered by default (ZP_PAIR_ALLGATHER=2; uniform links: the all-gather line is
  // the all-to-all's), then the kept 540672-byte slot copied: 1081344 B at 4000 GB/s = 0.270336 us + 10.
  std::string note;
  const Traffic t = qgzReduceScatterCost(c, 1 << 20, 2, 4, 256, &note);
  EXPECT_NEAR(t.linkUs, 32.44032 + 216.2688, 1e-9);
  EXPECT_NEAR(t.latencyUs, 3 + 10, 1e-12);
  EXPECT_NEAR(t.kernelUs, 21.102592 + 20 + 83.88608 + 2 + 20.97152 + 2 + 0.270336 + 10, 1e-9);
  EXPECT_DOUBLE_EQ(t.hiddenUs, 0);
  // int8 costs the reduce kernels the same (element-sources, not bytes); only the payload bytes change: quantize
  // writes 8 x 524288 more, and the copy moves 2 x 524288 more (a 1064960-byte slot).
  const Traffic t8 = qgzReduceScatterCost(c, 1 << 20, 2, 8, 256, &note);
  EXPECT_NEAR(t8.kernelUs - t.kernelUs, 8.0 * 524288 / 1000 / 1e3 + 2.0 * 524288 / 4000 / 1e3, 1e-9);

  // One node of 2 GPUs (one hop), recvcount 2^26, int4: 256 MiB logical, 4 chunks of 2^24 elements; payload
  // 262144 + 8388608 = 8650752 per slice and chunk. Links 100 GB/s, no per-step cost.
  //   Q per chunk: quantize 67108864 + 2*8650752 = 84410368 B = 84.410368 us + 5 -> x4 = 357.641472
  //   M per chunk: all-to-all, 8650752 B to the peer = 86.50752 us -> x4 = 346.03008
  //   F per chunk: reduce of 2 sources of 2^24 = 33554432 element-sources = 335.54432 us + 2 -> x4 = 1350.17728
  // sum 2053.848832; ideal = sum/4 + 3/4 * 1350.17728 = 513.462208 + 1012.63296 = 1526.095168; overlap 0.25
  // hides a quarter of sum - ideal = 527.753664.
  ClusterSpec one = twoByFour();
  one.gpusPerNode = {2};
  one.intra = LinkParams::uniform(100, 0);
  const Traffic p = qgzReduceScatterCost(one, 1 << 26, 2, 4, 256, &note);
  EXPECT_NEAR(p.linkUs, 346.03008, 1e-9);
  EXPECT_NEAR(p.kernelUs, 357.641472 + 1350.17728, 1e-9);
  EXPECT_NEAR(p.hiddenUs, 131.938416, 1e-9);
  EXPECT_NEAR(p.timeUs(), 1921.910416, 1e-9);
}

// Links whose all-gather and all-to-all lines differ, so that a pair priced on the wrong one fails: intra all-gather
// 200 GB/s + 2 us a step, all-to-all 100 GB/s + 1 us; inter all-gather 10 GB/s + 20 us, all-to-all 5 GB/s + 10 us.
// The hand kernels (copy 4000 GB/s + 10 us); ZP_PAIR_ALLGATHER = mode.
ClusterSpec pairLinks(const std::vector<int>& gpusPerNode, int mode) {
  ClusterSpec c = twoByFour();
  c.gpusPerNode = gpusPerNode;
  c.intra = LinkParams::uniform(200, 2);
  c.intra.allToAll = LinkCost{100, 1};
  c.inter = LinkParams::uniform(10, 20);
  c.inter.allToAll = LinkCost{5, 10};
  c.pipeline.pairAllGather = mode;
  return c;
}

// The plan of a qgZ call (recvcount 2^22, bf16, int4) on `gpus` by the library's planner itself, with the cuda
// backend's facts over NCCL's links (no shared-memory channels, direct loads or early own slot): what the model
// must price.
CollPlan libraryQgzPlan(const std::vector<int>& gpus, int mode) {
  std::vector<uint64_t> keys;
  for (size_t node = 0; node < gpus.size(); ++node)
    for (int g = 0; g < gpus[node]; ++g) keys.push_back(50 + node);
  Topology t;
  EXPECT_EQ(buildTopology(keys, 0, 0, "test", &t), zpSuccess);
  PlanFacts f;
  f.topo = &t;
  f.tunables.maxChunks = 8;
  f.tunables.pairAllGather = mode;
  f.tunables.directMinBytes = -1;
  f.tunables.ownSlotEarlyBytes = -1;
  f.link.greenContext = true;
  f.kind = CollKind::kQuantReduceScatter;
  f.count = 1 << 22;
  f.elemBytes = 2;
  f.bits = 4;
  f.blockSize = 256;
  return planCollective(f);
}

TEST(CostModelTime, QgzPairExchangeHandComputed) {
  // The model prices the library's plan (planOf): two ranks gather with mode 1, or with mode 2 across nodes; never
  // with 0, and never more than two ranks.
  EXPECT_EQ(PipelineParams().pairAllGather, 2);  // the library's default
  for (int mode : {0, 1, 2}) {
    for (const std::vector<int>& gpus : std::vector<std::vector<int>>{{2}, {1, 1}, {4}, {2, 2}, {4, 4}, {2, 2, 2}}) {
      const CollPlan model = planOf(pairLinks(gpus, mode), CollKind::kQuantReduceScatter, 1 << 22, 2, 4, 256);
      const CollPlan library = libraryQgzPlan(gpus, mode);
      ASSERT_EQ(model.hops, library.hops);
      for (int h = 0; h < model.hops; ++h) EXPECT_EQ(model.hop[h].exchange, library.hop[h].exchange) << mode;
      EXPECT_EQ(model.path, library.path);
      EXPECT_EQ(model.chunks.chunks, library.chunks.chunks);
    }
    const Exchange gathered = Exchange::kPairGather, sent = Exchange::kSendRecv;
    EXPECT_EQ(libraryQgzPlan({1, 1}, mode).hop[0].exchange, mode != 0 ? gathered : sent) << mode;
    EXPECT_EQ(libraryQgzPlan({2}, mode).hop[0].exchange, mode == 1 ? gathered : sent) << mode;
    EXPECT_EQ(libraryQgzPlan({2, 2}, mode).hop[0].exchange, mode == 1 ? gathered : sent) << mode;
    EXPECT_EQ(libraryQgzPlan({2, 2}, mode).hop[1].exchange, mode != 0 ? gathered : sent) << mode;
    EXPECT_EQ(libraryQgzPlan({4}, mode).hop[0].exchange, sent) << mode;
    EXPECT_EQ(libraryQgzPlan({2, 2, 2}, mode).hop[1].exchange, sent) << mode;
  }
  std::string note;

  // One node of 2 GPUs, one hop, recvcount 2^22, int4 (16 MiB logical: one chunk, all stages add up). Payload
  // 65536 + 2097152 = 2162688 to the peer. Kernels: quantize 16777216 + 2 * 2162688 = 21102592 B at 1000 GB/s =
  // 21.102592 us + 5; reduce 2 x 2^22 element-sources at 100 G/s = 83.88608 us + 2.
  //   send/recv (modes 0 and 2: the ranks share a node): all-to-all line, 2162688 B at 100 GB/s = 21.62688 + 1.
  //   mode 1: all-gather line, 2162688 B at 200 GB/s = 10.81344 + 2; then the copy of the kept slot, 4325376 B at
  //   4000 GB/s = 1.081344 us + 10.
  const double kernels = 21.102592 + 5 + 83.88608 + 2, copy = 1.081344 + 10;
  for (int mode : {0, 1, 2}) {
    const Traffic t = qgzReduceScatterCost(pairLinks({2}, mode), 1 << 22, 2, 4, 256, &note);
    const bool gather = mode == 1;
    EXPECT_NEAR(t.linkUs, gather ? 10.81344 : 21.62688, 1e-9) << mode;
    EXPECT_NEAR(t.latencyUs, gather ? 2 : 1, 1e-12) << mode;
    EXPECT_NEAR(t.kernelUs, kernels + (gather ? copy : 0), 1e-9) << mode;
    EXPECT_DOUBLE_EQ(t.launches, gather ? 3 : 2) << mode;
    EXPECT_DOUBLE_EQ(t.intraBytes, 2162688) << mode;  // the same bytes on the wire either way
    EXPECT_DOUBLE_EQ(t.hiddenUs, 0);
  }

  // Two nodes of one GPU, one hop across them, the same call: the payload leaves the node.
  //   mode 0: all-to-all line, 2162688 B at 5 GB/s = 432.5376 us + 10.
  //   modes 1 and 2: NCCL's ring all-gather of the two slots: each rank sends its 2162688 B at 10 GB/s = 216.2688
  //   us, one step of 20 us; plus the copy.
  for (int mode : {0, 1, 2}) {
    const Traffic t = qgzReduceScatterCost(pairLinks({1, 1}, mode), 1 << 22, 2, 4, 256, &note);
    const bool gather = mode != 0;
    EXPECT_NEAR(t.linkUs, gather ? 216.2688 : 432.5376, 1e-9) << mode;
    EXPECT_NEAR(t.latencyUs, gather ? 20 : 10, 1e-12) << mode;
    EXPECT_NEAR(t.kernelUs, kernels + (gather ? copy : 0), 1e-9) << mode;
    EXPECT_DOUBLE_EQ(t.nodeEgressBytes, 2162688) << mode;
    EXPECT_DOUBLE_EQ(t.interBytes, 2162688) << mode;
    EXPECT_DOUBLE_EQ(t.intraBytes, 0) << mode;
  }

  // Two hops over 2 nodes x 4 GPUs, recvcount 2^20, int4 (one chunk): payload 16384 + 524288 = 540672. Hop 1 (4
  // local peers) is never a pair: 3 peers x 2 slots = 3244032 B at 100 GB/s = 32.44032 us + 3 x 1. Hop 2 (2 nodes)
  // is a pair across nodes: mode 0 all-to-all, 4 x 540672 = 2162688 B leave the node at 5 GB/s = 432.5376 + 10;
  // modes 1 and 2 at 10 GB/s = 216.2688 + 20, plus the copy of 540672 B: 1081344 B at 4000 GB/s = 0.270336 + 10.
  const Traffic base = qgzReduceScatterCost(pairLinks({4, 4}, 0), 1 << 20, 2, 4, 256, &note);
  EXPECT_NEAR(base.linkUs, 32.44032 + 432.5376, 1e-9);
  EXPECT_NEAR(base.latencyUs, 3 + 10, 1e-12);
  for (int mode : {1, 2}) {
    const Traffic t = qgzReduceScatterCost(pairLinks({4, 4}, mode), 1 << 20, 2, 4, 256, &note);
    EXPECT_NEAR(t.linkUs, 32.44032 + 216.2688, 1e-9) << mode;
    EXPECT_NEAR(t.latencyUs, 3 + 20, 1e-12) << mode;
    EXPECT_NEAR(t.kernelUs - base.kernelUs, 0.270336 + 10, 1e-9) << mode;
    EXPECT_DOUBLE_EQ(t.nodeEgressBytes, base.nodeEgressBytes);
  }

  // Two hops over 2 nodes x 2 GPUs, recvcount 2^20 (8 MiB logical, one chunk): both hops are pairs. Hop 1 (inside
  // the node) sends N x 540672 = 1081344 B to the local peer; hop 2 sends 2 GPUs x 540672 = 1081344 B out of the
  // node.
  //   mode 0: hop 1 at 100 GB/s = 10.81344 + 1, hop 2 at 5 GB/s = 216.2688 + 10; no copy.
  //   mode 1: hop 1 at 200 GB/s = 5.40672 + 2 with a copy of 1081344 B (0.540672 + 10), hop 2 at 10 GB/s =
  //           108.1344 + 20 with a copy of 540672 B (0.270336 + 10).
  //   mode 2: hop 1 as mode 0 (the ranks share a node), hop 2 as mode 1.
  const Traffic m0 = qgzReduceScatterCost(pairLinks({2, 2}, 0), 1 << 20, 2, 4, 256, &note);
  const Traffic m1 = qgzReduceScatterCost(pairLinks({2, 2}, 1), 1 << 20, 2, 4, 256, &note);
  const Traffic m2 = qgzReduceScatterCost(pairLinks({2, 2}, 2), 1 << 20, 2, 4, 256, &note);
  EXPECT_NEAR(m0.linkUs, 10.81344 + 216.2688, 1e-9);
  EXPECT_NEAR(m0.latencyUs, 1 + 10, 1e-12);
  EXPECT_NEAR(m1.linkUs, 5.40672 + 108.1344, 1e-9);
  EXPECT_NEAR(m1.latencyUs, 2 + 20, 1e-12);
  EXPECT_NEAR(m1.kernelUs - m0.kernelUs, 0.540672 + 10 + 0.270336 + 10, 1e-9);
  EXPECT_DOUBLE_EQ(m1.launches - m0.launches, 2);
  EXPECT_NEAR(m2.linkUs, 10.81344 + 108.1344, 1e-9);
  EXPECT_NEAR(m2.latencyUs, 1 + 20, 1e-12);
  EXPECT_NEAR(m2.kernelUs - m0.kernelUs, 0.270336 + 10, 1e-9);

  // More than two ranks in one hop: never a pair, whatever the mode (one node of 4: the all-to-all's 3 steps).
  const Traffic four = qgzReduceScatterCost(pairLinks({4}, 1), 1 << 20, 2, 4, 256, &note);
  EXPECT_NEAR(four.latencyUs, 3 * 1, 1e-12);

  // The step model follows the mode (ZeRO++'s gradient reduce-scatter on 2 nodes x 4: hop 2 gathers by default),
  // and validate() knows the modes.
  StepConfig st;
  st.params = 8.0 * (1 << 20);
  std::string error;
  const Comparison gathered = compareStep(pairLinks({4, 4}, 2), st, ZeroppOptions(), &error);
  ASSERT_TRUE(error.empty()) << error;
  const Comparison sent = compareStep(pairLinks({4, 4}, 0), st, ZeroppOptions(), &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_LT(gathered.zeropp.gradient.traffic.timeUs(), sent.zeropp.gradient.traffic.timeUs());
  EXPECT_DOUBLE_EQ(gathered.zeropp.forward.traffic.timeUs(), sent.zeropp.forward.traffic.timeUs());
  EXPECT_NE(validate(pairLinks({4, 4}, 3), st, ZeroppOptions()).find("pair all-gather"), std::string::npos);
}

TEST(CostModelTime, QuantizePerBits) {
  // The quantize kernel at its own cost per code width: int8 1000 GB/s + 5 us, int4 500 GB/s + 3 us.
  KernelParams k = handKernels();
  k.quantizeInt4 = KernelCost{500, 3};
  EXPECT_EQ(&k.quantizeCost(8), &k.quantizeInt8);
  EXPECT_EQ(&k.quantizeCost(4), &k.quantizeInt4);

  // A "local" quantize row of 16 MiB bf16 (2^23 elements, blocks of 256: 32768 scales = 131072 bytes).
  //   int8: codes 8388608, read + written 16777216 + 8519680 = 25296896 B at 1000 GB/s = 25.296896 us + 5.
  //   int4: codes 4194304, read + written 16777216 + 4325376 = 21102592 B at 500 GB/s = 42.205184 us + 3.
  PerfRow row;
  row.op = "quantize";
  row.regime = "local";
  row.type = "bfloat16";
  row.size = 1 << 24;
  row.ranks = 1;
  row.block = 256;
  const LinkParams link = LinkParams::uniform(100, 0);
  row.bits = 8;
  EXPECT_NEAR(predictRowUs(row, false, link, k), 30.296896, 1e-9);
  row.bits = 4;
  EXPECT_NEAR(predictRowUs(row, false, link, k), 45.205184, 1e-9);
  // Dequantize has one cost for both widths: int4's 21102592 B at 2000 GB/s = 10.551296 us + 1.
  row.op = "dequantize";
  EXPECT_NEAR(predictRowUs(row, false, link, k), 11.551296, 1e-9);

  // qwZ int4 on 2 nodes x 4 (CostModelTime.QwzHandComputed's int8 call): 2^20 elements, payload 16384 + 524288 =
  // 540672. Quantize 2097152 + 540672 = 2637824 B at 500 GB/s = 5.275648 us + 3; dequantize 8 * 540672 + 16777216
  // = 21102592 B at 2000 GB/s = 10.551296 us + 1. int8 keeps its own rate.
  ClusterSpec c = twoByFour();
  c.kernel = k;
  EXPECT_NEAR(qwzAllGatherCost(c, 1 << 20, 2, 4, 256).kernelUs, 5.275648 + 3 + 10.551296 + 1, 1e-9);
  EXPECT_NEAR(qwzAllGatherCost(c, 1 << 20, 2, 8, 256).kernelUs, 3.162112 + 5 + 12.648448 + 1, 1e-9);

  // qgZ int4 over one node of 2 GPUs, 16 MiB logical (recvcount 2^22): one chunk, so it all runs on the caller's
  // stream (src/cuda/pipeline.h beginPipeline): quantize, the all-to-all, the reduce, back to back, whatever
  // the overlap. Payload 65536 + 2097152 = 2162688 a slice; all-to-all 300 GB/s + 30 us a step.
  //   quantize 2 slices: 16777216 + 2 * 2162688 = 21102592 B at 500 GB/s = 42.205184 us + 3
  //   all-to-all: 2162688 B to the peer at 300 GB/s = 7.20896 us + 30
  //   reduce: 2 sources of 2^22 = 8388608 element-sources at 100 G/s = 83.88608 us + 2
  ClusterSpec one = c;
  one.gpusPerNode = {2};
  one.intra = LinkParams::uniform(300, 30);
  one.pipeline.qgzOverlap = 1;
  std::string note;
  const Traffic q = qgzReduceScatterCost(one, 1 << 22, 2, 4, 256, &note);
  EXPECT_DOUBLE_EQ(q.launches, 2);
  EXPECT_DOUBLE_EQ(q.hiddenUs, 0);
  EXPECT_NEAR(q.kernelUs, 45.205184 + 85.88608, 1e-9);
  EXPECT_NEAR(q.timeUs(), 45.205184 + 37.20896 + 85.88608, 1e-9);
  PerfRow qgz = row;
  qgz.op = "qgz_reduce_scatter";
  qgz.regime = "nvlink";
  qgz.ranks = 2;
  qgz.nodes = 1;
  EXPECT_NEAR(predictRowUs(qgz, false, one.intra, k, one.pipeline), q.timeUs(), 1e-9);
}

TEST(CostModelTime, StepAndOverlap) {
  EXPECT_DOUBLE_EQ(stepTimeUs(100, 50, 0), 150);  // compute + comm
  EXPECT_DOUBLE_EQ(stepTimeUs(100, 50, 1), 100);  // max(compute, comm)
  EXPECT_DOUBLE_EQ(stepTimeUs(100, 250, 1), 250);
  EXPECT_DOUBLE_EQ(stepTimeUs(100, 50, 0.5), 125);

  // A whole step: ZeRO-3 is three ring collectives of the model; buckets multiply calls (and latencies).
  const ClusterSpec c = twoByFour();
  StepConfig s;
  s.params = 8.0 * (1 << 20);
  s.computeMs = 1;
  ZeroppOptions z;
  std::string error;
  const Comparison r = compareStep(c, s, z, &error);
  ASSERT_TRUE(error.empty()) << error;
  const double ring = ringAllGatherCost(c, s.params * 2).timeUs();
  const double rs = ringReduceScatterCost(c, s.params * 2).timeUs();
  EXPECT_NEAR(r.zero3.comm.timeUs(), 2 * ring + rs, 1e-9);
  EXPECT_NEAR(r.zero3.stepUs, 1000 + 2 * ring + rs, 1e-9);
  EXPECT_NEAR(r.zeropp.forward.traffic.timeUs(), qwzAllGatherCost(c, 1 << 20, 2, 8, 256).timeUs(), 1e-9);
  EXPECT_GT(r.speedup, 1.0);
  s.bucketParams = s.params / 4;
  const Comparison b = compareStep(c, s, z, &error);
  EXPECT_EQ(b.zero3.forward.calls, 4);
  EXPECT_NEAR(b.zero3.forward.traffic.latencyUs, 4 * 70, 1e-9);
  EXPECT_NEAR(b.zero3.forward.traffic.nodeEgressBytes, r.zero3.forward.traffic.nodeEgressBytes, 1e-6);
}

// ---- layouts ---------------------------------------------------------------------------------------------------

TEST(CostModelLayout, SingleNodeHasNoInterNodeBytes) {
  ClusterSpec c = twoByFour();
  c.gpusPerNode = {8};
  StepConfig s;
  s.params = 1e9;
  std::string error;
  const Comparison r = compareStep(c, s, ZeroppOptions(), &error);
  ASSERT_TRUE(error.empty()) << error;
  for (const StepCost* sc : {&r.zero3, &r.zeropp}) {
    EXPECT_EQ(sc->comm.interBytes, 0);
    EXPECT_EQ(sc->comm.nodeEgressBytes, 0);
    EXPECT_EQ(sc->crossNodeM, 0);
  }
  EXPECT_TRUE(anyMentions(r.notes, "one node")) << "qgZ runs one hop on one node";
  EXPECT_NE(r.zeropp.gradient.scheme.find("one hop"), std::string::npos);
  // One hop on one node: 7 payloads per GPU over NVLink.
  std::string note;
  const Traffic q = qgzReduceScatterCost(c, 1024, 2, 4, 256, &note);
  EXPECT_DOUBLE_EQ(q.intraBytes, 7 * 528);
  EXPECT_DOUBLE_EQ(q.interBytes, 0);
}

TEST(CostModelLayout, UnevenNodesFallBackToFlat) {
  ClusterSpec c = twoByFour();
  c.gpusPerNode = {8, 8, 4};
  StepConfig s;
  s.params = 1e9;
  std::string error;
  const Comparison r = compareStep(c, s, ZeroppOptions(), &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_TRUE(anyMentions(r.notes, "hpZ unavailable")) << "hpZ needs nodes of equal size";
  EXPECT_TRUE(anyMentions(r.notes, "flat all-to-all")) << "qgZ runs one flat hop";
  EXPECT_NE(r.zeropp.gradient.scheme.find("one hop"), std::string::npos);
  // The backward gather is ZeRO-3's flat ring: same bytes and time.
  EXPECT_DOUBLE_EQ(r.zeropp.backward.traffic.nodeEgressBytes, r.zero3.backward.traffic.nodeEgressBytes);
  EXPECT_DOUBLE_EQ(r.zeropp.backward.traffic.timeUs(), r.zero3.backward.traffic.timeUs());
  EXPECT_GT(r.zeropp.backward.traffic.interBytes, 0);
  EXPECT_EQ(r.hpzSecondaryBytes, 0);

  // Flat all-to-all on nodes {2, 1}, 100 bytes per peer: a GPU of node 0 sends 100 inside and 100 out, the
  // GPU of node 1 sends 200 out; each node's egress is 200.
  ClusterSpec u = twoByFour();
  u.gpusPerNode = {2, 1};
  const Traffic a = allToAllCost(u, 100);
  EXPECT_DOUBLE_EQ(a.intraBytes, 200.0 / 3);
  EXPECT_DOUBLE_EQ(a.interBytes, 400.0 / 3);
  EXPECT_DOUBLE_EQ(a.nodeEgressBytes, 200);
  EXPECT_DOUBLE_EQ(a.latencyUs, 2 * 10);
}

TEST(CostModelLayout, OneGpuPerNode) {
  ClusterSpec c = twoByFour();
  c.gpusPerNode = {1, 1, 1, 1};
  StepConfig s;
  s.params = 1e9;
  std::string error;
  const Comparison r = compareStep(c, s, ZeroppOptions(), &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_TRUE(anyMentions(r.notes, "one GPU per node"));
  EXPECT_TRUE(anyMentions(r.notes, "group of 1"));
  // hpZ over groups of one rank crosses no link: NCCL's one-rank all-gather copies the 2e9-byte tensor, 4e9
  // bytes read + written at 4000 GB/s = 1000 us, plus 10 us.
  EXPECT_EQ(r.zeropp.backward.traffic.interBytes + r.zeropp.backward.traffic.intraBytes, 0);
  EXPECT_EQ(r.zeropp.backward.traffic.nodeEgressBytes, 0);
  EXPECT_NEAR(r.zeropp.backward.traffic.timeUs(), 1010, 1e-9);
  // qgZ one hop across nodes: 3 payloads per GPU leave the node.
  std::string note;
  const Traffic q = qgzReduceScatterCost(c, 1024, 2, 4, 256, &note);
  EXPECT_DOUBLE_EQ(q.interBytes, 3 * 528);
  EXPECT_DOUBLE_EQ(q.intraBytes, 0);
}

TEST(CostModelTime, StepModelsTheGreenContextByDefault) {
  // The step tables model the library's default configuration: qwZ's kernels in a green context (ncclSms 32),
  // at the green overlap; ncclSms 0 gives the overlap with every SM. Nothing else changes: ZeRO-3's rings and qgZ
  // (which never uses the green context). One node of 2 GPUs, 2^28 parameters: each quantized gather (forward and,
  // with hpZ off, backward) is 512 MiB logical, 8 chunks, so its overlap counts.
  ClusterSpec c = ClusterSpec::even(1, 2);
  c.intra = LinkParams::uniform(100, 1);
  c.kernel = handKernels();
  c.pipeline.qwzOverlap = 0.4;
  c.pipeline.qwzGreenOverlap = 0.8;
  StepConfig s;
  s.params = 1 << 28;
  ZeroppOptions z;
  z.hpz = false;
  z.qwzBackward = true;  // both gathers quantized
  std::string error;
  const Comparison green = compareStep(c, s, z, &error);
  ASSERT_TRUE(error.empty()) << error;
  c.pipeline.ncclSms = 0;
  const Comparison every = compareStep(c, s, z, &error);
  ASSERT_TRUE(error.empty()) << error;
  for (const auto& pick : {&StepCost::forward, &StepCost::backward}) {
    const Traffic& g = (green.zeropp.*pick).traffic;
    const Traffic& e = (every.zeropp.*pick).traffic;
    ASSERT_GT(e.hiddenUs, 0);
    EXPECT_NEAR(g.hiddenUs, 2 * e.hiddenUs, 1e-9);  // 0.8 against 0.4 of the same ideal
    EXPECT_NEAR(g.timeUs() + g.hiddenUs, e.timeUs() + e.hiddenUs, 1e-9);
  }
  EXPECT_NEAR(green.zeropp.gradient.traffic.timeUs(), every.zeropp.gradient.traffic.timeUs(), 1e-9);
  EXPECT_NEAR(green.zero3.comm.timeUs(), every.zero3.comm.timeUs(), 1e-9);
  EXPECT_LT(green.zeropp.comm.timeUs(), every.zeropp.comm.timeUs());
}

TEST(CostModelLayout, ValidateRejectsBadSettings) {
  const ClusterSpec c = ClusterSpec::even(2, 8);
  StepConfig s;
  s.params = 1e9;
  ZeroppOptions z;
  EXPECT_EQ(validate(c, s, z), "");
  z.hpzSize = 3;
  EXPECT_NE(validate(c, s, z).find("does not divide"), std::string::npos);
  z = ZeroppOptions();
  z.gradBits = 5;
  EXPECT_NE(validate(c, s, z), "");
  z = ZeroppOptions();
  z.blockSize = 100;
  EXPECT_NE(validate(c, s, z), "");
  ClusterSpec bad = c;
  bad.pipeline.qwzGreenOverlap = 1.5;
  EXPECT_NE(validate(bad, s, ZeroppOptions()).find("overlaps"), std::string::npos);
  bad = c;
  bad.pipeline.ncclSms = -1;
  EXPECT_NE(validate(bad, s, ZeroppOptions()).find("NCCL"), std::string::npos);
  s.params = 0;
  EXPECT_NE(validate(c, s, ZeroppOptions()), "");
  std::string error;
  compareStep(ClusterSpec(), s, ZeroppOptions(), &error);
  EXPECT_FALSE(error.empty());
}

// ---- calibration -----------------------------------------------------------------------------------------------

PerfRow ncclRow(const char* op, const char* regime, double size, int ranks, int nodes, double timeUs) {
  PerfRow r;
  r.op = op;
  r.regime = regime;
  r.type = "bfloat16";
  r.size = size;
  r.ranks = ranks;
  r.nodes = nodes;
  r.timeUs = timeUs;
  return r;
}

TEST(CostModelCalibration, RecoversBandwidthAndLatency) {
  // net: 2 ranks on 2 nodes, all-gather at 3.1 GB/s and 25 us; reduce-scatter on 4 ranks at 2.8 GB/s, 7.5 us a
  // step; all-to-all at 1.9 GB/s, 40 us.
  std::vector<PerfRow> rows;
  for (double size = 1024; size <= 1024.0 * 1024 * 1024; size *= 4) {
    rows.push_back(ncclRow("nccl_all_gather", "net", size, 2, 2, 25 + size / 2 / 3.1e3));
    rows.push_back(ncclRow("nccl_reduce_scatter", "net", size, 4, 4, 3 * 7.5 + size * 3 / 4 / 2.8e3));
    rows.push_back(ncclRow("nccl_all_to_all", "net", size, 2, 2, 40 + size / 2 / 1.9e3));
  }
  const Calibration cal = calibrate(rows, KernelParams());
  ASSERT_EQ(cal.regimes.count("net"), 1u);
  const RegimeFit& f = cal.regimes.at("net");
  ASSERT_TRUE(f.allGather.ok && f.reduceScatter.ok && f.allToAll.ok);
  EXPECT_NEAR(f.allGather.cost.bwGBs, 3.1, 3.1e-9);
  EXPECT_NEAR(f.allGather.cost.latencyUs, 25, 1e-6);
  EXPECT_NEAR(f.reduceScatter.cost.bwGBs, 2.8, 2.8e-9);
  EXPECT_NEAR(f.reduceScatter.cost.latencyUs, 7.5, 1e-6);
  EXPECT_NEAR(f.allToAll.cost.bwGBs, 1.9, 1.9e-9);
  EXPECT_NEAR(f.allToAll.cost.latencyUs, 40, 1e-6);
  // Every row predicted back within rounding, nothing flagged.
  EXPECT_EQ(cal.checks.size(), rows.size());
  for (const RowCheck& c : cal.checks) EXPECT_NEAR(c.errPct, 0, 1e-6) << c.what << " " << c.size;
  EXPECT_EQ(cal.flagged, 0);

  // The fit alone: one size pins the bandwidth, the latency is 0.
  const LinkFit one = fitLatencyBandwidth({{1, 1e6, 1000}});
  ASSERT_TRUE(one.ok);
  EXPECT_NEAR(one.cost.bwGBs, 1.0, 1e-12);
  EXPECT_EQ(one.cost.latencyUs, 0);
  EXPECT_FALSE(fitLatencyBandwidth({}).ok);
}

TEST(CostModelCalibration, RecoversKernelParameters) {
  // Rows made by the model itself: nvlink (one node of 2) at 250 GB/s and 3 us a step, net (2 nodes of 1) at 3 GB/s
  // and 100 us; every kind of kernel at its own speed, the reduce launch equal to dequantize's (calibration takes
  // it from there); the pipelines at overlaps 0.6 (qwZ with every SM), 0.85 (qwZ in a green context: the quantized
  // gathers' rows again, with ZP_NCCL_SMS=32) and 0.3 (qgZ). The fit finds all of it back.
  const LinkParams nvlink = LinkParams::uniform(250, 3), net = LinkParams::uniform(3, 100);
  KernelParams truth;
  truth.quantizeInt8 = KernelCost{2000, 8};
  truth.quantizeInt4 = KernelCost{1600, 6};
  truth.dequantize = KernelCost{3000, 2};
  truth.reduce = KernelCost{300, 2};
  truth.copy = KernelCost{4000, 12};
  PipelineParams pipe;
  pipe.qwzOverlap = 0.6;
  pipe.qwzGreenOverlap = 0.85;
  pipe.qgzOverlap = 0.3;
  std::vector<PerfRow> rows;
  auto add = [&](const char* op, const char* regime, double size, int ranks, int nodes, int bits,
                 const char* ncclSms = nullptr) {
    const LinkParams& link = std::string(regime) == "net" ? net : nvlink;
    PerfRow r = ncclRow(op, regime, size, ranks, nodes, 0);
    r.bits = bits;
    r.block = bits ? 256 : 0;
    if (ncclSms) r.env["ZP_NCCL_SMS"] = ncclSms;
    r.timeUs = predictRowUs(r, false, link, truth, pipe);
    const RowKind k = classifyOp(op);
    if (k == RowKind::kQwz || k == RowKind::kQgz || k == RowKind::kHpz || k == RowKind::kQwzHpz)
      r.ncclTimeUs = predictRowUs(r, true, link, truth, pipe);
    ASSERT_GT(r.timeUs, 0) << op;
    rows.push_back(r);
  };
  for (double size = 1 << 16; size <= (1 << 30); size *= 4) {
    for (const char* regime : {"nvlink", "net"}) {
      const int nodes = std::string(regime) == "net" ? 2 : 1;
      add("nccl_all_gather", regime, size, 2, nodes, 0);
      add("nccl_reduce_scatter", regime, size, 2, nodes, 0);
      add("nccl_all_to_all", regime, size, 2, nodes, 0);
      add("hpz_all_gather", regime, size, 2, nodes, 0);
      for (int bits : {4, 8}) {
        add("qwz_all_gather", regime, size, 2, nodes, bits);
        add("qgz_reduce_scatter", regime, size, 2, nodes, bits);
        add("qwz_hpz_gathers", regime, size, 2, nodes, bits);
        add("qwz_all_gather", regime, size, 2, nodes, bits, "32");
        add("qwz_hpz_gathers", regime, size, 2, nodes, bits, "32");
      }
    }
    for (int bits : {4, 8}) {
      add("quantize", "local", size, 1, 1, bits);
      add("dequantize", "local", size, 1, 1, bits);
    }
  }
  const Calibration cal = calibrate(rows, KernelParams());
  ASSERT_TRUE(cal.kernelFitted);
  EXPECT_EQ(cal.greenRows, 8 * 2 * 2 * 2);  // 8 sizes x 2 regimes x 2 widths x (qwZ, qwz_hpz_gathers)
  for (const std::string& note : cal.notes)
    if (note.find("in a green context (ZP_NCCL_SMS non-zero), modelled with their own overlap") == std::string::npos)
      ADD_FAILURE() << "unexpected note: " << note;
  for (const ParamFit* f : {&cal.quantizeInt8Fit, &cal.quantizeInt4Fit, &cal.dequantizeFit, &cal.copyFit,
                            &cal.reduceFit, &cal.qwzOverlapFit, &cal.qwzGreenOverlapFit, &cal.qgzOverlapFit})
    EXPECT_TRUE(f->ok);
  EXPECT_EQ(cal.quantizeInt8Fit.points, 4);  // the int8 quantize rows from 16 MiB up
  EXPECT_EQ(cal.quantizeInt4Fit.points, 4);
  EXPECT_EQ(cal.copyFit.points, 4);  // net hpZ rows (one-rank groups) from 16 MiB up
  const KernelCost* got[] = {&cal.kernel.quantizeInt8, &cal.kernel.quantizeInt4, &cal.kernel.dequantize,
                             &cal.kernel.copy, &cal.kernel.reduce};
  const KernelCost* want[] = {&truth.quantizeInt8, &truth.quantizeInt4, &truth.dequantize, &truth.copy, &truth.reduce};
  for (int k = 0; k < 5; ++k) {
    EXPECT_NEAR(got[k]->rate, want[k]->rate, want[k]->rate * 1e-6) << k;
    EXPECT_NEAR(got[k]->launchUs, want[k]->launchUs, 1e-6) << k;
  }
  EXPECT_NEAR(cal.pipeline.qwzOverlap, 0.6, 1e-6);
  EXPECT_NEAR(cal.pipeline.qwzGreenOverlap, 0.85, 1e-6);
  EXPECT_NEAR(cal.pipeline.qgzOverlap, 0.3, 1e-6);
  EXPECT_EQ(cal.qwzOverlapFit.points, cal.qwzGreenOverlapFit.points);  // the qwZ rows from 16 MiB up, each half
  const RegimeFit& f = cal.regimes.at("nvlink");
  EXPECT_NEAR(f.link.allGather.bwGBs, 250, 1e-6);
  EXPECT_NEAR(f.link.allGather.latencyUs, 3, 1e-6);
  EXPECT_NEAR(f.link.reduceScatter.bwGBs, 250, 1e-6);
  EXPECT_NEAR(cal.regimes.at("net").link.allToAll.latencyUs, 100, 1e-6);
  for (const RowCheck& c : cal.checks) EXPECT_NEAR(c.errPct, 0, 1e-4) << c.what << " " << c.regime << " " << c.size;
  EXPECT_EQ(cal.flagged, 0);
}

TEST(CostModelCalibration, BaselinesAndHpzRowsAsRun) {
  // qwz_hpz_gathers: qwZ then hpZ of the full tensor, against two NCCL all-gathers; hpz_all_gather: the gather in
  // the hpZ group (one node of 2: the same ring as NCCL's) against the global one; over 2 nodes of one GPU the
  // group is one rank: a copy.
  const LinkParams link = LinkParams::uniform(100, 5);
  const KernelParams k = handKernels();
  PerfRow both = ncclRow("qwz_hpz_gathers", "net", 1 << 26, 2, 2, 0);
  both.bits = 8;
  EXPECT_EQ(classifyOp(both.op), RowKind::kQwzHpz);
  ClusterSpec c = ClusterSpec::even(2, 1);
  c.intra = c.inter = link;
  c.kernel = k;
  EXPECT_NEAR(predictRowUs(both, true, link, k), 2 * ringAllGatherCost(c, 1 << 26).timeUs(), 1e-9);
  // 2^25 elements: qwZ of the 2^24-element shards, then the copy of 2^26 bytes (2^27 read + written at 4000 GB/s).
  EXPECT_NEAR(predictRowUs(both, false, link, k),
              qwzAllGatherCost(c, 1 << 24, 2, 8, 256).timeUs() + 10 + (1 << 27) / 4000e3, 1e-9);
  PerfRow hpz = ncclRow("hpz_all_gather", "net", 1 << 26, 2, 2, 0);
  EXPECT_NEAR(predictRowUs(hpz, false, link, k), 10 + (1 << 27) / 4000e3, 1e-9);
  EXPECT_NEAR(predictRowUs(hpz, true, link, k), ringAllGatherCost(c, 1 << 26).timeUs(), 1e-9);
  hpz.nodes = 1;  // one node of 2: the hpZ group is the node, the same ring as the baseline
  c.gpusPerNode = {2};
  EXPECT_NEAR(predictRowUs(hpz, false, link, k), ringAllGatherCost(c, 1 << 26).timeUs(), 1e-9);
  EXPECT_NEAR(predictRowUs(hpz, true, link, k), ringAllGatherCost(c, 1 << 26).timeUs(), 1e-9);
}

TEST(CostModelCalibration, FlagsLargeRowsThatMiss) {
  const LinkParams shm = LinkParams::uniform(24.8, 10);
  std::vector<PerfRow> rows;
  for (double size = 1 << 20; size <= (1 << 30); size *= 4) {
    rows.push_back(ncclRow("nccl_all_gather", "shm", size, 2, 1, 10 + size / 2 / 24.8e3));
    rows.push_back(ncclRow("qwz_all_gather", "shm", size, 2, 1, 0));
    rows.back().timeUs = predictRowUs(rows.back(), false, shm, KernelParams());
  }
  // A qwZ row 1.5x slower than the model, at 64 MiB: flagged. A 1 KiB one off by 2x: below 16 MiB, not flagged.
  const size_t slowRow = rows.size();
  rows.push_back(ncclRow("qwz_all_gather", "shm", 64 << 20, 2, 1, 0));
  rows.back().timeUs = 1.5 * predictRowUs(rows.back(), false, shm, KernelParams());
  rows.push_back(ncclRow("qwz_all_gather", "shm", 1024, 2, 1, 0));
  rows.back().timeUs = 2 * predictRowUs(rows.back(), false, shm, KernelParams());
  const Calibration cal = calibrate(rows, KernelParams());
  EXPECT_EQ(cal.flagged, 1);
  for (const RowCheck& c : cal.checks) {
    EXPECT_EQ(c.flagged, c.row == slowRow) << c.what << " " << c.size << " " << c.errPct << "%";
    if (c.row == slowRow) {
      EXPECT_LT(c.errPct, -kCheckMaxErrPct);
    }
    if (c.size < kCheckMinBytes) {
      EXPECT_FALSE(c.flagged);
    }
  }
}

TEST(CostModelCalibration, ParsesPerfJsonTolerantly) {
  // The shape perf/json_out.cc writes, with nulls, unknown fields and a missing baseline; then a second array
  // and a bare row, as when files are concatenated.
  const std::string text = R"([
  {"op": "qwz_all_gather", "regime": "nvlink", "backend": "cuda", "size": 16777216, "count": 8388608,
   "type": "bfloat16", "redop": null, "bits": 8, "block": 256, "ranks": 2, "nodes": 1,
   "oop": {"time_us": 80.5, "algbw": 208.4, "busbw": 104.2, "wrong": 0}, "ip": null, "baseline": "nccl",
   "nccl": {"time_us": 120.25, "busbw": 69.8}, "speedup": 1.49,
   "wire_bytes_per_rank": {"zpccl": {"intra": 1, "inter": 0}, "nccl_ring": {"intra": 2, "inter": 0}}},
  {"op": "quantize", "size": 1024, "bits": null, "oop": {"time_us": null}, "nccl": null, "extra": [1, {"a": true}]}
]
[{"op": "nccl_all_to_all", "regime": "net", "size": 1e6, "ranks": 2, "nodes": 2, "oop": {"time_us": 400}}]
{"op": "hpz_all_gather", "size": 2048, "ranks": 8, "oop": {"time_us": 3, "wrong": 0}}
)";
  std::vector<PerfRow> rows;
  std::string error;
  ASSERT_TRUE(parsePerfJson(text, &rows, &error)) << error;
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].op, "qwz_all_gather");
  EXPECT_EQ(rows[0].regime, "nvlink");
  EXPECT_EQ(rows[0].type, "bfloat16");
  EXPECT_DOUBLE_EQ(rows[0].size, 16777216);
  EXPECT_EQ(rows[0].ranks, 2);
  EXPECT_EQ(rows[0].nodes, 1);
  EXPECT_EQ(rows[0].bits, 8);
  EXPECT_EQ(rows[0].block, 256);
  EXPECT_DOUBLE_EQ(rows[0].timeUs, 80.5);
  EXPECT_DOUBLE_EQ(rows[0].ncclTimeUs, 120.25);
  EXPECT_EQ(rows[0].wrong, 0);
  EXPECT_EQ(rows[1].bits, 0);
  EXPECT_LT(rows[1].timeUs, 0);
  EXPECT_LT(rows[1].ncclTimeUs, 0);
  EXPECT_EQ(rows[1].ranks, 0);
  EXPECT_DOUBLE_EQ(rows[2].size, 1e6);
  EXPECT_EQ(rows[3].nodes, 0);

  EXPECT_EQ(classifyOp("qwz_all_gather"), RowKind::kQwz);
  EXPECT_EQ(classifyOp("qwz_hpz_gathers"), RowKind::kQwzHpz);
  EXPECT_EQ(classifyOp("hpz_all_gather"), RowKind::kHpz);
  EXPECT_EQ(classifyOp("qgz_reduce_scatter"), RowKind::kQgz);
  EXPECT_EQ(classifyOp("quant_reduce_scatter_a2a"), RowKind::kQgz);
  EXPECT_EQ(classifyOp("nccl_all_gather"), RowKind::kNcclAllGather);
  EXPECT_EQ(classifyOp("nccl_reduce_scatter"), RowKind::kNcclReduceScatter);
  EXPECT_EQ(classifyOp("nccl_all_to_all"), RowKind::kNcclAllToAll);
  EXPECT_EQ(classifyOp("quantize"), RowKind::kQuantize);
  EXPECT_EQ(classifyOp("dequantize"), RowKind::kDequantize);
  EXPECT_EQ(classifyOp("memcpy"), RowKind::kUnknown);

  rows.clear();
  EXPECT_FALSE(parsePerfJson("[{\"op\": \"x\", ", &rows, &error));
  EXPECT_NE(error.find("JSON"), std::string::npos);
}

TEST(CostModelCalibration, ClassifiesGreenContextRows) {
  // "env" holds the ZP_* tunables of the run (strings; numbers read as their text).
  std::vector<PerfRow> parsed;
  std::string error;
  ASSERT_TRUE(parsePerfJson(R"([{"op": "qwz_all_gather", "size": 1, "env": {"ZP_NCCL_SMS": "32", "ZP_MAX_CHUNKS": 4}},
                                {"op": "qwz_all_gather", "size": 1, "env": {"ZP_NCCL_SMS": 16}},
                                {"op": "qwz_all_gather", "size": 1, "env": null}])",
                            &parsed, &error))
      << error;
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[0].env.at("ZP_NCCL_SMS"), "32");
  EXPECT_EQ(parsed[0].env.at("ZP_MAX_CHUNKS"), "4");
  EXPECT_TRUE(parsed[2].env.empty());
  EXPECT_EQ(rowNcclSms(parsed[0]), 32);
  EXPECT_EQ(rowNcclSms(parsed[1]), 16);
  EXPECT_EQ(rowNcclSms(parsed[2]), 0);  // a row without the setting ran without a green context
  EXPECT_TRUE(isGreenContextRow(parsed[0]));
  EXPECT_TRUE(isGreenContextRow(parsed[1]));
  EXPECT_FALSE(isGreenContextRow(parsed[2]));

  // Only the quantized gathers use the green context: qwZ (alone, or as the first gather of qwz_hpz_gathers) and
  // hpZ with bits. Every row records ZP_NCCL_SMS (perf/json_out.cc), NCCL's and qgZ's too, where it means nothing.
  auto row = [](const char* op, int bits, const char* sms) {
    PerfRow r = ncclRow(op, "nvlink", 1 << 26, 2, 1, 1);
    r.bits = bits;
    if (sms) r.env["ZP_NCCL_SMS"] = sms;
    return r;
  };
  EXPECT_TRUE(isGreenContextRow(row("qwz_all_gather", 8, "32")));
  EXPECT_TRUE(isGreenContextRow(row("qwz_all_gather", 0, "32")));  // bits not said: the perf binaries' int8
  EXPECT_TRUE(isGreenContextRow(row("qwz_hpz_gathers", 4, "32")));
  EXPECT_TRUE(isGreenContextRow(row("hpz_all_gather", 8, "32")));
  EXPECT_FALSE(isGreenContextRow(row("hpz_all_gather", 0, "32")));  // hpZ in bf16: one NCCL all-gather
  EXPECT_FALSE(isGreenContextRow(row("qwz_all_gather", 8, "0")));
  EXPECT_FALSE(isGreenContextRow(row("qwz_all_gather", 8, nullptr)));
  for (const char* op :
       {"qgz_reduce_scatter", "nccl_all_gather", "nccl_reduce_scatter", "nccl_all_to_all", "quantize", "dequantize"})
    EXPECT_FALSE(isGreenContextRow(row(op, 4, "32"))) << op;
}

TEST(CostModelCalibration, FitsTheGreenContextApart) {
  // Rows made by the model over NVLink (one node of 2, 250 GB/s and 20 us a step, where the kernels are a good
  // part of the time and the overlap shows): qwZ with every SM at overlap 0.5 (no env, or ZP_NCCL_SMS=0),
  // the same calls in a green context (ZP_NCCL_SMS=32) at 0.85, and NCCL's and qgZ's rows (reduce 1000 G/s,
  // overlap 0.3, neither the defaults) also recording ZP_NCCL_SMS=32, as every row of the perf binaries does.
  // Calibration fits each configuration's overlap back from its own rows, with the links and kernels shared; the
  // NCCL and qgZ rows are used as any others (without them no link would be fitted, and qgZ would keep the default
  // reduce and overlap); every row is predicted in its configuration and checked; the notes count the green rows.
  const LinkParams link = LinkParams::uniform(250, 20);
  KernelParams truth;
  truth.reduce = KernelCost{1000, truth.dequantize.launchUs};
  PipelineParams pipe;
  pipe.qwzOverlap = 0.5;
  pipe.qwzGreenOverlap = 0.85;
  pipe.qgzOverlap = 0.3;
  std::vector<PerfRow> rows;
  std::vector<size_t> green;
  for (double size = 1 << 24; size <= (1 << 30); size *= 4) {
    rows.push_back(ncclRow("nccl_all_gather", "nvlink", size, 2, 1, 20 + size / 2 / 250e3));
    rows.back().env["ZP_NCCL_SMS"] = "32";
    PerfRow qgz = ncclRow("qgz_reduce_scatter", "nvlink", size, 2, 1, 0);
    qgz.bits = 4;
    qgz.env["ZP_NCCL_SMS"] = "32";
    qgz.timeUs = predictRowUs(qgz, false, link, truth, pipe);
    rows.push_back(qgz);
    for (const char* sms : {"", "0", "32"}) {
      PerfRow r = ncclRow("qwz_all_gather", "nvlink", size, 2, 1, 0);
      r.bits = 8;
      if (*sms) r.env["ZP_NCCL_SMS"] = sms;
      r.timeUs = predictRowUs(r, false, link, truth, pipe);  // in the row's configuration, from its env
      if (isGreenContextRow(r)) green.push_back(rows.size());
      rows.push_back(r);
    }
  }
  ASSERT_EQ(green.size(), 4u);
  // The two configurations differ where it shows: a pipelined green row (1 GiB, 8 chunks) is faster than the same
  // call with every SM, by more than the tolerances below.
  PerfRow everySm = rows[green.back()];
  everySm.env.erase("ZP_NCCL_SMS");
  EXPECT_LT(rows[green.back()].timeUs, 0.9 * predictRowUs(everySm, false, link, truth, pipe));

  const Calibration cal = calibrate(rows, KernelParams());
  EXPECT_EQ(cal.greenRows, 4);
  EXPECT_NEAR(cal.pipeline.qwzOverlap, 0.5, 1e-6);
  EXPECT_NEAR(cal.pipeline.qwzGreenOverlap, 0.85, 1e-6);
  EXPECT_EQ(cal.qwzOverlapFit.points, 8);  // two rows per size with every SM
  EXPECT_EQ(cal.qwzGreenOverlapFit.points, 4);
  EXPECT_NEAR(cal.kernel.reduce.rate, 1000, 1e-3);
  EXPECT_NEAR(cal.pipeline.qgzOverlap, 0.3, 1e-6);
  EXPECT_EQ(cal.qgzOverlapFit.points, 4);
  EXPECT_TRUE(anyMentions(cal.notes, "4 row(s) of quantized gathers run in a green context"))
      << ::testing::PrintToString(cal.notes);
  EXPECT_TRUE(anyMentions(cal.notes, "qwZ 0.850 in a green context, 0.500 with every SM"))
      << ::testing::PrintToString(cal.notes);
  EXPECT_FALSE(anyMentions(cal.notes, "skipped")) << ::testing::PrintToString(cal.notes);
  // Every row checked (the NCCL ones have no baseline of their own), the green ones at their own overlap.
  ASSERT_EQ(cal.checks.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(cal.checks[i].row, i);
    EXPECT_EQ(cal.checks[i].what, rows[i].op);
    EXPECT_NEAR(cal.checks[i].errPct, 0, 1e-4) << rows[i].op << " " << rows[i].size << " " << i;
  }
  EXPECT_EQ(cal.flagged, 0);

  // Without green rows, the green overlap keeps the given value and a note says so; so does the overlap with
  // every SM without rows of its own.
  std::vector<PerfRow> noGreen, onlyGreen;
  for (size_t i = 0; i < rows.size(); ++i)
    (std::count(green.begin(), green.end(), i) ? onlyGreen : noGreen).push_back(rows[i]);
  for (const PerfRow& r : rows)
    if (classifyOp(r.op) != RowKind::kQwz) onlyGreen.push_back(r);
  PipelineParams given;
  given.qwzOverlap = 0.11;
  given.qwzGreenOverlap = 0.22;
  const Calibration a = calibrate(noGreen, KernelParams(), given);
  EXPECT_EQ(a.greenRows, 0);
  EXPECT_NEAR(a.pipeline.qwzOverlap, 0.5, 1e-6);
  EXPECT_DOUBLE_EQ(a.pipeline.qwzGreenOverlap, 0.22);
  EXPECT_FALSE(a.qwzGreenOverlapFit.ok);
  EXPECT_TRUE(anyMentions(a.notes, "run in a green context (ZP_NCCL_SMS non-zero): that overlap keeps the given"))
      << ::testing::PrintToString(a.notes);
  const Calibration b = calibrate(onlyGreen, KernelParams(), given);
  EXPECT_EQ(b.greenRows, 4);
  EXPECT_NEAR(b.pipeline.qwzGreenOverlap, 0.85, 1e-6);
  EXPECT_DOUBLE_EQ(b.pipeline.qwzOverlap, 0.11);
  EXPECT_TRUE(anyMentions(b.notes, "run with every SM (ZP_NCCL_SMS=0): that overlap keeps the given"))
      << ::testing::PrintToString(b.notes);
}

TEST(CostModelCalibration, ParsesPairAllGather) {
  // Rows say how qgZ exchanged slots between two ranks (env ZP_PAIR_ALLGATHER, a string or a number); rows without
  // it ran with send/recv (0). The model prices each row in its own mode, whatever the pipeline passed says.
  const std::string text = R"([
    {"op": "qgz_reduce_scatter", "regime": "net", "type": "bfloat16", "size": 67108864, "bits": 4, "block": 256,
     "ranks": 2, "nodes": 2, "oop": {"time_us": 2750.9}, "nccl": {"time_us": 10516.8},
     "env": {"ZP_NCCL_SMS": "32", "ZP_PAIR_ALLGATHER": "1"}},
    {"op": "qgz_reduce_scatter", "regime": "nvlink", "type": "bfloat16", "size": 67108864, "bits": 4, "block": 256,
     "ranks": 2, "nodes": 1, "oop": {"time_us": 126.1}, "env": {"ZP_PAIR_ALLGATHER": 2}},
    {"op": "qgz_reduce_scatter", "regime": "net", "type": "bfloat16", "size": 67108864, "bits": 4, "block": 256,
     "ranks": 2, "nodes": 2, "oop": {"time_us": 2806.6}, "nccl": {"time_us": 9327.1},
     "env": {"ZP_PAIR_ALLGATHER": "2"}},
    {"op": "qgz_reduce_scatter", "regime": "net", "type": "bfloat16", "size": 67108864, "bits": 4, "block": 256,
     "ranks": 2, "nodes": 2, "oop": {"time_us": 3987.1}, "nccl": {"time_us": 9523.2}},
    {"op": "qwz_all_gather", "regime": "net", "type": "bfloat16", "size": 67108864, "bits": 8, "block": 256,
     "ranks": 2, "nodes": 2, "oop": {"time_us": 5000}, "env": {"ZP_NCCL_SMS": "32", "ZP_PAIR_ALLGATHER": "1"}}
  ])";
  std::vector<PerfRow> rows;
  std::string error;
  ASSERT_TRUE(parsePerfJson(text, &rows, &error)) << error;
  ASSERT_EQ(rows.size(), 5u);
  const int modes[] = {1, 2, 2, 0, 1};
  const bool gathers[] = {true, false, true, false, false};  // mode 2 gathers across nodes only; qwZ never
  const char* configs[] = {"pair all-gather", "", "pair all-gather", "", "green context"};
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rowPairAllGather(rows[i]), modes[i]) << i;
    EXPECT_EQ(usesPairGather(rows[i]), gathers[i]) << i;
    EXPECT_EQ(rowConfiguration(rows[i]), configs[i]) << i;
  }

  // Priced per row: 2^24 elements per rank (64 MiB logical: one chunk), on the links of pairLinks (all-gather
  // twice as fast as the all-to-all), intra = inter as predictRowUs sets them. The pipeline's own mode (0 here) is
  // not used.
  LinkParams link = LinkParams::uniform(10, 20);
  link.allToAll = LinkCost{5, 10};
  const KernelParams k = handKernels();
  PipelineParams pipe;
  pipe.pairAllGather = 0;
  auto cluster = [&](const std::vector<int>& gpus, int mode) {
    ClusterSpec c = pairLinks(gpus, mode);
    c.intra = c.inter = link;
    c.kernel = k;
    c.pipeline = pipe;
    c.pipeline.pairAllGather = mode;
    return c;
  };
  const double gathered = qgzReduceScatterCost(cluster({1, 1}, 1), 1 << 24, 2, 4, 256, nullptr).timeUs();
  const double sent = qgzReduceScatterCost(cluster({1, 1}, 0), 1 << 24, 2, 4, 256, nullptr).timeUs();
  ASSERT_LT(gathered, 0.7 * sent);  // half the link time, plus the copy
  EXPECT_NEAR(predictRowUs(rows[0], false, link, k, pipe), gathered, 1e-9);
  EXPECT_NEAR(predictRowUs(rows[2], false, link, k, pipe), gathered, 1e-9);
  EXPECT_NEAR(predictRowUs(rows[3], false, link, k, pipe), sent, 1e-9);
  EXPECT_NEAR(predictRowUs(rows[1], false, link, k, pipe),
              qgzReduceScatterCost(cluster({2}, 0), 1 << 24, 2, 4, 256, nullptr).timeUs(), 1e-9);
  // The NCCL baseline (a reduce-scatter) is the same in every mode.
  EXPECT_NEAR(predictRowUs(rows[0], true, link, k, pipe), predictRowUs(rows[3], true, link, k, pipe), 1e-9);
  // Calibrated, each row is checked in its mode and its configuration comes with the check (none for a baseline).
  const Calibration cal = calibrate(rows, k);
  ASSERT_EQ(cal.checks.size(), 7u);  // the 4 net rows and 3 baselines (nvlink has no NCCL rows to fit)
  for (const RowCheck& c : cal.checks) {
    EXPECT_EQ(c.config, c.baseline ? std::string() : std::string(configs[c.row])) << c.row << " " << c.what;
  }
}

TEST(CostModelCalibration, SmallMessageLine) {
  // nvlink, 2 ranks of one node. NCCL's all-gather on two lines: 250 GB/s + 20 us a step from 16 MiB up, and below
  // that its small-message protocols at 100 GB/s + 5 us; rows made as the model prices them (below 16 MiB the lower
  // line). The reduce-scatter has one size below 16 MiB only, the all-to-all none: both keep one line.
  const double mib = 1024.0 * 1024;
  LinkCost truth{250, 20};
  truth.smallBelowBytes = 16 * mib;
  truth.smallBwGBs = 100;
  truth.smallLatencyUs = 5;
  const LinkCost large{250, 20};
  auto lineUs = [](const LinkCost& l, double size) {
    const LinkCost use = l.forSize(size, size / 2);
    return use.latencyUs + size / 2 / (use.bwGBs * 1e3);
  };
  std::vector<PerfRow> rows;
  for (double size : {0.25 * mib, 1 * mib, 2 * mib, 16 * mib, 64 * mib, 256 * mib, 1024 * mib})
    rows.push_back(ncclRow("nccl_all_gather", "nvlink", size, 2, 1, lineUs(truth, size)));
  for (double size : {1 * mib, 16 * mib, 64 * mib, 256 * mib, 1024 * mib}) {
    rows.push_back(ncclRow("nccl_reduce_scatter", "nvlink", size, 2, 1, lineUs(truth, size)));
    rows.push_back(ncclRow("nccl_all_to_all", "nvlink", size * 4, 2, 1, lineUs(large, size * 4)));
  }
  const Calibration cal = calibrate(rows, KernelParams());
  ASSERT_EQ(cal.regimes.count("nvlink"), 1u);
  const RegimeFit& f = cal.regimes.at("nvlink");
  // The large lines from 16 MiB up, the small one from the three sizes below.
  ASSERT_TRUE(f.allGather.ok && f.smallAllGather.ok);
  EXPECT_NEAR(f.allGather.cost.bwGBs, 250, 1e-6);
  EXPECT_NEAR(f.allGather.cost.latencyUs, 20, 1e-6);
  EXPECT_EQ(f.allGather.points, 4);
  EXPECT_NEAR(f.smallAllGather.cost.bwGBs, 100, 1e-6);
  EXPECT_NEAR(f.smallAllGather.cost.latencyUs, 5, 1e-6);
  EXPECT_EQ(f.smallAllGather.points, 3);
  EXPECT_DOUBLE_EQ(f.link.allGather.smallBelowBytes, 16 * mib);
  EXPECT_NEAR(f.link.allGather.smallBwGBs, 100, 1e-6);
  EXPECT_NEAR(f.link.allGather.smallLatencyUs, 5, 1e-6);
  // One size below 16 MiB, or none: no small line, the large one serves every size.
  EXPECT_TRUE(f.reduceScatter.ok);
  EXPECT_FALSE(f.smallReduceScatter.ok);
  EXPECT_FALSE(f.link.reduceScatter.hasSmallLine());
  EXPECT_NEAR(f.link.reduceScatter.bwGBs, 250, 1e-6);
  EXPECT_FALSE(f.smallAllToAll.ok);
  EXPECT_FALSE(f.link.allToAll.hasSmallLine());
  // Every all-gather row predicted back.
  for (const RowCheck& c : cal.checks) {
    if (c.what == "nccl_all_gather") {
      EXPECT_NEAR(c.errPct, 0, 1e-6) << c.size;
    }
  }
  EXPECT_EQ(cal.flagged, 0);

  // Used only below the range, and only where lower: at 1 MiB the small line (5 + 524288 B at 100 GB/s =
  // 10.24288 us against 20 + 2.097152 on the large); at 8 MiB the large one is lower (20 + 4194304 B at 250 GB/s =
  // 36.777216 against 46.94304); from 16 MiB up the large one, whatever the small line says.
  PerfRow row = ncclRow("nccl_all_gather", "nvlink", 1 * mib, 2, 1, 1);
  const LinkParams withSmall = f.link;
  LinkParams largeOnly = f.link;
  largeOnly.allGather.smallBelowBytes = 0;
  EXPECT_NEAR(predictRowUs(row, false, withSmall, KernelParams()), 10.24288, 1e-6);
  EXPECT_NEAR(predictRowUs(row, false, largeOnly, KernelParams()), 22.097152, 1e-6);
  row.size = 8 * mib;
  EXPECT_NEAR(predictRowUs(row, false, withSmall, KernelParams()), 36.777216, 1e-6);
  for (double size : {16 * mib, 64 * mib}) {
    row.size = size;
    EXPECT_NEAR(predictRowUs(row, false, withSmall, KernelParams()),
                predictRowUs(row, false, largeOnly, KernelParams()), 1e-9);
  }
  // qwZ int4 at 16 MiB logical gathers 2 payloads of 2162688 B (~4.1 MiB): its NCCL call on the small line, 5 +
  // 21.62688 us against 20 + 8.650752 on the large, the rest alike.
  PerfRow qwz = ncclRow("qwz_all_gather", "nvlink", 16 * mib, 2, 1, 1);
  qwz.bits = 4;
  qwz.block = 256;
  EXPECT_NEAR(predictRowUs(qwz, false, largeOnly, KernelParams()) - predictRowUs(qwz, false, withSmall, KernelParams()),
              28.650752 - 26.62688, 1e-6);

  // fitLinkRows alone: fewer than two sizes from 16 MiB up fits one line through every point, with no small one.
  LinkFit small;
  const LinkFit one = fitLinkRows(
      {{1, 0.5 * mib, 10, 0, 1 * mib}, {1, 1 * mib, 12, 0, 2 * mib}, {1, 8 * mib, 60, 0, 16 * mib}}, &small);
  EXPECT_TRUE(one.ok);
  EXPECT_EQ(one.points, 3);
  EXPECT_FALSE(small.ok);
  EXPECT_FALSE(one.cost.hasSmallLine());
}

TEST(CostModelCalibration, AveragesRepeatedPoints) {
  // The same call measured in several files: the per-row check flags each repeat that misses, the measured point
  // (their mean) only when the mean misses. nvlink, one node of 2: NCCL's all-gather at 250 GB/s + 20 us a step;
  // hpZ's gather over the node is the same ring (no fit uses its time), measured at 64 MiB as 1.25, 0.8 and 1.0
  // times the model (two rows miss, the mean is within 2%), at 256 MiB as 1.3 and 1.2 times (both miss, and so does
  // the mean), at 256 MiB in fp32 once on the model (another point: another type), at 1 MiB as 2 and 1 times
  // (below 16 MiB nothing is flagged).
  const double mib = 1024.0 * 1024;
  const LinkParams link = LinkParams::uniform(250, 20);
  std::vector<PerfRow> rows;
  for (double size : {16 * mib, 64 * mib, 256 * mib, 1024 * mib})
    rows.push_back(ncclRow("nccl_all_gather", "nvlink", size, 2, 1, 20 + size / 2 / 250e3));
  auto hpz = [&](double size, double times, const char* type = "bfloat16") {
    PerfRow r = ncclRow("hpz_all_gather", "nvlink", size, 2, 1, 0);
    r.type = type;
    r.timeUs = times * predictRowUs(r, false, link, KernelParams());
    rows.push_back(r);
  };
  hpz(64 * mib, 1.25);
  hpz(64 * mib, 0.8);
  hpz(64 * mib, 1.0);
  hpz(256 * mib, 1.3);
  hpz(256 * mib, 1.2);
  hpz(256 * mib, 1.0, "float32");
  hpz(1 * mib, 2);
  hpz(1 * mib, 1);
  // qwZ int4 and int8 at 16 MiB (one chunk), their NCCL baselines on the line (the same all-gather whatever the
  // width: one point), and the int8 call again in a green context (another configuration: another point).
  for (const std::pair<int, const char*>& run :
       {std::make_pair(4, "0"), std::make_pair(8, "0"), std::make_pair(8, "32")}) {
    PerfRow r = ncclRow("qwz_all_gather", "nvlink", 16 * mib, 2, 1, 0);
    r.bits = run.first;
    r.block = 256;
    r.env["ZP_NCCL_SMS"] = run.second;
    r.timeUs = predictRowUs(r, false, link, KernelParams());
    r.ncclTimeUs = predictRowUs(r, true, link, KernelParams());
    rows.push_back(r);
  }
  const Calibration cal = calibrate(rows, KernelParams());
  EXPECT_EQ(cal.flagged, 4);  // 64 MiB x 1.25 and x 0.8, 256 MiB x 1.3 and x 1.2
  EXPECT_EQ(cal.pointsFlagged, 1);
  auto find = [&](const std::string& what, double size, const std::string& type, int bits, const std::string& config) {
    for (const PointCheck& p : cal.points)
      if (p.what == what && p.size == size && p.type == type && p.bits == bits && p.config == config) return &p;
    return static_cast<const PointCheck*>(nullptr);
  };
  const PointCheck* p64 = find("hpz_all_gather", 64 * mib, "bfloat16", 0, "");
  ASSERT_NE(p64, nullptr);
  EXPECT_EQ(p64->repeats, 3);
  const double model64 = p64->predictedUs;
  EXPECT_NEAR(p64->measuredUs, (1.25 + 0.8 + 1.0) / 3 * model64, 1e-9);
  EXPECT_NEAR(p64->minUs, 0.8 * model64, 1e-9);
  EXPECT_NEAR(p64->maxUs, 1.25 * model64, 1e-9);
  EXPECT_NEAR(p64->errPct, 100 * (1 / ((1.25 + 0.8 + 1.0) / 3) - 1), 1e-9);
  EXPECT_FALSE(p64->flagged);
  const PointCheck* p256 = find("hpz_all_gather", 256 * mib, "bfloat16", 0, "");
  ASSERT_NE(p256, nullptr);
  EXPECT_EQ(p256->repeats, 2);
  EXPECT_NEAR(p256->errPct, 100 * (1 / 1.25 - 1), 1e-9);
  EXPECT_TRUE(p256->flagged);
  const PointCheck* fp32 = find("hpz_all_gather", 256 * mib, "float32", 0, "");
  ASSERT_NE(fp32, nullptr);
  EXPECT_EQ(fp32->repeats, 1);
  EXPECT_FALSE(fp32->flagged);
  const PointCheck* p1 = find("hpz_all_gather", 1 * mib, "bfloat16", 0, "");
  ASSERT_NE(p1, nullptr);
  EXPECT_EQ(p1->repeats, 2);
  EXPECT_FALSE(p1->flagged);
  const PointCheck* base = find("qwz_all_gather (nccl baseline)", 16 * mib, "bfloat16", 0, "");
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(base->repeats, 3);  // int4, int8, and int8 in a green context: one NCCL call
  const PointCheck* every = find("qwz_all_gather", 16 * mib, "bfloat16", 8, "");
  const PointCheck* green = find("qwz_all_gather", 16 * mib, "bfloat16", 8, "green context");
  ASSERT_NE(every, nullptr);
  ASSERT_NE(green, nullptr);
  EXPECT_EQ(every->repeats + green->repeats, 2);
  // 4 NCCL sizes; hpZ 64, 256 (bf16, fp32) and 1 MiB; qwZ int4, int8, int8 green; one baseline point.
  EXPECT_EQ(cal.points.size(), 4u + 4u + 3u + 1u);

  // averagePoints alone: two repeats of one call, predicted alike.
  RowCheck a;
  a.what = "nccl_all_to_all";
  a.regime = "net";
  a.size = 64 * mib;
  a.measuredUs = 100;
  a.predictedUs = 120;
  RowCheck b = a;
  b.measuredUs = 140;
  RowCheck other = a;
  other.nodes = 2;  // another layout: another point
  const std::vector<PointCheck> points = averagePoints({a, other, b});
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].repeats, 2);
  EXPECT_DOUBLE_EQ(points[0].measuredUs, 120);
  EXPECT_DOUBLE_EQ(points[0].errPct, 0);
  EXPECT_DOUBLE_EQ(points[0].minUs, 100);
  EXPECT_DOUBLE_EQ(points[0].maxUs, 140);
  EXPECT_FALSE(points[0].flagged);
  EXPECT_TRUE(points[1].flagged);  // 100 against 120: +20%
}

// ---- the measured rows (two H200) --------------------------------------------------------------------------

std::string dirOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// A file of perf/results/, found from this source file's path (the build passes it relative to the build
// directory), from the test binary's (build/tests/), or from the working directory (the source root, the build
// directory, or below it).
std::string readPerfResult(const std::string& name) {
  const std::string rel = "perf/results/" + name;
  char exe[4096] = {};
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  const std::string exeDir = len > 0 ? dirOf(std::string(exe, static_cast<size_t>(len))) : std::string(".");
  std::string tried;
  for (const std::string& path : {dirOf(__FILE__) + "/../" + rel, exeDir + "/../../" + rel, rel, "../" + rel,
                                  "../../" + rel, "../../../" + rel}) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      tried += " " + path;
      continue;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  ADD_FAILURE() << "cannot find " << rel << "; tried" << tried;
  return std::string();
}

TEST(CostModelCalibration, MeasuredTwoH200) {
  // The rows of perf/results/ (2x H200, bf16; nvlink and net regimes with NCCL baselines, quantize/dequantize
  // "local", NCCL-only baselines incl. shm), calibrated together as zpccl-model --calibrate does with both files.
  std::vector<PerfRow> rows;
  std::string error;
  for (const char* name : {"2026-11-30-h200x2.json", "2026-11-30-h200x2-baselines.json"})
    ASSERT_TRUE(parsePerfJson(readPerfResult(name), &rows, &error)) << name << ": " << error;
  ASSERT_EQ(rows.size(), 234u);
  const Calibration cal = calibrate(rows, KernelParams());
  int large = 0;
  for (const RowCheck& c : cal.checks) large += c.size >= kCheckMinBytes;
  EXPECT_EQ(cal.checks.size(), 330u);  // every row, and every zpccl row's NCCL baseline
  EXPECT_EQ(large, 220);

  // What the calibration finds (tools/model/cost_model.cc, "the formulas"), loosely: a change of the model that moves
  // these should be a deliberate one.
  const RegimeFit& nv = cal.regimes.at("nvlink");
  EXPECT_NEAR(nv.link.allGather.bwGBs, 260, 10);
  EXPECT_NEAR(nv.link.allGather.latencyUs, 23, 5);
  EXPECT_NEAR(cal.regimes.at("net").link.allGather.bwGBs, 3.06, 0.1);
  EXPECT_NEAR(cal.regimes.at("shm").link.allGather.bwGBs, 25.0, 0.5);
  EXPECT_NEAR(cal.kernel.quantizeInt8.rate, 2420, 100);  // int4 codes: ~10% slower per byte read + written
  EXPECT_NEAR(cal.kernel.quantizeInt4.rate, 2195, 100);
  EXPECT_LT(cal.kernel.quantizeInt4.rate, cal.kernel.quantizeInt8.rate);
  EXPECT_NEAR(cal.kernel.dequantize.rate, 3530, 150);
  EXPECT_NEAR(cal.kernel.copy.rate, 4130, 200);
  // G element-sources/s, ~7x slower per element than dequantize (the reduce kernel these files were recorded
  // with). With the links' small-message lines, the one-chunk 16 MiB qgZ rows do not over-price their ~4 MiB
  // all-to-all, which the reduce term would otherwise pay back.
  EXPECT_NEAR(cal.kernel.reduce.rate, 370, 40);
  EXPECT_NEAR(cal.pipeline.qwzOverlap, 0.41, 0.05);
  EXPECT_NEAR(cal.pipeline.qgzOverlap, 0.39, 0.05);
  // No row of these files ran in a green context: that overlap keeps its default, and only that is noted.
  EXPECT_EQ(cal.greenRows, 0);
  ASSERT_EQ(cal.notes.size(), 1u) << ::testing::PrintToString(cal.notes);
  EXPECT_NE(cal.notes[0].find("run in a green context (ZP_NCCL_SMS non-zero): that overlap keeps the given value"),
            std::string::npos)
      << cal.notes[0];

  // From 16 MiB up, 3 of the 220 checks miss by more than 15%, all three in the net regime (two processes over
  // NCCL's socket transport on one host), where the same collective at the same size measures up to 29% apart
  // from one run to the next; no model whose bandwidth does not fall with size fits all repetitions:
  //  - nccl_all_to_all net 64 MiB (baselines file): 12578 us, where the other file measured 16279 us for the same
  //    call; at 2.67 GB/s it beats every other net all-to-all (1.86 - 2.10 GB/s), and to be within 15% of it and
  //    of the 256 MiB rows the bandwidth would have to fall with size (>= 2.32 GB/s at 64 MiB, <= 2.19 at 256 MiB).
  //  - qwz_hpz_gathers int4 net 16 MiB, NCCL baseline: two 16 MiB all-gathers in 7229 us (3615 each); the six other
  //    measurements of that all-gather take 2802 - 3268 us (the int8 row's two: 6281 us).
  //  - qwz_hpz_gathers int4 net 16 MiB itself: 1182 us, -21.5% (the model: 928). The same quantized gather alone,
  //    qwz_all_gather int4 net 16 MiB in the same file, took 958 us (the model: 909, -5%), and the hpZ copy adds
  //    ~19 us: the two measurements of one call disagree by 21%. Since the links have small-message lines, its
  //    ~4 MiB all-gather is priced on the small line (NCCL's own 4 MiB net all-gathers: 787 - 950 us); on the large
  //    line it would be -10%, and that line over-prices the 1 - 4 MiB rows by up to 86%.
  //  The small-message lines also bring qwz_all_gather int8 net 16 MiB (1410 us, +22.9% on the large line) to
  //  +14.4%: the count stays 3.
  // Fitting these would mean fitting the noise of one run: the count is asserted instead.
  std::set<std::tuple<std::string, std::string, double, int>> flagged;
  for (const RowCheck& c : cal.checks)
    if (c.flagged) flagged.insert({c.what, c.regime, c.size, rows[c.row].bits});
  const std::set<std::tuple<std::string, std::string, double, int>> expected = {
      {"nccl_all_to_all", "net", 64.0 * 1024 * 1024, 0},
      {"qwz_hpz_gathers (nccl baseline)", "net", 16.0 * 1024 * 1024, 4},
      {"qwz_hpz_gathers", "net", 16.0 * 1024 * 1024, 4}};
  EXPECT_EQ(cal.flagged, 3);
  EXPECT_EQ(flagged, expected);
  EXPECT_LE(static_cast<double>(cal.flagged) / large, 0.014);
  // Every nvlink, shm and local row from 16 MiB up is within 15%.
  for (const RowCheck& c : cal.checks) {
    if (c.size >= kCheckMinBytes && c.regime != "net") {
      EXPECT_LE(std::fabs(c.errPct), kCheckMaxErrPct) << c.what << " " << c.regime << " " << c.size;
    }
  }
}

TEST(CostModelCalibration, MeasuredNcclPipelineRowsGiveTheDefaults) {
  // The calibration that KernelParams' and PipelineParams' defaults come from (zpccl-model --calibrate with these
  // three files): the defaults are its values, rounded.
  std::vector<PerfRow> rows;
  std::string error;
  for (const char* name : {"2026-11-30-h200x2-nvlink-shm-nccl-pipeline.json",
                           "2026-11-30-h200x2-net-nccl-pipeline.json", "2026-11-30-h200x2-baselines.json"})
    ASSERT_TRUE(parsePerfJson(readPerfResult(name), &rows, &error)) << name << ": " << error;
  ASSERT_EQ(rows.size(), 210u);
  const Calibration cal = calibrate(rows, KernelParams());
  const KernelParams d;
  EXPECT_NEAR(cal.kernel.quantizeInt8.rate, d.quantizeInt8.rate, 10);
  EXPECT_NEAR(cal.kernel.quantizeInt8.launchUs, d.quantizeInt8.launchUs, 0.1);
  EXPECT_NEAR(cal.kernel.quantizeInt4.rate, d.quantizeInt4.rate, 10);
  EXPECT_NEAR(cal.kernel.quantizeInt4.launchUs, d.quantizeInt4.launchUs, 0.1);
  EXPECT_NEAR(cal.kernel.dequantize.rate, d.dequantize.rate, 10);
  EXPECT_NEAR(cal.kernel.dequantize.launchUs, d.dequantize.launchUs, 0.1);
  EXPECT_NEAR(cal.kernel.reduce.rate, d.reduce.rate, 10);
  EXPECT_NEAR(cal.pipeline.qwzOverlap, PipelineParams().qwzOverlap, 0.005);
  EXPECT_NEAR(cal.pipeline.qgzOverlap, PipelineParams().qgzOverlap, 0.005);
  int large = 0;
  for (const RowCheck& c : cal.checks) large += c.size >= kCheckMinBytes;
  EXPECT_EQ(large, 188);
  // From 16 MiB up, 4 of 188 miss by more than 15%: four net rows (the run-to-run noise of NCCL's sockets, see
  // MeasuredTwoH200). qgZ and qwZ int4 over NVLink at 16 MiB (+21%, +15.5% with one line per link) are within 15%
  // since the links have small-message lines: both are one chunk, priced as what runs (quantize, NCCL, finish
  // kernel back to back on one stream), and their NCCL call moves a 4.3 MB payload, below the 16 MiB from which the
  // large lines are fitted: qgZ's all-to-all costs 35.7 us by the large line, 24.6 by the small one, where NCCL's
  // 4 MiB all-to-all measures 24.3 (the quantize row of the same bytes, 13.7 us, that all-to-all and the reduce add
  // up to the 44.5 us measured).
  EXPECT_TRUE(cal.regimes.at("nvlink").link.allToAll.hasSmallLine());
  std::set<std::tuple<std::string, std::string, double, int>> flagged;
  for (const RowCheck& c : cal.checks)
    if (c.flagged) flagged.insert({c.what, c.regime, c.size, rows[c.row].bits});
  const double mib16 = 16.0 * 1024 * 1024, mib64 = 64.0 * 1024 * 1024, mib256 = 256.0 * 1024 * 1024;
  const std::set<std::tuple<std::string, std::string, double, int>> expected = {
      {"nccl_all_to_all", "net", mib64, 0},
      {"nccl_all_to_all", "net", mib256, 0},
      {"qgz_reduce_scatter (nccl baseline)", "net", mib64, 4},
      {"qwz_all_gather (nccl baseline)", "net", mib64, 8}};
  EXPECT_EQ(cal.flagged, 4);
  int nvlink16 = 0;  // qwZ, qgZ (both widths) and their baselines
  for (const RowCheck& c : cal.checks) {
    if (c.regime != "nvlink" || c.size != mib16) continue;
    ++nvlink16;
    EXPECT_LE(std::fabs(c.errPct), kCheckMaxErrPct) << c.what << " int" << rows[c.row].bits;
  }
  EXPECT_GE(nvlink16, 8);
  EXPECT_EQ(flagged, expected);
  // The quantize rows are within 15% because each code width has its own rate (one rate for both would miss by +15%
  // and +17%).
  for (const RowCheck& c : cal.checks) {
    if (c.size >= kCheckMinBytes && c.regime == "local") {
      EXPECT_LE(std::fabs(c.errPct), kCheckMaxErrPct) << c.what << " " << c.size << " int" << rows[c.row].bits;
    }
  }
}

TEST(CostModelCalibration, MeasuredGreenContext) {
  // The files of PipelineParams' defaults with the green-context rows added (qwZ run with ZP_NCCL_SMS=32, the
  // library's default, over nvlink, shm and net): the green overlap is fitted from those 22 rows apart, and
  // the default qwzGreenOverlap is its value, rounded; the overlap with every SM stays the default's.
  std::vector<PerfRow> rows;
  std::string error;
  for (const char* name :
       {"2026-11-30-h200x2-nvlink-shm-nccl-pipeline.json", "2026-11-30-h200x2-net-nccl-pipeline.json",
        "2026-11-30-h200x2-baselines.json", "2026-11-30-h200x2-nvlink-shm-green-context.json",
        "2026-11-30-h200x2-net-green-context.json"})
    ASSERT_TRUE(parsePerfJson(readPerfResult(name), &rows, &error)) << name << ": " << error;
  ASSERT_EQ(rows.size(), 254u);
  const Calibration cal = calibrate(rows, KernelParams());
  EXPECT_EQ(cal.greenRows, 22);
  EXPECT_EQ(cal.qwzGreenOverlapFit.points, 22);
  EXPECT_NEAR(cal.pipeline.qwzGreenOverlap, PipelineParams().qwzGreenOverlap, 0.005);
  EXPECT_NEAR(cal.pipeline.qwzOverlap, PipelineParams().qwzOverlap, 0.005);
  EXPECT_GT(cal.pipeline.qwzGreenOverlap, cal.pipeline.qwzOverlap + 0.1);
  EXPECT_TRUE(anyMentions(cal.notes, "22 row(s) of quantized gathers run in a green context"))
      << ::testing::PrintToString(cal.notes);
  // Each green row from 16 MiB up is within 15% at the green overlap (worst: net int8 1 GiB, +11.9%; nvlink int4
  // 16 MiB, one chunk, +10.2% with the small-message line, +14.5% without), and the green rows together fit better
  // than at the overlap with every SM.
  PipelineParams everySm = cal.pipeline;
  everySm.qwzGreenOverlap = everySm.qwzOverlap;
  double sqGreen = 0, sqEverySm = 0;
  int green = 0;
  for (const RowCheck& c : cal.checks) {
    const PerfRow& row = rows[c.row];
    if (!isGreenContextRow(row) || c.what != row.op || c.size < kCheckMinBytes) continue;
    ++green;
    EXPECT_LE(std::fabs(c.errPct), kCheckMaxErrPct) << c.what << " " << c.regime << " " << c.size << " " << row.bits;
    const double other = predictRowUs(row, false, cal.regimes.at(c.regime).link, cal.kernel, everySm);
    sqGreen += c.errPct * c.errPct;
    sqEverySm += std::pow(100 * (other - c.measuredUs) / c.measuredUs, 2);
  }
  EXPECT_EQ(green, 22);
  EXPECT_LT(sqGreen, 0.8 * sqEverySm);

  // The qgZ rows of -qgz-channels.json record ZP_NCCL_SMS=32 too: qgZ never uses the green context, so they are
  // calibrated and checked as any qgZ row (8 rows and their 8 NCCL baselines). Only their configuration is asserted
  // here: this file is known-bad for absolute calibration (its machine ran NVLink at half speed, its rows are ~2.2x
  // slower in absolute time), so no fitted value or error of it is.
  std::vector<PerfRow> qgz;
  ASSERT_TRUE(parsePerfJson(readPerfResult("2026-11-30-h200x2-qgz-channels.json"), &qgz, &error)) << error;
  ASSERT_EQ(qgz.size(), 8u);
  for (const PerfRow& r : qgz) {
    EXPECT_EQ(rowNcclSms(r), 32);
    EXPECT_FALSE(isGreenContextRow(r));
  }
  rows.insert(rows.end(), qgz.begin(), qgz.end());
  const Calibration all = calibrate(rows, KernelParams());
  EXPECT_EQ(all.greenRows, 22);
  int checked = 0;
  for (const RowCheck& c : all.checks) checked += c.row >= rows.size() - qgz.size();
  EXPECT_EQ(checked, 16);
  EXPECT_EQ(all.qgzOverlapFit.points, cal.qgzOverlapFit.points + 8);
}

TEST(CostModelCalibration, MeasuredPairExchange) {
  // The five files of one machine (MeasuredGreenContext's) and the qgZ pair-exchange rows:
  // -qgz-pair-gather-always.json (ZP_PAIR_ALLGATHER=1: every two-rank exchange gathers, over net, shm and nvlink)
  // and -qgz-pair-gather-across-nodes.json (=2, the default: the net rows, two nodes, gather; the nvlink rows, one
  // node, send/recv). These two ran on other machines, whose absolute speeds may differ. -qgz-channels.json is left
  // out: its machine ran NVLink at half speed and its rows are ~2.2x slower in absolute time (known-bad for absolute
  // calibration).
  std::vector<PerfRow> rows;
  std::string error;
  const char* five[] = {"2026-11-30-h200x2-nvlink-shm-nccl-pipeline.json", "2026-11-30-h200x2-net-nccl-pipeline.json",
                        "2026-11-30-h200x2-baselines.json", "2026-11-30-h200x2-nvlink-shm-green-context.json",
                        "2026-11-30-h200x2-net-green-context.json"};
  for (const char* name : five)
    ASSERT_TRUE(parsePerfJson(readPerfResult(name), &rows, &error)) << name << ": " << error;
  ASSERT_EQ(rows.size(), 254u);
  const Calibration cal5 = calibrate(rows, KernelParams());
  const size_t first = rows.size();
  for (const char* name :
       {"2026-11-30-h200x2-qgz-pair-gather-always.json", "2026-11-30-h200x2-qgz-pair-gather-across-nodes.json"})
    ASSERT_TRUE(parsePerfJson(readPerfResult(name), &rows, &error)) << name << ": " << error;
  ASSERT_EQ(rows.size(), first + 18 + 12);
  int gatherRows = 0;
  for (size_t i = first; i < rows.size(); ++i) {
    const PerfRow& r = rows[i];
    ASSERT_EQ(classifyOp(r.op), RowKind::kQgz);
    const int mode = i < first + 18 ? 1 : 2;
    EXPECT_EQ(rowPairAllGather(r), mode);
    EXPECT_EQ(usesPairGather(r), mode == 1 || r.nodes == 2) << r.regime;
    gatherRows += usesPairGather(r);
  }
  EXPECT_EQ(gatherRows, 18 + 6);
  const Calibration cal = calibrate(rows, KernelParams());

  // The all-to-all lines are fitted from NCCL's all-to-all rows alone: the qgZ rows' exchanges, on whichever line
  // they run, do not move them.
  for (const auto& entry : cal5.regimes) {
    const LinkCost& a = entry.second.link.allToAll;
    const LinkCost& b = cal.regimes.at(entry.first).link.allToAll;
    EXPECT_DOUBLE_EQ(a.bwGBs, b.bwGBs) << entry.first;
    EXPECT_DOUBLE_EQ(a.latencyUs, b.latencyUs) << entry.first;
    EXPECT_DOUBLE_EQ(a.smallBwGBs, b.smallBwGBs) << entry.first;
  }

  // Each pair-exchange qgZ row is within 15% but one: across-nodes net int4 1 GiB, 35.4 ms (+31%), where the
  // gather-always file measured 44.5 ms for the same call (both gather over net) and NCCL's reduce-scatter next to
  // it took 132.5 ms against 170.0: a fast run. Averaged, that point is +16%.
  const LinkParams& net = cal.regimes.at("net").link;
  for (const RowCheck& c : cal.checks) {
    if (c.row < first || c.baseline) continue;
    const PerfRow& r = rows[c.row];
    const bool fastRun = c.row >= first + 18 && r.regime == "net" && r.bits == 4 && r.size == 1024.0 * 1024 * 1024;
    EXPECT_EQ(c.flagged, fastRun) << r.regime << " " << r.size << " int" << r.bits << " " << c.errPct << "%";
    if (r.regime != "net") continue;
    // Priced on the all-to-all line (send/recv, ZP_PAIR_ALLGATHER=0), the same rows would be 20% and more
    // too slow: the gather runs at NCCL's all-gather line.
    PerfRow sendRecv = r;
    sendRecv.env["ZP_PAIR_ALLGATHER"] = "0";
    const double old = predictRowUs(sendRecv, false, net, cal.kernel, cal.pipeline);
    EXPECT_GT(100 * (old - c.measuredUs) / c.measuredUs, 20) << r.size << " int" << r.bits;
  }
  // Over NVLink the model prices the gather slower than send/recv (the all-gather line is the slower there, and the
  // copy adds), as measured: the reason the default gathers across nodes only.
  for (size_t i = first; i < rows.size(); ++i) {
    if (rows[i].regime != "nvlink") continue;
    PerfRow other = rows[i];
    other.env["ZP_PAIR_ALLGATHER"] = rowPairAllGather(rows[i]) == 1 ? "2" : "1";
    const LinkParams& nv = cal.regimes.at("nvlink").link;
    const double here = predictRowUs(rows[i], false, nv, cal.kernel, cal.pipeline);
    const double there = predictRowUs(other, false, nv, cal.kernel, cal.pipeline);
    EXPECT_EQ(here > there, rowPairAllGather(rows[i]) == 1) << rows[i].size << " int" << rows[i].bits;
  }

  // Together: 329 of 336 rows from 16 MiB up within 15%; the misses are net rows whose repeats disagree (the five
  // files' three, the 1 GiB reduce-scatter of net-green-context.json at -15.0%, and the across-nodes file's fast
  // run: its qgZ int4 1 GiB row and its two large NCCL baselines). Averaged per measured point, 3 of 164 miss:
  // NCCL's net all-to-all at 64 and 256 MiB (one measurement each in these files) and the fast run's point.
  int large = 0;
  for (const RowCheck& c : cal.checks) large += c.size >= kCheckMinBytes;
  EXPECT_EQ(large, 336);
  EXPECT_EQ(cal.flagged, 7);
  for (const RowCheck& c : cal.checks) {
    if (c.flagged) {
      EXPECT_EQ(c.regime, "net") << c.what << " " << c.size;
    }
  }
  int largePoints = 0;
  for (const PointCheck& p : cal.points) largePoints += p.size >= kCheckMinBytes;
  EXPECT_EQ(largePoints, 164);
  EXPECT_EQ(cal.pointsFlagged, 3);
  EXPECT_EQ(cal5.flagged, 4);
  EXPECT_EQ(cal5.pointsFlagged, 2);
  // The fits (loosely): the overlaps are the five files' where the new rows do not reach them.
  EXPECT_NEAR(cal.pipeline.qwzOverlap, cal5.pipeline.qwzOverlap, 1e-9);
  EXPECT_NEAR(cal.pipeline.qwzGreenOverlap, cal5.pipeline.qwzGreenOverlap, 1e-9);
  EXPECT_NEAR(cal.pipeline.qgzOverlap, 0.61, 0.03);
  EXPECT_NEAR(cal.kernel.reduce.rate, 1360, 100);
  EXPECT_EQ(cal.qgzOverlapFit.points, cal5.qgzOverlapFit.points + 30);
}

}  // namespace
}  // namespace zp
