// Collectives whose ranks disagree on the call, on the host backend: different collectives, counts (0 against a
// nonzero one too), datatypes, ops, bits or block sizes (per-call options) make every rank return zpInvalidUsage
// with the same reason, "<call> : ranks disagree on <argument>: rank 0 passed X, rank r passed Y", without
// touching any recvbuff; the communicator stays usable: matching calls right after are bit-equal to the host
// reference. Calls that differ only in what the collective ignores (plain vs Ex with the same settings, exact hpZ
// with and without a block size) still agree. Settings of the config that differ are refused at init
// (tests/test_init_host.cc).
#include <gtest/gtest.h>

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "host/quant_format.h"
#include "host/quant_ref.h"
#include "host/reduce_ref.h"
#include "include/zpccl.h"
#include "tests/collective_check.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::allBytesAre;
using zpcheck::Buffer;
using zpcheck::bytesOf;
using zpcheck::sameBits;
using zptest::runHostRanks;

// ---- one rank's call ---------------------------------------------------------------------------------------------

enum class Api { kQwz, kQwzEx, kHpz, kHpzEx, kQgz, kQgzEx };

const char* nameOf(Api api) {
  switch (api) {
    case Api::kQwz:
      return "zpQuantAllGather";
    case Api::kQwzEx:
      return "zpQuantAllGatherEx";
    case Api::kHpz:
      return "zpHierAllGather";
    case Api::kHpzEx:
      return "zpHierAllGatherEx";
    case Api::kQgz:
      return "zpQuantReduceScatterA2A";
    case Api::kQgzEx:
      return "zpQuantReduceScatterA2AEx";
  }
  return "?";
}

bool isQgz(Api api) { return api == Api::kQgz || api == Api::kQgzEx; }

struct Call {
  Api api;
  size_t count;  // sendcount, or recvcount for qgZ
  zpDataType_t type = zpFloat32;
  zpRedOp_t op = zpSum;               // qgZ only
  zpQuantOptions_t options = {0, 0};  // Ex only
};

// Runs c on comm with buffers sized for it (all ranks on one node: the hpZ group is the whole communicator):
// a random sendbuff and a recvbuff poisoned with 0xFF, left in *recv.
zpResult_t invoke(const Call& c, int rank, int nranks, uint64_t seed, zpComm_t comm, Buffer* recv) {
  const size_t sendElems = isQgz(c.api) ? nranks * c.count : c.count;
  const size_t recvElems = isQgz(c.api) ? c.count : nranks * c.count;
  Buffer send(sendElems * bytesOf(c.type));
  if (c.type == zpFloat16 || c.type == zpBfloat16 || c.type == zpFloat32) {
    zpcheck::fillRandom(c.type, send.data(), sendElems, seed, rank);
  } else {
    zpcheck::fillBytes(send.data(), send.size(), seed, rank);
  }
  recv->resize(recvElems * bytesOf(c.type));  // poisons
  switch (c.api) {
    case Api::kQwz:
      return zpQuantAllGather(send.data(), recv->data(), c.count, c.type, comm, nullptr);
    case Api::kQwzEx:
      return zpQuantAllGatherEx(send.data(), recv->data(), c.count, c.type, &c.options, comm, nullptr);
    case Api::kHpz:
      return zpHierAllGather(send.data(), recv->data(), c.count, c.type, comm, nullptr);
    case Api::kHpzEx:
      return zpHierAllGatherEx(send.data(), recv->data(), c.count, c.type, &c.options, comm, nullptr);
    case Api::kQgz:
      return zpQuantReduceScatterA2A(send.data(), recv->data(), c.count, c.type, c.op, comm, nullptr);
    case Api::kQgzEx:
      return zpQuantReduceScatterA2AEx(send.data(), recv->data(), c.count, c.type, c.op, &c.options, comm, nullptr);
  }
  return zpInternalError;
}

// ---- matching calls after a mismatch, against the host reference ----------------------------------------------

