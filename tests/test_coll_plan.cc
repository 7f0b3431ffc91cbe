// The plans of the collectives (host/coll_plan.h), for every layout, link and size class around the tunables'
// thresholds: the decisions that only GPU runs would otherwise see. The expected plans come from the rules as the
// README states them (quoted where they are used), in hand-computed cases and in a sweep that derives each plan
// from those rules on its own.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "host/all_reduce_shards.h"
#include "host/base/params.h"
#include "host/chunk_plan.h"
#include "host/coll_plan.h"
#include "host/quant_format.h"
#include "host/topology.h"
#include "tests/child_test.h"

namespace zp {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kOffset = 256;  // the window's flag bytes in these tests

// The README's defaults (Tunables and logging).
PlanTunables readmeDefaults() {
  PlanTunables t;
  t.chunkBytes = 0;  // 64 MiB
  t.maxChunks = 8;
  t.chunkRamp = false;
  t.pairAllGather = 2;
  t.directMinBytes = 0;
  t.directInlineWaitBytes = 4 << 20;
  t.ownSlotEarlyBytes = 16 << 20;
  return t;
}

// The links of the regimes: one node over NVLink (direct loads usable or not), one node over host shared memory on
// ZP_SHM_MIN_CTAS channels, and sockets (several nodes: none of the three facts holds).
LinkFacts nvlink(bool direct = true) { return LinkFacts{false, direct, true}; }
LinkFacts shm() { return LinkFacts{true, false, true}; }
LinkFacts sockets() { return LinkFacts{false, false, true}; }

// Node-major keys of a layout with gpus[i] ranks on node i.
std::vector<uint64_t> keysOf(const std::vector<int>& gpus) {
  std::vector<uint64_t> keys;
  for (size_t node = 0; node < gpus.size(); ++node)
    for (int g = 0; g < gpus[node]; ++g) keys.push_back(7000 + node);
  return keys;
}

Topology topologyOf(const std::vector<int>& gpus, int rank, int hpz = 0) {
  Topology t;
  EXPECT_EQ(buildTopology(keysOf(gpus), rank, hpz, "test", &t), zpSuccess);
  return t;
}

struct Call {
  CollKind kind = CollKind::kQuantAllGather;
  size_t count = 0;
  size_t elemBytes = 2;
  int bits = 8;
  int blockSize = 256;
};

CollPlan plan(const Topology& t, const Call& c, const LinkFacts& link, const PlanTunables& tu = readmeDefaults(),
              const WindowFacts& w = WindowFacts{0, false, kOffset}) {
  PlanFacts f;
  f.topo = &t;
  f.tunables = tu;
  f.link = link;
  f.window = w;
  f.kind = c.kind;
  f.count = c.count;
  f.elemBytes = c.elemBytes;
  f.bits = c.bits;
  f.blockSize = c.blockSize;
  return planCollective(f);
}

Call qwz(size_t count, int bits = 8) { return Call{CollKind::kQuantAllGather, count, 2, bits, 256}; }
Call hpz(size_t count, int bits) { return Call{CollKind::kHierAllGather, count, 2, bits, 256}; }
Call qgz(size_t count, int bits = 4) { return Call{CollKind::kQuantReduceScatter, count, 2, bits, 256}; }

size_t payload(size_t count, int bits, int blockSize = 256) { return quantPayloadBytes(count, bits, blockSize); }

// ---- hand-computed cases ------------------------------------------------------------------------------------

TEST(CollPlan, DirectLoadsFromTheThresholdUpAndInlineWaitsUpToTheirs) {
  // "qwZ, hpZ's quantized gather over the whole communicator and one-hop qgZ of at least ZP_DIRECT_MIN_BYTES
  // (default: every size) read the peers' payloads straight from their memory"; "direct-load calls up to
  // [ZP_DIRECT_INLINE_WAIT_BYTES] wait for the peers inside their two kernels".
  const Topology t = topologyOf({2}, 0);
  // 2^20 elements x 2 ranks x 2 bytes = 4 MiB: direct, waits inside.
  CollPlan p = plan(t, qwz(1 << 20), nvlink());
  EXPECT_EQ(p.path, PlanPath::kDirect);
  EXPECT_TRUE(p.inlineWaits);
  EXPECT_EQ(p.logicalBytes, 4 * kMiB);
  EXPECT_EQ(p.windowBytes, kOffset + 16384 + 1048576);  // its one payload: 4096 blocks' scales, the codes
  EXPECT_EQ(p.hops, 0);
  EXPECT_EQ(p.chunks.chunks, 1);
  EXPECT_EQ(p.scratchBytes[0] + p.scratchBytes[1], 0u);
  // One block more: past 4 MiB, the waits in kernels of their own.
  EXPECT_FALSE(plan(t, qwz((1 << 20) + 256), nvlink()).inlineWaits);
  // qgZ's window holds the n slots of each rank.
  p = plan(t, qgz(1 << 20), nvlink());
  EXPECT_EQ(p.path, PlanPath::kDirect);
  EXPECT_EQ(p.windowBytes, kOffset + 2 * (16384 + 524288));

  // ZP_DIRECT_MIN_BYTES = 8 MiB: 4 MiB calls take NCCL's path, 8 MiB ones the direct one; -1: none.
  PlanTunables tu = readmeDefaults();
  tu.directMinBytes = 8 << 20;
  EXPECT_EQ(plan(t, qwz(1 << 20), nvlink(), tu).path, PlanPath::kOneHop);
  EXPECT_EQ(plan(t, qwz(1 << 21), nvlink(), tu).path, PlanPath::kDirect);
  EXPECT_EQ(plan(t, qwz((1 << 21) - 256), nvlink(), tu).path, PlanPath::kOneHop);
  tu.directMinBytes = -1;
  EXPECT_EQ(plan(t, qwz(1 << 30), nvlink(), tu).path, PlanPath::kOneHop);
  // Without direct loads (NCCL_P2P_DISABLE, another node, one rank...), never.
  EXPECT_EQ(plan(t, qwz(1 << 20), nvlink(false)).path, PlanPath::kOneHop);
}

TEST(CollPlan, AFrozenWindowServesOnlyTheCallsItHolds) {
  // "a later call too large for it leaves it as it is, on every rank, and takes NCCL's path".
  const Topology t = topologyOf({4}, 2);
  const size_t need = kOffset + payload(1 << 20, 8);
  EXPECT_EQ(plan(t, qwz(1 << 20), nvlink(), readmeDefaults(), WindowFacts{need, true, kOffset}).path,
            PlanPath::kDirect);
  EXPECT_EQ(plan(t, qwz(1 << 20), nvlink(), readmeDefaults(), WindowFacts{need - 16, true, kOffset}).path,
            PlanPath::kOneHop);
  // Not frozen, the window grows to what the call needs.
  const CollPlan grows = plan(t, qwz(1 << 20), nvlink(), readmeDefaults(), WindowFacts{need - 16, false, kOffset});
  EXPECT_EQ(grows.path, PlanPath::kDirect);
  EXPECT_EQ(grows.windowBytes, need);
}

TEST(CollPlan, HpzQuantizedIsDirectOnlyOverTheWholeCommunicator) {
  // One node of 4 over NVLink: the hpZ group of the whole node is the world; a group of 2 is not.
  const CollPlan whole = plan(topologyOf({4}, 1), hpz(1 << 20, 8), nvlink());
  EXPECT_EQ(whole.path, PlanPath::kDirect);
  EXPECT_EQ(whole.group, PlanComm::kHpz);
  EXPECT_EQ(whole.ranks, 4);
  const CollPlan half = plan(topologyOf({4}, 3, 2), hpz(1 << 20, 8), nvlink());
  EXPECT_EQ(half.path, PlanPath::kOneHop);
  EXPECT_EQ(half.ranks, 2);
  EXPECT_EQ(half.rank, 1);
  EXPECT_EQ(half.hop[0].comm, PlanComm::kHpz);
  EXPECT_EQ(half.logicalBytes, 2 * 2 * (size_t{1} << 20));
  // Without bits hpZ is exact, whatever the links: one all-gather of the shards as they are, not chunked.
  const CollPlan exact = plan(topologyOf({2, 2}, 3), hpz(size_t{1} << 30, 0), sockets());
  EXPECT_EQ(exact.path, PlanPath::kExact);
  EXPECT_EQ(exact.hops, 1);
  EXPECT_EQ(exact.hop[0].exchange, Exchange::kAllGather);
  EXPECT_EQ(exact.hop[0].comm, PlanComm::kHpz);
  EXPECT_EQ(exact.hop[0].peers, 2);
  EXPECT_EQ(exact.chunks.chunks, 1);
  EXPECT_FALSE(exact.ownEarly());
  EXPECT_EQ(exact.scratchBytes[0] + exact.scratchBytes[1], 0u);
}

TEST(CollPlan, OneHopAcrossTwoNodesIsThePairLayoutFromTheOwnSlotThreshold) {
  // Two nodes of one GPU (sockets), qgZ int4: recvcount 2^22 x 2 ranks x 2 bytes = 16 MiB, ZP_OWN_SLOT_EARLY_BYTES.
  // "one-hop qgZ quantizes the slice it keeps ... (a call of one chunk does it on a side stream)"; between two
  // ranks on different nodes ZP_PAIR_ALLGATHER=2 gathers; the pair then "receives into three slots".
  const size_t pb = 65536 + 2097152;
  for (int rank : {0, 1}) {
    const CollPlan p = plan(topologyOf({1, 1}, rank), qgz(1 << 22), sockets());
    EXPECT_EQ(p.path, PlanPath::kOneHop);
    EXPECT_EQ(p.chunks.chunks, 1);
    EXPECT_EQ(p.ownSlot, OwnSlot::kSideStream);
    EXPECT_TRUE(p.ownInGreen);  // a green context exists: the side stream's kernels leave NCCL its SMs
    EXPECT_FALSE(p.greenStages);
    EXPECT_EQ(p.hop[0].exchange, Exchange::kPairGatherInPlace);
    EXPECT_EQ(p.recv.slots, 3);
    EXPECT_EQ(p.recv.keptSlot, 2 * rank);
    EXPECT_EQ(p.recv.sourceStride, 2);
    EXPECT_EQ(p.scratchBytes[0], 2 * pb);
    EXPECT_EQ(p.scratchBytes[1], 3 * pb);
  }
  // One block less: below the threshold, the pair's gather and its copy, two receive slots.
  const CollPlan below = plan(topologyOf({1, 1}, 1), qgz((1 << 22) - 256), sockets());
  EXPECT_EQ(below.ownSlot, OwnSlot::kWithTheOthers);
  EXPECT_EQ(below.hop[0].exchange, Exchange::kPairGather);
  EXPECT_EQ(below.recv.slots, 2);
  EXPECT_EQ(below.recv.keptSlot, -1);
  // ZP_PAIR_ALLGATHER=0: the kept slice early, the peer's by send/recv, this rank's slot not sent.
  PlanTunables tu = readmeDefaults();
  tu.pairAllGather = 0;
  const CollPlan sent = plan(topologyOf({1, 1}, 1), qgz(1 << 22), sockets(), tu);
  EXPECT_EQ(sent.hop[0].exchange, Exchange::kSendRecv);
  EXPECT_TRUE(sent.hop[0].withoutSelf);
  EXPECT_EQ(sent.recv.slots, 2);
  EXPECT_EQ(sent.recv.keptSlot, 1);
  // ZP_OWN_SLOT_EARLY_BYTES=-1: never early.
  tu = readmeDefaults();
  tu.ownSlotEarlyBytes = -1;
  EXPECT_EQ(plan(topologyOf({1, 1}, 0), qgz(1 << 26), sockets(), tu).ownSlot, OwnSlot::kWithTheOthers);
}

TEST(CollPlan, OneNodeOfTwoGathersOverSharedMemorySendsOverNvlink) {
  // "2 as one ncclAllGather ... when they ... share host memory on ZP_SHM_MIN_CTAS channels, ncclSend/ncclRecv
  // over NVLink (faster there); 1 always the all-gather; 0 never".
  const Topology t = topologyOf({2}, 0);
  for (int mode : {0, 1, 2}) {
    PlanTunables tu = readmeDefaults();
    tu.pairAllGather = mode;
    const Exchange overShm = plan(t, qgz(1 << 20), shm(), tu).hop[0].exchange;
    const Exchange overNvlink = plan(t, qgz(1 << 20), nvlink(false), tu).hop[0].exchange;
    EXPECT_EQ(overShm, mode != 0 ? Exchange::kPairGather : Exchange::kSendRecv) << mode;
    EXPECT_EQ(overNvlink, mode == 1 ? Exchange::kPairGather : Exchange::kSendRecv) << mode;
  }
  // Over NVLink nothing is worked early, whatever the size ("NVLink keeps the plain pipeline").
  EXPECT_EQ(plan(t, qgz(1 << 28), nvlink(false)).ownSlot, OwnSlot::kWithTheOthers);
  EXPECT_EQ(plan(t, qwz(1 << 28), nvlink(false)).ownSlot, OwnSlot::kWithTheOthers);
  // More than two ranks never gather, whatever the mode.
  PlanTunables always = readmeDefaults();
  always.pairAllGather = 1;
  EXPECT_EQ(plan(topologyOf({4}, 0), qgz(1 << 20), shm(), always).hop[0].exchange, Exchange::kSendRecv);
}

TEST(CollPlan, TwoHopsPairTheirExchangesByTheirLinks) {
  // 2 nodes x 2: hop 1 inside the node (N = 2 slots to the local peer, move stage), hop 2 across nodes (finish
  // stage). Mode 2 gathers only across nodes, 1 both, 0 neither. Nothing is worked early on two hops.
  for (int mode : {0, 1, 2}) {
    PlanTunables tu = readmeDefaults();
    tu.pairAllGather = mode;
    const CollPlan p = plan(topologyOf({2, 2}, 3), qgz(1 << 26), sockets(), tu);
    EXPECT_EQ(p.path, PlanPath::kTwoHops);
    ASSERT_EQ(p.hops, 2);
    EXPECT_EQ(p.hop[0].comm, PlanComm::kIntra);
    EXPECT_EQ(p.hop[0].peers, 2);
    EXPECT_EQ(p.hop[0].self, 1);
    EXPECT_EQ(p.hop[0].slotsPerPeer, 2);
    EXPECT_FALSE(p.hop[0].onFinishStage);
    EXPECT_EQ(p.hop[1].comm, PlanComm::kInter);
    EXPECT_EQ(p.hop[1].peers, 2);
    EXPECT_EQ(p.hop[1].self, 1);
    EXPECT_EQ(p.hop[1].slotsPerPeer, 1);
    EXPECT_TRUE(p.hop[1].onFinishStage);
    EXPECT_EQ(p.hop[0].exchange, mode == 1 ? Exchange::kPairGather : Exchange::kSendRecv) << mode;
    EXPECT_EQ(p.hop[1].exchange, mode != 0 ? Exchange::kPairGather : Exchange::kSendRecv) << mode;
    EXPECT_EQ(p.ownSlot, OwnSlot::kWithTheOthers);  // 1 GiB, over sockets
    EXPECT_EQ(p.recv.slots, 4);
  }
  // 3 nodes x 2: the inter-node hop has three peers, never a pair; 2 nodes x 4: the intra-node hop has four.
  PlanTunables always = readmeDefaults();
  always.pairAllGather = 1;
  const CollPlan three = plan(topologyOf({2, 2, 2}, 4), qgz(1 << 20), sockets(), always);
  EXPECT_EQ(three.hop[0].exchange, Exchange::kPairGather);
  EXPECT_EQ(three.hop[1].exchange, Exchange::kSendRecv);
  EXPECT_EQ(three.hop[0].slotsPerPeer, 3);
  EXPECT_EQ(three.hop[1].self, 2);
  const CollPlan wide = plan(topologyOf({4, 4}, 5), qgz(1 << 20), sockets(), always);
  EXPECT_EQ(wide.hop[0].exchange, Exchange::kSendRecv);
  EXPECT_EQ(wide.hop[1].exchange, Exchange::kPairGather);
  EXPECT_EQ(wide.hop[0].self, 1);
  EXPECT_EQ(wide.hop[1].self, 1);
}

TEST(CollPlan, UnevenNodesTakeOneFlatHop) {
  // "On uneven nodes qgZ falls back to one flat hop": nodes of 2 and 1, three ranks in one all-to-all across
  // nodes, a slow link: the kept slice early from 16 MiB (3 ranks x 2 bytes x recvcount).
  const Topology t = topologyOf({2, 1}, 1);
  const CollPlan small = plan(t, qgz(1 << 20), sockets());
  EXPECT_EQ(small.path, PlanPath::kFlat);
  EXPECT_EQ(small.hop[0].exchange, Exchange::kSendRecv);
  EXPECT_EQ(small.hop[0].peers, 3);
  EXPECT_FALSE(small.hop[0].withoutSelf);
  const size_t early = (size_t{16} << 20) / 6 + 1;  // the smallest count of at least 16 MiB
  const CollPlan large = plan(t, qgz(early), sockets());
  EXPECT_EQ(large.ownSlot, OwnSlot::kSideStream);
  EXPECT_TRUE(large.hop[0].withoutSelf);
  EXPECT_EQ(large.recv.keptSlot, 1);
  EXPECT_EQ(plan(t, qgz(early - 1), sockets()).ownSlot, OwnSlot::kWithTheOthers);
  // The gathers have no hierarchy to fall back from: one hop.
  EXPECT_EQ(plan(t, qwz(1 << 20), sockets()).path, PlanPath::kOneHop);
}

TEST(CollPlan, GreenContextForTheGathersPipelines) {
  // "SMs that the quantized gathers' (qwZ, hpZ with bits) kernels leave free for NCCL"; qgZ keeps every SM; a call
  // of one chunk runs on the caller's stream.
  const Topology t = topologyOf({4}, 0);
  const CollPlan one = plan(t, qwz(1 << 23), shm());  // 64 MiB: one chunk
  EXPECT_EQ(one.chunks.chunks, 1);
  EXPECT_FALSE(one.greenStages);
  EXPECT_EQ(one.ownSlot, OwnSlot::kSideStream);
  EXPECT_TRUE(one.ownInGreen);
  const CollPlan two = plan(t, qwz(1 << 24), shm());  // 128 MiB: two chunks
  EXPECT_EQ(two.chunks.chunks, 2);
  EXPECT_TRUE(two.greenStages);
  EXPECT_EQ(two.ownSlot, OwnSlot::kFinishStage);
  EXPECT_TRUE(two.ownInGreen);
  LinkFacts noGreen = shm();
  noGreen.greenContext = false;
  const CollPlan plain = plan(t, qwz(1 << 24), noGreen);
  EXPECT_FALSE(plain.greenStages);
  EXPECT_FALSE(plain.ownInGreen);
  EXPECT_FALSE(plan(t, qwz(1 << 23), noGreen).ownInGreen);
  const CollPlan q = plan(t, qgz(1 << 24), shm());
  EXPECT_EQ(q.chunks.chunks, 2);
  EXPECT_FALSE(q.greenStages);
  EXPECT_EQ(q.ownSlot, OwnSlot::kFinishStage);
  EXPECT_FALSE(q.ownInGreen);                            // the finish stage of qgZ uses every SM
  EXPECT_TRUE(plan(t, qgz(1 << 21), shm()).ownInGreen);  // 16 MiB, one chunk: its side stream is green
}

TEST(CollPlan, ChunksFollowChunkBytesAndMaxChunks) {
  // "ZP_CHUNK_BYTES: logical bytes per pipeline chunk (64 MiB); ZP_MAX_CHUNKS: most pipeline chunks per call (8)";
  // no more than 16 in any case (the events a communicator has). qwZ over two nodes: 2^28 x 2 x 2 = 1 GiB.
  const Topology t = topologyOf({1, 1}, 0);
  EXPECT_EQ(plan(t, qwz(1 << 28), sockets()).chunks.chunks, 8);
  EXPECT_EQ(plan(t, qwz(1 << 24), sockets()).chunks.chunks, 1);          // 64 MiB
  EXPECT_EQ(plan(t, qwz((1 << 25) - 256), sockets()).chunks.chunks, 1);  // just under 128 MiB
  EXPECT_EQ(plan(t, qwz(1 << 25), sockets()).chunks.chunks, 2);
  PlanTunables tu = readmeDefaults();
  tu.maxChunks = 16;
  EXPECT_EQ(plan(t, qwz(1 << 28), sockets(), tu).chunks.chunks, 16);
  tu.maxChunks = 64;  // outside ZP_MAX_CHUNKS's range, still at most the events' 16
  EXPECT_EQ(plan(t, qwz(1 << 29), sockets(), tu).chunks.chunks, 16);
  tu = readmeDefaults();
  tu.chunkBytes = 256 << 20;
  const CollPlan p = plan(t, qwz(1 << 28), sockets(), tu);
  ASSERT_EQ(p.chunks.chunks, 4);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(p.chunks.elems(c), size_t{1} << 26);
  // The scratch of a pipelined gather: every rank's slot of every chunk.
  EXPECT_EQ(p.scratchBytes[0], 4 * 2 * payload(size_t{1} << 26, 8));
  EXPECT_EQ(p.scratchBytes[1], 0u);
  tu.chunkRamp = true;  // ZP_CHUNK_RAMP: half-size first and last chunks
  const CollPlan ramp = plan(t, qwz(1 << 28), sockets(), tu);
  EXPECT_EQ(ramp.chunks.elems(0) * 2, ramp.chunks.elems(1));
}

TEST(CollPlan, OneRankPlansAnExchangeWithItself) {
  const Topology t = topologyOf({1}, 0);
  const CollPlan g = plan(t, qwz(1 << 20), LinkFacts{});
  EXPECT_EQ(g.path, PlanPath::kOneHop);
  EXPECT_EQ(g.ranks, 1);
  EXPECT_EQ(g.hop[0].exchange, Exchange::kAllGather);
  const CollPlan q = plan(t, qgz(1 << 26), LinkFacts{});
  EXPECT_EQ(q.path, PlanPath::kOneHop);
  EXPECT_EQ(q.hop[0].exchange, Exchange::kSendRecv);
  EXPECT_FALSE(q.hop[0].withoutSelf);
  EXPECT_EQ(q.ownSlot, OwnSlot::kWithTheOthers);
  const CollPlan h = plan(t, hpz(1 << 20, 0), LinkFacts{});
  EXPECT_EQ(h.path, PlanPath::kExact);
  EXPECT_EQ(h.ranks, 1);
}

// The all-reduce's two calls (host/all_reduce_shards.h) as an all-reduce of `count` bf16 elements on `t` makes them
// (in place, or into the padded copy at kPadded), and their plans.
struct AllReducePlans {
  AllReduceSteps steps;
  CollPlan reduceScatter, gather;
};
char* const kTensor = reinterpret_cast<char*>(uintptr_t{1} << 32);
char* const kPadded = reinterpret_cast<char*>(uintptr_t{1} << 40);

CollArgs allReduceArgs(const void* send, void* recv, size_t count, zpDataType_t type, int bits, int blockSize) {
  return CollArgs{
      "zpQuantAllReduce", CollKind::kQuantAllReduce, send, recv, count, type, zpSum, bits, blockSize, nullptr,
      GradArgs()};
}

AllReducePlans allReducePlans(const Topology& t, size_t count, const LinkFacts& link, int bits = 4,
                              int blockSize = 256) {
  const CollArgs a = allReduceArgs(kTensor, kTensor, count, zpBfloat16, bits, blockSize);
  AllReducePlans out;
  out.steps = allReduceSteps(a, t.nranks, t.rank, kTensor, nullptr);
  if (out.steps.padded) out.steps = allReduceSteps(a, t.nranks, t.rank, kPadded, nullptr);
  for (auto [step, into] :
       {std::pair{&out.steps.reduceScatter, &out.reduceScatter}, std::pair{&out.steps.gather, &out.gather}}) {
    PlanFacts f = planFactsOf(t, *step);
    f.tunables = readmeDefaults();
    f.link = link;
    f.window = WindowFacts{0, false, kOffset};
    *into = planCollective(f);
  }
  return out;
}

TEST(CollPlan, AllReduceIsQgzThenAGatherOfItsShardsEachPlannedAlone) {
  // include/zpccl.h: "qgZ's reduce-scatter over the shards, then the all-gather of the reduced shards, in qwZ's
  // format", shards of "ceil(ceil(count / n) / G) * G" elements; the tensor worked in place when it is n whole
  // shards, else in a copy padded with zeros. Each call is planned as a call of its own: the reduce-scatter as qgZ
  // in NCCL's in-place layout, the gather in place, always to nearest, as qwZ except on nodes of several ranks.
  const AllReducePlans one = allReducePlans(topologyOf({4}, 1), 1000, nvlink());
  EXPECT_EQ(one.steps.shardCount, 256u);
  EXPECT_EQ(one.steps.paddedCount, 1024u);
  EXPECT_TRUE(one.steps.padded);
  const CollArgs& rs = one.steps.reduceScatter;
  const CollArgs& ag = one.steps.gather;
  EXPECT_EQ(rs.kind, CollKind::kQuantReduceScatter);
  EXPECT_EQ(ag.kind, CollKind::kQuantAllGather);
  EXPECT_EQ(rs.count, 256u);
  EXPECT_EQ(ag.count, 256u);
  EXPECT_EQ(rs.sendbuff, kPadded);
  EXPECT_EQ(rs.recvbuff, kPadded + 256 * 2);
  EXPECT_EQ(ag.sendbuff, rs.recvbuff);
  EXPECT_EQ(ag.recvbuff, kPadded);
  EXPECT_STREQ(ag.opName, "zpQuantAllReduce");
  EXPECT_TRUE(one.reduceScatter.inPlace);
  EXPECT_TRUE(one.gather.inPlace);
  EXPECT_EQ(one.reduceScatter.kind, CollKind::kQuantReduceScatter);
  EXPECT_EQ(one.gather.kind, CollKind::kQuantAllGather);
  EXPECT_EQ(one.reduceScatter.logicalBytes, 1024u * 2);
  // On one NVLink node both may load from the peers, as qgZ and qwZ alone do.
  EXPECT_EQ(one.reduceScatter.path, PlanPath::kDirect);
  EXPECT_EQ(one.gather.path, PlanPath::kDirect);

  // n whole shards: the tensor itself; sendbuff apart from recvbuff gives a reduce-scatter that is not in place.
  const AllReduceSteps even =
      allReduceSteps(allReduceArgs(kPadded, kTensor, 4096, zpFloat32, 8, 64), 4, 3, kTensor, nullptr);
  EXPECT_FALSE(even.padded);
  EXPECT_EQ(even.reduceScatter.sendbuff, kPadded);
  EXPECT_EQ(even.reduceScatter.recvbuff, kTensor + 3 * 1024 * 4);
  EXPECT_EQ(even.gather.recvbuff, kTensor);
  EXPECT_FALSE(planFactsOf(topologyOf({4}, 3), even.reduceScatter).inPlace);

  // Two nodes of two over sockets: qgZ's two hops (inside the node, then across), then the gather's two in the
  // reverse order: an all-gather among this local rank's ranks, one a node, then one inside the node of the N
  // payloads each holds. qwZ alone on that layout keeps its one all-gather.
  const AllReducePlans two = allReducePlans(topologyOf({2, 2}, 3), 1 << 20, sockets(), 8, 64);
  EXPECT_FALSE(two.steps.padded);
  EXPECT_EQ(two.reduceScatter.path, PlanPath::kTwoHops);
  EXPECT_EQ(two.reduceScatter.chunks.count, size_t{1} << 18);
  EXPECT_EQ(two.reduceScatter.hop[0].comm, PlanComm::kIntra);
  EXPECT_EQ(two.gather.path, PlanPath::kTwoHops);
  ASSERT_EQ(two.gather.hops, 2);
  const PlanComm comms[] = {PlanComm::kInter, PlanComm::kIntra};
  const int slots[] = {1, 2};  // N slots a local peer inside the node
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(two.gather.hop[h].exchange, Exchange::kAllGather) << h;
    EXPECT_EQ(two.gather.hop[h].comm, comms[h]) << h;
    EXPECT_EQ(two.gather.hop[h].peers, 2) << h;
    EXPECT_EQ(two.gather.hop[h].self, 1) << h;
    EXPECT_EQ(two.gather.hop[h].slotsPerPeer, slots[h]) << h;
    EXPECT_FALSE(two.gather.hop[h].onFinishStage) << h;
  }
  EXPECT_EQ(two.gather.scratchBytes[0], 4 * payload(1 << 18, 8, 64));
  EXPECT_EQ(plan(topologyOf({2, 2}, 3), Call{CollKind::kQuantAllGather, 1 << 18, 2, 8, 64}, sockets()).path,
            PlanPath::kOneHop);
  const std::string d = two.gather.describe();
  for (const char* word :
       {"qwZ two hops", "hop 1: all-gather on inter (1/2)", "hop 2: all-gather on intra (1/2, 2 slots a peer)"}) {
    EXPECT_NE(d.find(word), std::string::npos) << word << " in: " << d;
  }
  // Uneven nodes: qgZ's flat hop. Count 1 on 8 ranks: shards of one block, seven of them all padding.
  EXPECT_EQ(allReducePlans(topologyOf({3, 1}, 3), 5000, sockets()).reduceScatter.path, PlanPath::kFlat);
  const AllReducePlans tiny = allReducePlans(topologyOf({8}, 5), 1, nvlink(false));
  EXPECT_EQ(tiny.steps.shardCount, 256u);
  EXPECT_EQ(tiny.steps.paddedCount, 2048u);
  EXPECT_EQ(tiny.reduceScatter.chunks.chunks, 1);
}

