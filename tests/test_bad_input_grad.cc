// Bad gradient options of zpQuantReduceScatterA2AEx2 on the host backend: every field refused with
// zpInvalidArgument and a message naming the call and the field; the communicator stays usable (a good call with
// error feedback right after each refusal gives the result of a communicator that saw no bad call: a refused call
// neither runs nor takes a sequence number). Device-memory checks of the residuals: tests/test_grad_gpu.cc.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "include/zpccl.h"
#include "tests/collective_check.h"
#include "tests/host_ranks.h"

namespace {

using zpcheck::Buffer;
using zpcheck::mentions;

constexpr size_t kCount = 300;
constexpr const char* kCall = "zpQuantReduceScatterA2AEx2";

struct Bufs {
  Buffer send, recv;  // (a residual starting in recvbuff may reach sendbuff too, where the allocator put it)
  std::vector<uint16_t> res, hop;
  std::vector<uint16_t> spare;  // a second residual-sized area
};

struct Edit {
  std::string name;
  std::function<void(zpGradOptions_t*, Bufs*)> edit;
  const char* mention;
  bool twoHopOnly = false;
};

std::vector<Edit> edits() {
  std::vector<Edit> e = {
      {"magic", [](zpGradOptions_t* o, Bufs*) { o->magic = ZP_CONFIG_MAGIC; }, "magic"},
      {"version newer", [](zpGradOptions_t* o, Bufs*) { o->version = ZPCCL_VERSION_CODE + 1; }, "options->version"},
      {"version 0.1", [](zpGradOptions_t* o, Bufs*) { o->version = 100; }, "options->version"},
      {"size", [](zpGradOptions_t* o, Bufs*) { o->size = sizeof(zpGradOptions_t) - 8; }, "options size"},
      {"bits", [](zpGradOptions_t* o, Bufs*) { o->bits = 5; }, "options->bits"},
      {"bits negative", [](zpGradOptions_t* o, Bufs*) { o->bits = -4; }, "options->bits"},
      {"blockSize", [](zpGradOptions_t* o, Bufs*) { o->blockSize = 100; }, "options->blockSize"},
      {"rounding 2", [](zpGradOptions_t* o, Bufs*) { o->rounding = 2; }, "options->rounding"},
      {"rounding -1", [](zpGradOptions_t* o, Bufs*) { o->rounding = -1; }, "options->rounding"},
      {"rounding INT_MAX", [](zpGradOptions_t* o, Bufs*) { o->rounding = INT_MAX; }, "options->rounding"},
      {"seed negative", [](zpGradOptions_t* o, Bufs*) { o->seed = -5; }, "options->seed"},
      {"sequence negative", [](zpGradOptions_t* o, Bufs*) { o->sequence = -1; }, "options->sequence"},
      {"residual count short", [](zpGradOptions_t* o, Bufs*) { o->residualCount -= 1; }, "options->residualCount"},
      {"residual count of one slice", [](zpGradOptions_t* o, Bufs*) { o->residualCount = kCount; },
       "options->residualCount"},
      {"residual count without residual",
       [](zpGradOptions_t* o, Bufs*) {
         o->residual = nullptr;
         o->hopResidual = nullptr;
         o->hopResidualCount = 0;
       },
       "options->residualCount"},
      {"residual type float32", [](zpGradOptions_t* o, Bufs*) { o->residualType = zpFloat32; },
       "residualType float is not supported"},
      {"residual type float16", [](zpGradOptions_t* o, Bufs*) { o->residualType = zpFloat16; },
       "residualType half is not supported"},
      {"residual type 99", [](zpGradOptions_t* o, Bufs*) { o->residualType = 99; }, "options->residualType 99"},
      {"residual misaligned",
       [](zpGradOptions_t* o, Bufs* b) { o->residual = reinterpret_cast<char*>(b->spare.data()) + 1; },
       "options->residual"},
      {"residual overlaps sendbuff", [](zpGradOptions_t* o, Bufs* b) { o->residual = b->send.data(); },
       "overlaps sendbuff"},
      {"residual overlaps recvbuff", [](zpGradOptions_t* o, Bufs* b) { o->residual = b->recv.data() + 2 * kCount - 2; },
       "overlaps"},
      {"hop residual count without hop residual",
       [](zpGradOptions_t* o, Bufs*) {
         o->hopResidual = nullptr;
         o->hopResidualCount = 2 * kCount;
       },
       "options->hopResidualCount"},
      {"hop residual count on two hops", [](zpGradOptions_t* o, Bufs*) { o->hopResidualCount = kCount; },
       "options->hopResidualCount", true},
      {"hop residual overlaps residual", [](zpGradOptions_t* o, Bufs* b) { o->hopResidual = b->res.data() + 4; },
       "overlaps options->residual", true},
      {"hop residual type", [](zpGradOptions_t* o, Bufs*) { o->residualType = zpFloat32; }, "residualType", true},
  };
  return e;
}

// The good options of this rank: SR and error feedback on both hops (the hop residual where there are two).
zpGradOptions_t goodOptions(Bufs* b, int nranks, size_t hopCount) {
  zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
  o.rounding = zpRoundStochastic;
  o.residual = b->res.data();
  o.residualCount = kCount * nranks;
  o.hopResidual = hopCount ? b->hop.data() : nullptr;
  o.hopResidualCount = hopCount;
  return o;
}

// Runs `goodCalls` good calls on a fresh communicator of the layout, each after every refused edit when `withBad`;
// returns every rank's outputs and residuals, concatenated.
std::vector<uint16_t> run(int nranks, int ranksPerNode, bool withBad, int goodCalls, int* refused) {
  std::vector<std::vector<uint16_t>> result(nranks);
  const std::vector<Edit> all = edits();
  zptest::runHostRanks(
      nranks, [&](int, zpConfig_t* c) { c->ranksPerNode = ranksPerNode; },
      [&](int rank, zpComm_t comm) {
        size_t hopCount = 0;
        ASSERT_EQ(zpGradHopResidualCount(kCount, &hopCount, comm), zpSuccess);
        Bufs b;
        b.send = Buffer(kCount * nranks * 2);
        b.recv = Buffer(kCount * 2);
        b.res.assign(kCount * nranks, 0);
        b.hop.assign(hopCount, 0);
        b.spare.assign(kCount * nranks + 8, 0);
        zpcheck::fillRandom(zpBfloat16, b.send.data(), kCount * nranks, 3, rank);
        for (int call = 0; call < goodCalls; ++call) {
          if (withBad) {
            for (const Edit& e : all) {
              if (e.twoHopOnly && hopCount == 0) continue;
              zpGradOptions_t o = goodOptions(&b, nranks, hopCount);
              e.edit(&o, &b);
              std::memset(b.recv.data(), 0xa5, kCount * 2);
              const std::vector<uint16_t> resBefore = b.res, hopBefore = b.hop;
              const zpResult_t r = zpQuantReduceScatterA2AEx2(b.send.data(), b.recv.data(), kCount, zpBfloat16, zpSum,
                                                              &o, comm, nullptr);
              EXPECT_EQ(r, zpInvalidArgument) << e.name;
              const char* msg = zpGetLastError(comm);
              EXPECT_TRUE(mentions(msg, kCall) && mentions(msg, e.mention)) << e.name << ": " << msg;
              EXPECT_TRUE(zpcheck::allBytesAre(b.recv.data(), kCount * 2, 0xa5)) << e.name << " wrote recvbuff";
              EXPECT_EQ(b.res, resBefore) << e.name << " wrote the residual";
              EXPECT_EQ(b.hop, hopBefore) << e.name << " wrote the hop residual";
              if (rank == 0) ++*refused;
            }
          }
          zpGradOptions_t o = goodOptions(&b, nranks, hopCount);
          std::memset(b.recv.data(), 0xa5, kCount * 2);
          ASSERT_EQ(
              zpQuantReduceScatterA2AEx2(b.send.data(), b.recv.data(), kCount, zpBfloat16, zpSum, &o, comm, nullptr),
              zpSuccess)
              << zpGetLastError(comm);
          EXPECT_STREQ(zpGetLastError(comm), "");
        }
        auto& r = result[rank];
        r.resize(kCount);
        std::memcpy(r.data(), b.recv.data(), kCount * 2);
        r.insert(r.end(), b.res.begin(), b.res.end());
        r.insert(r.end(), b.hop.begin(), b.hop.end());
      });
  std::vector<uint16_t> all_;
  for (auto& r : result) all_.insert(all_.end(), r.begin(), r.end());
  return all_;
}

TEST(BadInputGrad, EveryOptionRefusedByNameAndTheCommunicatorStaysUsable) {
  for (int ranksPerNode : {4, 2}) {  // one hop (one node of 4), two hops (2 x 2)
    SCOPED_TRACE(ranksPerNode == 4 ? "one hop" : "two hops");
    int refused = 0;
    const auto clean = run(4, ranksPerNode, false, 2, &refused);
    const auto afterBad = run(4, ranksPerNode, true, 2, &refused);
    EXPECT_GT(refused, 30);
    EXPECT_EQ(afterBad, clean) << "refused calls changed later results (a sequence number taken, a residual written)";
  }
}

// A one-hop layout takes no hop residual: zpGradHopResidualCount says 0, a pointer with count 0 is not used, a count
// is refused; the query refuses a NULL count.
TEST(BadInputGrad, HopResidualOnOneHop) {
  zptest::runHostRanks(
      2, [](int, zpConfig_t* c) { c->ranksPerNode = 2; },
      [](int rank, zpComm_t comm) {
        size_t n = 7;
        ASSERT_EQ(zpGradHopResidualCount(kCount, &n, comm), zpSuccess);
        EXPECT_EQ(n, 0u);
        EXPECT_EQ(zpGradHopResidualCount(kCount, nullptr, comm), zpInvalidArgument);
        EXPECT_TRUE(mentions(zpGetLastError(comm), "zpGradHopResidualCount : count is NULL"));
        Buffer send(kCount * 4), recv(kCount * 2);
        zpcheck::fillRandom(zpBfloat16, send.data(), kCount * 2, 1, rank);
        std::vector<uint16_t> hop(kCount, 0x1234);
        zpGradOptions_t o = ZP_GRAD_OPTIONS_INITIALIZER;
        o.hopResidual = hop.data();
        EXPECT_EQ(zpQuantReduceScatterA2AEx2(send.data(), recv.data(), kCount, zpBfloat16, zpSum, &o, comm, nullptr),
                  zpSuccess)
            << zpGetLastError(comm);
        EXPECT_EQ(hop, std::vector<uint16_t>(kCount, 0x1234)) << "an unused hop residual was written";
        o.hopResidualCount = kCount;
        EXPECT_EQ(zpQuantReduceScatterA2AEx2(send.data(), recv.data(), kCount, zpBfloat16, zpSum, &o, comm, nullptr),
                  zpInvalidArgument);
        EXPECT_TRUE(mentions(zpGetLastError(comm), "takes one hop")) << zpGetLastError(comm);
      });
}

// A call that passed each rank's own checks but that the ranks refuse for disagreeing (rank 1 passes another recvcount:
// zpInvalidUsage on every rank) has taken its sequence number on every rank alike, unlike a call refused by its
// argument checks: the good call after it draws the bits of a clean communicator's second call, not its first (which
// differ: a communicator's first call alone gives other outputs).
TEST(BadInputGrad, ACallTheRanksRefuseForDisagreeingTakesASequenceNumber) {
  enum class First { kGood, kDisagreeing, kNone };
  auto outputs = [](First first) {
    std::vector<std::vector<uint16_t>> out(2);
    zptest::runHostRanks(
        2, [](int, zpConfig_t* c) { c->gradRounding = zpRoundStochastic; },
        [&](int rank, zpComm_t comm) {
          Buffer send(kCount * 2 * 2), recv(kCount * 2);
          zpcheck::fillRandom(zpBfloat16, send.data(), kCount * 2, 5, rank);
          if (first != First::kNone) {
            const bool odd = first == First::kDisagreeing && rank == 1;
            EXPECT_EQ(zpQuantReduceScatterA2A(send.data(), recv.data(), odd ? kCount - 1 : kCount, zpBfloat16, zpSum,
                                              comm, nullptr),
                      first == First::kGood ? zpSuccess : zpInvalidUsage)
                << zpGetLastError(comm);
          }
          ASSERT_EQ(zpQuantReduceScatterA2A(send.data(), recv.data(), kCount, zpBfloat16, zpSum, comm, nullptr),
                    zpSuccess)
              << zpGetLastError(comm);
          out[rank].resize(kCount);
          std::memcpy(out[rank].data(), recv.data(), kCount * 2);
        });
    return out;
  };
  const auto second = outputs(First::kGood);
  EXPECT_EQ(outputs(First::kDisagreeing), second);
  EXPECT_NE(outputs(First::kNone), second);
}

}  // namespace