// qwZ, exact hpZ and qgZ (Avg), all ranks alike, each bit-equal to the reference built here from the ranks'
// inputs. Settings are explicit, so that ranks whose configs differ still agree.
void expectMatchingCallsWork(int rank, int nranks, uint64_t seed, zpComm_t comm) {
  Buffer recv;
  {  // qwZ: every shard quantized and dequantized on its own, in rank order.
    const Call c{Api::kQwzEx, 300, zpFloat32, zpSum, {8, 256}};
    EXPECT_EQ(invoke(c, rank, nranks, seed, comm, &recv), zpSuccess) << zpGetLastError(comm);
    EXPECT_STREQ(zpGetLastError(comm), "");
    const size_t shard = c.count * bytesOf(c.type);
    Buffer expected(nranks * shard), original(shard), payload(zp::quantPayloadBytes(c.count, 8, 256));
    for (int r = 0; r < nranks; ++r) {
      zpcheck::fillRandom(c.type, original.data(), c.count, seed, r);
      zp::quantizeRef(original.data(), c.type, c.count, 8, 256, payload.data());
      zp::dequantizeRef(payload.data(), c.type, c.count, 8, 256, expected.data() + r * shard);
    }
    EXPECT_TRUE(sameBits(recv.data(), expected.data(), nranks * c.count, c.type)) << "qwZ after the mismatch";
  }
  {  // exact hpZ: the shards' bytes, in rank order.
    const Call c{Api::kHpz, 77, zpBfloat16};
    EXPECT_EQ(invoke(c, rank, nranks, seed + 1, comm, &recv), zpSuccess) << zpGetLastError(comm);
    const size_t shard = c.count * bytesOf(c.type);
    Buffer expected(nranks * shard);
    for (int r = 0; r < nranks; ++r) zpcheck::fillRandom(c.type, expected.data() + r * shard, c.count, seed + 1, r);
    EXPECT_TRUE(sameBits(recv.data(), expected.data(), nranks * c.count, c.type)) << "hpZ after the mismatch";
  }
  {  // one-hop qgZ: slice `rank` of every rank quantized, summed in rank order in fp32, divided, rounded.
    const Call c{Api::kQgzEx, 300, zpFloat32, zpAvg, {4, 256}};
    EXPECT_EQ(invoke(c, rank, nranks, seed + 2, comm, &recv), zpSuccess) << zpGetLastError(comm);
    const size_t n = c.count, pb = zp::quantPayloadBytes(n, 4, 256);
    Buffer input(nranks * n * bytesOf(c.type)), payloads(nranks * pb), expected(n * bytesOf(c.type));
    std::vector<const unsigned char*> sources;
    for (int r = 0; r < nranks; ++r) {
      zpcheck::fillRandom(c.type, input.data(), nranks * n, seed + 2, r);
      zp::quantizeRef(input.data() + rank * n * bytesOf(c.type), c.type, n, 4, 256, payloads.data() + r * pb);
      sources.push_back(payloads.data() + r * pb);
    }
    std::vector<float> sum(n);
    zp::sumPayloadsRef(sources, n, 4, 256, 0, n, sum.data());
    zp::finishRef(sum.data(), c.type, static_cast<float>(nranks), 0, n, expected.data());
    EXPECT_TRUE(sameBits(recv.data(), expected.data(), n, c.type)) << "qgZ after the mismatch";
  }
}

// ---- the mismatches --------------------------------------------------------------------------------------------

// Rank `odd` calls `odd`, every other rank `agreed`; the message names `what` and the two values as printed.
struct Mismatch {
  const char* name;
  Call agreed, odd;
  const char* what;  // the argument, or "the collective" when the calls differ
  const char* agreedValue;
  const char* oddValue;
};