TEST(CollPlan, TwoHopGatherSlotsPlaceEveryRankOnceInTheHopsOrder) {
  // Slot l N + b: local rank l of node b; runs of evenly spaced ranks, else a run a slot. Node-major numbering,
  // interleaving nodes, and nodes whose ranks run backwards in one local rank (node 0: ranks 0 and 3).
  struct Layout {
    std::vector<uint64_t> keys;
    size_t runs;
  };
  for (const Layout& lay : {Layout{{7, 7, 8, 8}, 2}, Layout{{7, 8, 7, 8}, 2}, Layout{{7, 7, 7, 8, 8, 8, 9, 9, 9}, 3},
                            Layout{{7, 8, 8, 7}, 3}}) {
    for (int rank = 0; rank < static_cast<int>(lay.keys.size()); ++rank) {
      Topology t;
      ASSERT_EQ(buildTopology(lay.keys, rank, 0, "test", &t), zpSuccess);
      ASSERT_TRUE(t.hierarchical());
      const TwoHopGatherSlots s = twoHopGatherSlots(t);
      EXPECT_EQ(s.mySlot, t.localRank * t.nodes + t.node);
      EXPECT_EQ(s.runs.size(), lay.runs) << rank;
      std::vector<int> seen(t.nranks, 0);
      int next = 0;  // the runs cover the slots in order
      for (const TwoHopGatherSlots::Run& run : s.runs) {
        EXPECT_EQ(run.first, next);
        for (int j = 0; j < run.count; ++j) {
          const int slot = run.first + j, r = run.rank0 + j * run.stride;
          ASSERT_TRUE(r >= 0 && r < t.nranks) << r;
          EXPECT_EQ(r, t.nodeRanks[slot % t.nodes][slot / t.nodes]) << slot;
          ++seen[r];
        }
        next += run.count;
      }
      EXPECT_EQ(next, t.nranks);
      EXPECT_EQ(seen, std::vector<int>(t.nranks, 1));
    }
  }
}

