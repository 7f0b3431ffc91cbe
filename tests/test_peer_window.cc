// When a communicator uses direct loads (src/cuda/peer_window.h): the decision every rank votes on at init, and the
// size threshold of each call. Host-only: the facts are given, not read from NCCL.
#include <gtest/gtest.h>

#include <string>

#include "src/cuda/cuda_backend.h"
#include "src/cuda/peer_window.h"

namespace zp {
namespace {

// Two ranks of one node, all in NCCL's load/store-accessible team, NCCL's P2P on: direct loads.
DirectLoadsFacts oneNvlinkNode() { return DirectLoadsFacts{16 << 20, 2, 1, nullptr, 2, 22809, 22809}; }

std::string blocker(const DirectLoadsFacts& f) {
  const char* why = directLoadsBlocker(f);
  return why == nullptr ? "" : why;
}

TEST(DirectLoads, OneNvlinkNodeUsesThem) { EXPECT_EQ(blocker(oneNvlinkNode()), ""); }

TEST(DirectLoads, EachMissingConditionRulesThemOutAndSaysWhich) {
  DirectLoadsFacts f = oneNvlinkNode();
  f.minBytes = -1;
  EXPECT_NE(blocker(f).find("ZP_DIRECT_MIN_BYTES"), std::string::npos);
  f = oneNvlinkNode();
  f.nranks = 1;
  f.lsaRanks = 1;
  EXPECT_NE(blocker(f).find("one rank"), std::string::npos);
  f = oneNvlinkNode();
  f.nodes = 2;  // real nodes, or NCCL_HOSTID / the config's emulation
  EXPECT_NE(blocker(f).find("several nodes"), std::string::npos);
  f = oneNvlinkNode();
  f.lsaRanks = 1;  // e.g. GPUs without peer access
  EXPECT_NE(blocker(f).find("load/store-accessible"), std::string::npos);
  f = oneNvlinkNode();
  f.lsaRanks = 0;
  EXPECT_NE(blocker(f).find("device API"), std::string::npos);
}

TEST(DirectLoads, AnotherNcclMajorMinorThanBuiltWithRulesThemOut) {
  // nccl_device.h's inline code must match the library's structs: a wheel of NCCL upgraded after the build.
  DirectLoadsFacts f = oneNvlinkNode();
  for (int run : {22900, 23203, 32809, 22709}) {
    f.ncclRun = run;
    EXPECT_NE(blocker(f).find("major.minor"), std::string::npos) << run;
  }
  for (int run : {22800, 22803, 22899}) {  // another patch release of the same major.minor
    f.ncclRun = run;
    EXPECT_EQ(blocker(f), "") << run;
  }
}

TEST(DirectLoads, NcclP2pDisableIsRespectedAsNcclReadsIt) {
  // The perf harness's shm regime sets it: zpccl must then move the payloads through NCCL as well.
  DirectLoadsFacts f = oneNvlinkNode();
  for (const char* off : {"1", "2", "-1"}) {
    f.p2pOff = off;
    EXPECT_NE(blocker(f).find("NCCL_P2P_DISABLE"), std::string::npos) << off;
  }
  for (const char* on : {"0", ""}) {
    f.p2pOff = on;
    EXPECT_EQ(blocker(f), "") << "'" << on << "'";
  }
}

TEST(DirectLoads, RankPayloadsAreOneStridedBatchAfterTheFlags) {
  PeerWindow w;
  w.nranks = 4;
  w.rank0 = uintptr_t{1} << 40;
  w.rankStride = size_t{144} << 30;  // as NCCL maps them on an H200: 144 GiB apart
  const size_t flags = PeerSync::flagBytes(4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.rankWindow(0)), w.rank0 + flags);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.rankWindow(3)), w.rank0 + 3 * w.rankStride + flags);
  EXPECT_EQ(flags % 16, 0u) << "payloads stay 16-byte aligned";
}