const Mismatch kMismatches[] = {
    {"qgz_recvcount", {Api::kQgz, 256}, {Api::kQgz, 257}, "recvcount", "256", "257"},
    {"qwz_sendcount", {Api::kQwz, 1000}, {Api::kQwz, 999}, "sendcount", "1000", "999"},
    {"hpz_sendcount", {Api::kHpz, 64, zpInt32}, {Api::kHpz, 65, zpInt32}, "sendcount", "64", "65"},
    {"qwz_datatype", {Api::kQwz, 512, zpFloat32}, {Api::kQwz, 512, zpFloat16}, "datatype", "float", "half"},
    {"qgz_datatype", {Api::kQgz, 512, zpBfloat16}, {Api::kQgz, 512, zpFloat32}, "datatype", "bfloat16", "float"},
    // The same bytes per rank, still refused: the types differ.
    {"hpz_datatype", {Api::kHpz, 128, zpFloat32}, {Api::kHpz, 128, zpInt32}, "datatype", "float", "int32"},
    {"qgz_op", {Api::kQgz, 300, zpFloat32, zpSum}, {Api::kQgz, 300, zpFloat32, zpAvg}, "op", "sum", "avg"},
    {"qwz_bits_options",
     {Api::kQwzEx, 512, zpFloat32, zpSum, {8, 0}},
     {Api::kQwzEx, 512, zpFloat32, zpSum, {4, 0}},
     "bits",
     "8",
     "4"},
    // gradBits defaults to 4.
    {"qgz_bits_options", {Api::kQgz, 512}, {Api::kQgzEx, 512, zpFloat32, zpSum, {8, 0}}, "bits", "4", "8"},
    {"qwz_blocksize_options",
     {Api::kQwz, 512},
     {Api::kQwzEx, 512, zpFloat32, zpSum, {0, 1024}},
     "blockSize",
     "256",
     "1024"},
    {"qgz_blocksize_options",
     {Api::kQgzEx, 512, zpFloat32, zpSum, {0, 64}},
     {Api::kQgzEx, 512, zpFloat32, zpSum, {0, 128}},
     "blockSize",
     "64",
     "128"},
    {"hpz_exact_vs_quantized",
     {Api::kHpz, 256, zpFloat32},
     {Api::kHpzEx, 256, zpFloat32, zpSum, {8, 0}},
     "bits",
     "0",
     "8"},
    {"hpz_quantized_blocksize",
     {Api::kHpzEx, 256, zpFloat16, zpSum, {8, 32}},
     {Api::kHpzEx, 256, zpFloat16, zpSum, {8, 64}},
     "blockSize",
     "32",
     "64"},
    {"qwz_vs_qgz", {Api::kQwz, 256}, {Api::kQgz, 256}, "the collective", "zpQuantAllGather", "zpQuantReduceScatterA2A"},
    {"hpz_vs_qwz", {Api::kHpz, 256}, {Api::kQwz, 256}, "the collective", "zpHierAllGather", "zpQuantAllGather"},
    {"qgzex_vs_hpzex",
     {Api::kQgzEx, 100, zpFloat32, zpSum, {8, 0}},
     {Api::kHpzEx, 100, zpFloat32, zpSum, {8, 0}},
     "the collective",
     "zpQuantReduceScatterA2AEx",
     "zpHierAllGatherEx"},
    // Several differences: the collective is named first, then the count, before the type.
    {"kind_and_count",
     {Api::kQwz, 100},
     {Api::kQgz, 300},
     "the collective",
     "zpQuantAllGather",
     "zpQuantReduceScatterA2A"},
    {"count_and_type", {Api::kQwz, 100, zpFloat32}, {Api::kQwz, 101, zpFloat16}, "sendcount", "100", "101"},
    // Count 0 is a no-op only when every rank passes it: the rank with 0 still meets its peers and is refused too.
    {"qwz_count_zero", {Api::kQwz, 256}, {Api::kQwz, 0}, "sendcount", "256", "0"},
    {"qgz_count_zero", {Api::kQgz, 0}, {Api::kQgz, 64}, "recvcount", "0", "64"},
    {"hpz_count_zero", {Api::kHpz, 0, zpInt8}, {Api::kHpz, 5, zpInt8}, "sendcount", "0", "5"},
};