TEST(CollPlan, ReserveCoversTheAllReduceAtEveryBlockSize) {
  // Small calls whose shards round up to a large block need more than the smallest block's sizing.
  for (const std::vector<int>& gpus : {std::vector<int>{8}, std::vector<int>{2, 2}, std::vector<int>{1}}) {
    const Topology t = topologyOf(gpus, 0);
    for (size_t maxBytes : {size_t{1000}, size_t{64} << 10, size_t{64} * kMiB + 6}) {
      const ReservePlan r = planReserve(t, readmeDefaults(), nvlink(false), kOffset, maxBytes);
      for (int g = kMinBlockSize; g <= kMaxBlockSize; g *= 2) {
        for (int bits : {4, 8}) {
          const AllReducePlans p = allReducePlans(t, maxBytes / 2, nvlink(false), bits, g);
          for (const CollPlan* q : {&p.reduceScatter, &p.gather}) {
            EXPECT_GE(r.scratchBytes[0], q->scratchBytes[0]) << maxBytes << " " << g;
            EXPECT_GE(r.scratchBytes[1], q->scratchBytes[1]) << maxBytes << " " << g;
          }
        }
      }
    }
  }
}

// ---- the host backend walks the plans ----------------------------------------------------------------------

TEST(CollPlanHost, ChunkedPlansAndEarlyOwnSlotsGiveTheSameBits) {
  // The host suites' calls are small: each is one chunk and never reaches ZP_OWN_SLOT_EARLY_BYTES. In a process of
  // chunks of 4 KiB (up to 16, the first and last halved) whose own slots are worked early from 0 bytes, the host
  // backend walks plans of many chunks, with the kept slice apart on every layout of several nodes, and the suites
  // (each against a reference written from the formats, not from the backend) still pass bit for bit.
  const zptest::ChildRun run =
      zptest::runTestInChild("Qgz*:Qwz*:Hpz*:GradQgzHost.*:AllReduce*",
                             {"ZP_CHUNK_BYTES=4096", "ZP_MAX_CHUNKS=16", "ZP_CHUNK_RAMP=1", "ZP_OWN_SLOT_EARLY_BYTES=0",
                              "ZP_DEBUG=INFO", "ZP_DEBUG_SUBSYS=COLL"});
  EXPECT_EQ(run.exitCode, 0) << zptest::outputTail(run);
  EXPECT_NE(run.output.find("[  PASSED  ]"), std::string::npos);
  EXPECT_EQ(run.output.find("[  FAILED  ]"), std::string::npos);
  // The plans it walked (the log's lines, INFO COLL).
  for (const char* walked :
       {"qgZ two hops", "qgZ one hop", "qgZ one flat hop", "qwZ one hop", "hpZ one hop", "hpZ exact", "16 chunks",
        "own slot early on the finish stage", "own slot early on a side stream", "own slot not sent",
        "pair all-gather in place", "zpQuantAllReduce : qgZ two hops", "zpQuantAllReduce : qgZ one hop",
        "zpQuantAllReduce : qgZ one flat hop", "zpQuantAllReduce : qwZ one hop", "zpQuantAllReduce : qwZ two hops"}) {
    EXPECT_NE(run.output.find(walked), std::string::npos) << walked;
  }
}