TEST(DirectLoads, FlagsOfEveryWriterFitBeforeThePayload) {
  for (int n : {2, 3, 8, 72, 512}) {
    const size_t last = PeerSync::flagOffset(PeerSync::kReadDone, n - 1, n);
    EXPECT_LE(last + sizeof(unsigned long long), PeerSync::flagBytes(n)) << n << " ranks";
    EXPECT_NE(PeerSync::flagOffset(PeerSync::kWritten, n - 1, n), PeerSync::flagOffset(PeerSync::kReadDone, 0, n))
        << "the two flags of different writers never share a word";
  }
}

TEST(DirectLoads, TheWriteCountsTheCallAndTheReadAnswersIt) {
  PeerWindow w;
  w.nranks = 2;
  w.rank = 1;
  PeerWindowWords words[2] = {};  // the words, then room for the addresses
  w.words = words;
  const PeerSync write = w.sync(true), read = w.sync(false);
  EXPECT_EQ(write.waitFor, PeerSync::kReadDone);
  EXPECT_EQ(write.raise, PeerSync::kWritten);
  EXPECT_TRUE(write.countsCall());
  EXPECT_EQ(read.waitFor, PeerSync::kWritten);
  EXPECT_EQ(read.raise, PeerSync::kReadDone);
  EXPECT_FALSE(read.countsCall());
  EXPECT_EQ(write.calls, read.calls) << "one count for both kernels";
  EXPECT_EQ(write.cancel, w.cancelWord());
  EXPECT_EQ(write.rank, 1);
  // The count, the arrival counter, the cancel word and the window addresses never overlap.
  const auto* cancel = reinterpret_cast<const char*>(w.cancelWord());
  const auto* calls = reinterpret_cast<const char*>(write.calls);
  const auto* arrived = reinterpret_cast<const char*>(write.arrived);
  const auto* addresses = reinterpret_cast<const char*>(words + 1);
  EXPECT_TRUE(calls >= cancel + sizeof(int) || calls + sizeof(*write.calls) <= cancel);
  EXPECT_TRUE(arrived >= cancel + sizeof(int) || arrived + sizeof(*write.arrived) <= cancel);
  EXPECT_TRUE(arrived >= calls + sizeof(*write.calls) || arrived + sizeof(*write.arrived) <= calls);
  EXPECT_LE(calls + sizeof(*write.calls), addresses);
  EXPECT_LE(arrived + sizeof(*write.arrived), addresses);
}

// The other link decision made at init: more NCCL channels on one node over host shared memory.
TEST(ShmChannels, OneNodeWithP2pDisabledGetsThem) {
  const ShmChannelFacts shm{1, 2, 16, 0, "1", nullptr, false};
  EXPECT_EQ(shmChannelsFor(shm), 16);
  ShmChannelFacts f = shm;
  f.shmMinCtas = 64;  // NCCL's most
  EXPECT_EQ(shmChannelsFor(f), 32);
}

TEST(ShmChannels, OtherLinksAndSettingsKeepNcclsChoice) {
  const ShmChannelFacts shm{1, 2, 16, 0, "1", nullptr, false};
  ShmChannelFacts f = shm;
  f.p2pDisable = nullptr;  // NVLink or PCIe peer access
  EXPECT_EQ(shmChannelsFor(f), 0);
  f = shm;
  f.p2pDisable = "0";
  EXPECT_EQ(shmChannelsFor(f), 0);
  f = shm;
  f.shmDisable = "1";  // sockets, where more channels do not help
  EXPECT_EQ(shmChannelsFor(f), 0);
  f = shm;
  f.nodes = 2;
  EXPECT_EQ(shmChannelsFor(f), 0);
  f = shm;
  f.nranks = 1;
  EXPECT_EQ(shmChannelsFor(f), 0);
  f = shm;
  f.shmMinCtas = 0;  // turned off
  EXPECT_EQ(shmChannelsFor(f), 0);
  f = shm;
  f.ncclMinCtas = 8;  // the world was made with the channels the user asked for
  EXPECT_EQ(shmChannelsFor(f), 0);
  f = shm;
  f.callersWorld = true;  // zpCommInitFromNccl
  EXPECT_EQ(shmChannelsFor(f), 0);
}

}  // namespace
}  // namespace zp