std::string expectedMessage(const Mismatch& m, int rank, int odd) {
  const Call& mine = rank == odd ? m.odd : m.agreed;
  const std::string verb = std::string(m.what) == "the collective" ? " called " : " passed ";
  return std::string(nameOf(mine.api)) + " : ranks disagree on " + m.what + ": rank 0" + verb + m.agreedValue +
         ", rank " + std::to_string(odd) + verb + m.oddValue;
}

// Every rank gets zpInvalidUsage and the same reason, and its recvbuff stays poisoned.
void expectRefused(const Mismatch& m, int rank, int nranks, int odd, uint64_t seed, zpComm_t comm) {
  SCOPED_TRACE(std::string(m.name) + ", rank " + std::to_string(rank));
  Buffer recv;
  const Call& mine = rank == odd ? m.odd : m.agreed;
  EXPECT_EQ(invoke(mine, rank, nranks, seed, comm, &recv), zpInvalidUsage);
  EXPECT_EQ(std::string(zpGetLastError(comm)), expectedMessage(m, rank, odd));
  EXPECT_TRUE(allBytesAre(recv.data(), recv.size(), 0xff)) << "recvbuff written by a refused call";
}

// The ranks' count and which of them disagrees.
struct Shape {
  int nranks, odd;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.nranks << " ranks, rank " << s.odd << " differs"; }

class MismatchHost : public ::testing::TestWithParam<Shape> {};

// Every mismatch on one communicator in turn, each followed by matching calls: it stays usable throughout.
TEST_P(MismatchHost, EveryRankRefusesThenMatchingCallsWork) {
  const Shape s = GetParam();
  runHostRanks(
      s.nranks, [](int, zpConfig_t* c) { c->nodeId = 0; },
      [&](int rank, zpComm_t comm) {
        uint64_t seed = 9100 + 100 * s.nranks + 10 * s.odd;
        for (const Mismatch& m : kMismatches) {
          expectRefused(m, rank, s.nranks, s.odd, ++seed, comm);
          SCOPED_TRACE(std::string("after ") + m.name);
          expectMatchingCallsWork(rank, s.nranks, seed += 3, comm);
        }
        zpResult_t async = zpInternalError;
        EXPECT_EQ(zpCommGetAsyncError(comm, &async), zpSuccess);
        EXPECT_EQ(async, zpSuccess);
      });
}

// Count 0 on every rank is a successful no-op that writes nothing; matching calls work after it.
TEST_P(MismatchHost, CountZeroOnEveryRankIsANoOp) {
  const Shape s = GetParam();
  runHostRanks(
      s.nranks, [](int, zpConfig_t* c) { c->nodeId = 0; },
      [&](int rank, zpComm_t comm) {
        for (Api api : {Api::kQwz, Api::kHpz, Api::kQgzEx}) {
          Buffer recv;
          EXPECT_EQ(invoke({api, 0}, rank, s.nranks, 5, comm, &recv), zpSuccess) << zpGetLastError(comm);
          EXPECT_EQ(zpQuantAllGather(nullptr, nullptr, 0, zpFloat16, comm, nullptr), zpSuccess) << zpGetLastError(comm);
        }
        expectMatchingCallsWork(rank, s.nranks, 6, comm);
      });
}

INSTANTIATE_TEST_SUITE_P(Shapes, MismatchHost, ::testing::Values(Shape{2, 1}, Shape{3, 1}, Shape{3, 2}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return "n" + std::to_string(info.param.nranks) + "_odd" + std::to_string(info.param.odd);
                         });