// ---- the sweep ----------------------------------------------------------------------------------------------

// A plan's decisions as the README's rules give them.
struct Expected {
  PlanPath path = PlanPath::kNone;
  int ranks = 0, rank = 0;
  int chunks = 0;
  int hops = 0;
  Exchange exchange[2] = {Exchange::kSendRecv, Exchange::kSendRecv};
  bool withoutSelf = false;
  OwnSlot own = OwnSlot::kWithTheOthers;
  bool green = false, ownGreen = false, inlineWaits = false;
  int recvSlots = 0, keptSlot = -1;
  size_t scratch0 = 0, scratch1 = 0, window = 0;
};

struct Layout {
  const char* name;
  std::vector<int> gpus;
  int hpz;
};

Expected expectedPlan(const Topology& t, const Call& c, const LinkFacts& l, const PlanTunables& tu,
                      const WindowFacts& w) {
  Expected e;
  const bool isHpz = c.kind == CollKind::kHierAllGather, isQgz = c.kind == CollKind::kQuantReduceScatter;
  e.ranks = isHpz ? t.hpzSize : t.nranks;
  e.rank = isHpz ? t.hpzRank : t.rank;
  const size_t logical = c.count * e.ranks * c.elemBytes;
  if (isHpz && c.bits == 0) {  // "Exact (it moves the bits as they are)"
    e.path = PlanPath::kExact;
    e.hops = 1;
    e.exchange[0] = Exchange::kAllGather;
    e.chunks = 1;
    return e;
  }
  // "Two hops when there are several nodes with several ranks each ... One hop when nodes or local size is 1";
  // "On uneven nodes qgZ falls back to one flat hop".
  bool equal = true;
  for (const auto& node : t.nodeRanks) equal = equal && node.size() == t.nodeRanks[0].size();
  const bool twoHops = isQgz && t.nodes > 1 && equal && t.localSize > 1;
  // "qwZ, hpZ's quantized gather over the whole communicator and one-hop qgZ of at least ZP_DIRECT_MIN_BYTES";
  // the window holds the call's payloads (qgZ: a slot for every rank) unless a graph froze it smaller.
  const size_t needed = kOffset + payload(c.count, c.bits, c.blockSize) * (isQgz ? e.ranks : 1);
  const bool directCall =
      c.kind == CollKind::kQuantAllGather || (isHpz && e.ranks == t.nranks && t.nodes == 1) || (isQgz && !twoHops);
  if (l.directLoads && directCall && tu.directMinBytes >= 0 && logical >= static_cast<size_t>(tu.directMinBytes) &&
      (!w.frozen || w.bytes >= needed)) {
    e.path = PlanPath::kDirect;
    e.chunks = 1;
    e.window = needed;
    e.inlineWaits = logical <= static_cast<size_t>(tu.directInlineWaitBytes);  // "up to this size"
    return e;
  }
  // ZP_CHUNK_BYTES per chunk, at most ZP_MAX_CHUNKS, whole blocks (host/chunk_plan.h).
  const ChunkPlan chunks = makeChunkPlan(c.count, c.blockSize, logical, tu.chunkBytes,
                                         static_cast<int>(std::min<int64_t>(tu.maxChunks, 16)), tu.chunkRamp);
  e.chunks = chunks.chunks;
  // Slow links: "host shared memory, sockets" (the world across nodes; an hpZ group stays inside its node).
  const bool slow = l.shmChannels || (!isHpz && t.nodes > 1);
  // "from this logical size the slot that never crosses the link is worked while the others travel ... (a call of
  // one chunk does it on a side stream)"; two hops keep their plain pipeline.
  if (!twoHops && slow && tu.ownSlotEarlyBytes >= 0 && logical >= static_cast<size_t>(tu.ownSlotEarlyBytes)) {
    e.own = e.chunks > 1 ? OwnSlot::kFinishStage : OwnSlot::kSideStream;
  }
  // ZP_PAIR_ALLGATHER: "2 as one ncclAllGather of the slot each sends the other when they are on different nodes
  // or share host memory on ZP_SHM_MIN_CTAS channels ..., ncclSend/ncclRecv over NVLink; 1 always; 0 never".
  auto pair = [&](int peers, bool differentNodesOrShm) {
    return peers == 2 && (tu.pairAllGather == 1 || (tu.pairAllGather == 2 && differentNodesOrShm));
  };
  auto region = [&](int slots) {
    size_t bytes = 0;
    for (int k = 0; k < chunks.chunks; ++k) bytes += slots * payload(chunks.elems(k), c.bits, c.blockSize);
    return bytes;
  };
  if (!isQgz) {
    e.path = PlanPath::kOneHop;
    e.hops = 1;
    e.exchange[0] = Exchange::kAllGather;
    e.green = e.chunks > 1 && l.greenContext;  // ZP_NCCL_SMS: the gathers' stages
    e.scratch0 = region(e.ranks);
  } else if (twoHops) {
    e.path = PlanPath::kTwoHops;
    e.hops = 2;
    e.exchange[0] = pair(t.localSize, false) ? Exchange::kPairGather : Exchange::kSendRecv;  // inside a node
    e.exchange[1] = pair(t.nodes, true) ? Exchange::kPairGather : Exchange::kSendRecv;       // across nodes
    e.recvSlots = e.ranks;
    e.scratch0 = e.scratch1 = region(e.ranks);
  } else {
    e.path = t.nodes > 1 && !equal ? PlanPath::kFlat : PlanPath::kOneHop;
    e.hops = 1;
    const bool early = e.own != OwnSlot::kWithTheOthers;
    // "the receiving one half as large again for qgZ between two ranks over a slow link, whose exchange receives
    // into three slots" (where the kept slice is worked early: src/cuda/qgz.cc).
    const bool three = early && pair(e.ranks, slow);
    e.exchange[0] = three                           ? Exchange::kPairGatherInPlace
                    : !early && pair(e.ranks, slow) ? Exchange::kPairGather
                                                    : Exchange::kSendRecv;
    e.withoutSelf = early && !three;
    e.recvSlots = three ? 3 : e.ranks;
    e.keptSlot = !early ? -1 : three ? 2 * e.rank : e.rank;
    e.scratch0 = region(e.ranks);
    e.scratch1 = region(e.recvSlots);
  }
  // The one-chunk own slot's side stream is in the green context when there is one; a pipelined call's is its
  // finish stage.
  e.ownGreen = (e.own == OwnSlot::kSideStream && l.greenContext) || (e.own == OwnSlot::kFinishStage && e.green);
  return e;
}