// Calls that differ only in what the collective does not use agree: zpQuantAllGather and zpQuantAllGatherEx with
// the communicator's own settings, and exact hpZ with and without a block size in its options.
TEST(MismatchHost, EquivalentCallsAgree) {
  for (int nranks : {2, 3}) {
    runHostRanks(
        nranks, [](int, zpConfig_t* c) { c->nodeId = 0; },
        [&](int rank, zpComm_t comm) {
          Buffer recv, same;
          const Call plain{Api::kQwz, 700, zpFloat32};
          const Call ex{Api::kQwzEx, 700, zpFloat32, zpSum, {8, 256}};
          const Call exact{Api::kHpz, 333, zpUint8};
          const Call exactEx{Api::kHpzEx, 333, zpUint8, zpSum, {0, 1024}};
          // Rank 1 names the config's settings (8 bits, 256) explicitly, the others take them from the config.
          EXPECT_EQ(invoke(rank == 1 ? ex : plain, rank, nranks, 5, comm, &recv), zpSuccess) << zpGetLastError(comm);
          EXPECT_EQ(invoke(ex, rank, nranks, 5, comm, &same), zpSuccess) << zpGetLastError(comm);
          EXPECT_TRUE(sameBits(recv.data(), same.data(), nranks * 700, zpFloat32));
          EXPECT_EQ(invoke(rank == 1 ? exactEx : exact, rank, nranks, 6, comm, &recv), zpSuccess)
              << zpGetLastError(comm);
          Buffer expected(nranks * 333);
          for (int r = 0; r < nranks; ++r) zpcheck::fillBytes(expected.data() + r * 333, 333, 6, r);
          EXPECT_TRUE(sameBits(recv.data(), expected.data(), nranks * 333, size_t{1}));
        });
  }
}

// Two nodes of two ranks: qgZ takes two hops and hpZ groups are the nodes, yet all ranks agree on every call,
// so a rank of the other node (or hpZ group) is refused too. A matching qgZ after the mismatches returns what
// the same call returned before them.
TEST(MismatchHost, TwoHopLayout) {
  const int nranks = 4;
  runHostRanks(
      nranks, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [&](int rank, zpComm_t comm) {
        const Call qgz{Api::kQgz, 300, zpBfloat16, zpSum};
        Buffer before, after;
        EXPECT_EQ(invoke(qgz, rank, nranks, 11, comm, &before), zpSuccess) << zpGetLastError(comm);
        const Mismatch count{"two_hop_recvcount", qgz, {Api::kQgz, 301, zpBfloat16}, "recvcount", "300", "301"};
        expectRefused(count, rank, nranks, 3, 12, comm);
        const Mismatch op{"two_hop_op", qgz, {Api::kQgz, 300, zpBfloat16, zpAvg}, "op", "sum", "avg"};
        expectRefused(op, rank, nranks, 2, 13, comm);
        // hpZ groups {0, 1} and {2, 3}: rank 3 differs, ranks 0 and 1 are refused as well.
        const Mismatch hpz{"two_hop_hpz", {Api::kHpz, 64}, {Api::kHpz, 32}, "sendcount", "64", "32"};
        const Call& mine = rank == 3 ? hpz.odd : hpz.agreed;
        // hpZ's recvbuff holds hpzSize = 2 shards here, not nranks: size it by hand.
        {
          SCOPED_TRACE("two_hop_hpz, rank " + std::to_string(rank));
          Buffer send(mine.count * 4), out(2 * mine.count * 4);
          EXPECT_EQ(zpHierAllGather(send.data(), out.data(), mine.count, zpFloat32, comm, nullptr), zpInvalidUsage);
          EXPECT_EQ(std::string(zpGetLastError(comm)), expectedMessage(hpz, rank, 3));
          EXPECT_TRUE(allBytesAre(out.data(), out.size(), 0xff));
        }
        EXPECT_EQ(invoke(qgz, rank, nranks, 11, comm, &after), zpSuccess) << zpGetLastError(comm);
        EXPECT_TRUE(sameBits(after.data(), before.data(), qgz.count, qgz.type));
      });
}

}  // namespace