bool samePlan(const CollPlan& p, const Expected& e) {
  bool same = p.path == e.path && p.ranks == e.ranks && p.rank == e.rank && p.chunks.chunks == e.chunks &&
              p.hops == e.hops && p.ownSlot == e.own && p.greenStages == e.green && p.ownInGreen == e.ownGreen &&
              p.inlineWaits == e.inlineWaits && p.recv.slots == e.recvSlots && p.recv.keptSlot == e.keptSlot &&
              p.scratchBytes[0] == e.scratch0 && p.scratchBytes[1] == e.scratch1 && p.windowBytes == e.window;
  for (int h = 0; same && h < e.hops; ++h) same = p.hop[h].exchange == e.exchange[h];
  return same && (e.hops != 1 || p.hop[0].withoutSelf == e.withoutSelf);
}

// Field by field, for a plan that differs from the expected one.
void reportDifference(const CollPlan& p, const Expected& e, const std::string& what) {
  SCOPED_TRACE(what + ": " + p.describe());
  EXPECT_EQ(p.path, e.path);
  EXPECT_EQ(p.ranks, e.ranks);
  EXPECT_EQ(p.rank, e.rank);
  EXPECT_EQ(p.chunks.chunks, e.chunks);
  ASSERT_EQ(p.hops, e.hops);
  for (int h = 0; h < e.hops; ++h) EXPECT_EQ(p.hop[h].exchange, e.exchange[h]) << "hop " << h + 1;
  if (e.hops == 1) {
    EXPECT_EQ(p.hop[0].withoutSelf, e.withoutSelf);
  }
  EXPECT_EQ(p.ownSlot, e.own);
  EXPECT_EQ(p.greenStages, e.green);
  EXPECT_EQ(p.ownInGreen, e.ownGreen);
  EXPECT_EQ(p.inlineWaits, e.inlineWaits);
  EXPECT_EQ(p.recv.slots, e.recvSlots);
  EXPECT_EQ(p.recv.keptSlot, e.keptSlot);
  EXPECT_EQ(p.scratchBytes[0], e.scratch0);
  EXPECT_EQ(p.scratchBytes[1], e.scratch1);
  EXPECT_EQ(p.windowBytes, e.window);
}

// Counts just below and at each threshold for `ranks` ranks of `elemBytes` (whole blocks of 256 where they can be).
std::vector<size_t> countsAround(const PlanTunables& tu, int ranks, size_t elemBytes) {
  std::vector<size_t> counts = {1, 256, 1000};
  const size_t per = ranks * elemBytes;
  for (int64_t threshold : {tu.directMinBytes, tu.directInlineWaitBytes, tu.ownSlotEarlyBytes, int64_t{64} << 20,
                            int64_t{128} << 20, int64_t{512} << 20}) {
    if (threshold <= 0) continue;
    const size_t at = (threshold + per - 1) / per;  // the smallest count of at least `threshold` bytes
    counts.push_back(at - 1);
    counts.push_back(at);
  }
  return counts;
}

TEST(CollPlan, EveryLayoutLinkAndSizeClass) {
  const std::vector<Layout> layouts = {
      {"one rank", {1}, 0},
      {"one node of 2", {2}, 0},
      {"one node of 4", {4}, 0},
      {"one node of 8", {8}, 0},
      {"4 nodes of 1", {1, 1, 1, 1}, 0},
      {"2 nodes of 1", {1, 1}, 0},
      {"2x2", {2, 2}, 0},
      {"2x4", {4, 4}, 0},
      {"3x2", {2, 2, 2}, 0},
      {"uneven 2+1", {2, 1}, 0},
      {"uneven 3+1+2", {3, 1, 2}, 0},
      {"node of 4, hpZ 2", {4}, 2},
      {"node of 8, hpZ 1", {8}, 1},
      {"2x4, hpZ 2", {4, 4}, 2},
  };
  PlanTunables minBytes = readmeDefaults();
  minBytes.directMinBytes = 1 << 20;
  minBytes.directInlineWaitBytes = 256 << 10;
  PlanTunables pairs = readmeDefaults();
  pairs.pairAllGather = 1;
  pairs.ownSlotEarlyBytes = 1 << 20;
  pairs.chunkBytes = 16 << 20;
  PlanTunables never = readmeDefaults();
  never.pairAllGather = 0;
  never.ownSlotEarlyBytes = -1;
  never.directMinBytes = -1;
  never.maxChunks = 3;
  const std::vector<std::pair<const char*, PlanTunables>> tunables = {
      {"defaults", readmeDefaults()}, {"min bytes", minBytes}, {"pairs", pairs}, {"never", never}};
  int checked = 0, differences = 0;
  for (const Layout& layout : layouts) {
    int nranks = 0;
    for (int g : layout.gpus) nranks += g;
    std::vector<std::pair<const char*, LinkFacts>> links;
    if (layout.gpus.size() == 1 && nranks > 1) {
      links = {{"nvlink direct", nvlink(true)},
               {"nvlink", nvlink(false)},
               {"shm", shm()},
               {"shm, no green context", LinkFacts{true, false, false}}};
    } else {
      links = {{"sockets", sockets()}, {"sockets, no green context", LinkFacts{}}};
    }
    const std::vector<WindowFacts> windows = {WindowFacts{0, false, kOffset}, WindowFacts{2 * kMiB, true, kOffset}};
    for (int rank = 0; rank < nranks; ++rank) {
      const Topology t = topologyOf(layout.gpus, rank, layout.hpz);
      for (const auto& link : links)
        for (const auto& tu : tunables)
          for (const WindowFacts& w : windows)
            for (CollKind kind : {CollKind::kQuantAllGather, CollKind::kHierAllGather, CollKind::kQuantReduceScatter})
              for (int bits : {0, 4, 8}) {
                if (bits == 0 && kind != CollKind::kHierAllGather) continue;
                if (kind == CollKind::kHierAllGather && !t.hpzUsable) continue;  // refused at the call
                for (size_t esz : {size_t{2}, size_t{4}}) {
                  const int ranks = kind == CollKind::kHierAllGather ? t.hpzSize : t.nranks;
                  for (size_t count : countsAround(tu.second, ranks, esz)) {
                    const Call c{kind, count, esz, bits, 256};
                    const CollPlan p = plan(t, c, link.second, tu.second, w);
                    const Expected e = expectedPlan(t, c, link.second, tu.second, w);
                    if (!samePlan(p, e)) {
                      reportDifference(p, e,
                                       std::string(layout.name) + ", rank " + std::to_string(rank) + ", " + link.first +
                                           ", " + tu.first + (w.frozen ? ", frozen window" : ""));
                      ++differences;
                    }
                    ++checked;
                  }
                }
              }
    }
  }
  EXPECT_EQ(differences, 0);
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace zp
