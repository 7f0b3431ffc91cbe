// Init on the host backend: every rank leaves with the same verdict. Settings that shape the communicator (node
// layout, ranksPerNode, hpzSize, weightBits, gradBits, blockSize) are compared across ranks when they meet: a
// difference is zpInvalidUsage on every rank, at once, naming the setting and both values; settings that mean the
// same agree. A setting that every rank passed alike but the layout refuses fails every rank alike.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"

namespace {

struct InitOutcome {
  zpResult_t result = zpInternalError;
  std::string message;
  zpComm_t comm = nullptr;
};

// Inits nranks host-backend ranks on threads, each config edited by configure(rank, config), and returns what
// every rank got (communicators that were created are destroyed) and how long the slowest took.
std::vector<InitOutcome> initRanks(int nranks, const std::function<void(int, zpConfig_t*)>& configure,
                                   double* seconds = nullptr) {
  zpUniqueId id;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::vector<InitOutcome> out(nranks);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      zpConfig_t c = ZP_CONFIG_INITIALIZER;
      c.backend = zpBackendHost;
      configure(r, &c);
      InitOutcome& o = out[r];
      o.comm = reinterpret_cast<zpComm_t>(0x1);  // poisoned: a failed init resets it to NULL
      o.result = zpCommInitRankConfig(&o.comm, nranks, id, r, &c);
      o.message = zpGetLastError(nullptr);
      if (o.result == zpSuccess) {
        int hpz = 0;
        EXPECT_EQ(zpCommHpzSize(o.comm, &hpz), zpSuccess);
        o.message = "hpzSize " + std::to_string(hpz);
        EXPECT_EQ(zpCommDestroy(o.comm), zpSuccess) << zpGetLastError(nullptr);
      }
    });
  }
  for (auto& t : threads) t.join();
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

struct Disagreement {
  const char* name;
  std::function<void(int, zpConfig_t*)> configure;  // of 4 ranks
  const char* reason;                               // after "ranks disagree on "
};

TEST(InitHost, SettingsThatDifferAreRefusedOnEveryRank) {
  const Disagreement cases[] = {
      {"hpz 2,2,4,4", [](int r, zpConfig_t* c) { c->hpzSize = r < 2 ? 2 : 4; },
       "config->hpzSize: 2 on rank 0, 4 on rank 2"},
      {"hpz unset against 2", [](int r, zpConfig_t* c) { c->hpzSize = r == 3 ? 2 : ZP_CONFIG_UNDEF_INT; },
       "config->hpzSize: unset (the whole node, 4) on rank 0, 2 on rank 3"},
      // hpzSize 3 divides no node of 4: had every rank passed it, all would be refused by the layout alike.
      {"hpz 3 on one rank", [](int r, zpConfig_t* c) { c->hpzSize = r == 1 ? 3 : ZP_CONFIG_UNDEF_INT; },
       "config->hpzSize: unset (the whole node, 4) on rank 0, 3 on rank 1"},
      {"weightBits", [](int r, zpConfig_t* c) { c->weightBits = r == 1 ? 4 : ZP_CONFIG_UNDEF_INT; },
       "config->weightBits: 8 on rank 0, 4 on rank 1"},
      {"gradBits", [](int r, zpConfig_t* c) { c->gradBits = r == 2 ? 8 : 4; },
       "config->gradBits: 4 on rank 0, 8 on rank 2"},
      {"blockSize", [](int r, zpConfig_t* c) { c->blockSize = r == 3 ? 1024 : 256; },
       "config->blockSize: 256 on rank 0, 1024 on rank 3"},
      {"ranksPerNode", [](int r, zpConfig_t* c) { c->ranksPerNode = r == 1 ? 2 : 4; },
       "config->ranksPerNode: 4 on rank 0, 2 on rank 1"},
      {"ranksPerNode against nodeId",
       [](int r, zpConfig_t* c) {
         if (r == 2) {
           c->nodeId = 0;
         } else {
           c->ranksPerNode = 4;
         }
       },
       "the node layout: config->ranksPerNode on rank 0, config->nodeId on rank 2"},
      {"host against nodeId", [](int r, zpConfig_t* c) { c->nodeId = r == 1 ? 0 : ZP_CONFIG_UNDEF_INT; },
       "the node layout: the host (config->ranksPerNode and config->nodeId unset) on rank 0, config->nodeId on rank 1"},
  };
  for (const Disagreement& d : cases) {
    SCOPED_TRACE(d.name);
    double seconds = 0;
    const std::vector<InitOutcome> out = initRanks(4, d.configure, &seconds);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(out[r].result, zpInvalidUsage) << "rank " << r << ": " << out[r].message;
      EXPECT_EQ(out[r].message, std::string("zpCommInitRankConfig : ranks disagree on ") + d.reason) << "rank " << r;
      EXPECT_EQ(out[r].comm, nullptr) << "rank " << r;
    }
    EXPECT_LT(seconds, 5.0);  // no rank waits for a timeout
  }
}

TEST(InitHost, SettingsThatMeanTheSameAgree) {
  // An unset hpzSize is the whole node; an unset weightBits is the default 8.
  const std::vector<InitOutcome> out = initRanks(4, [](int r, zpConfig_t* c) {
    if (r % 2 == 1) c->hpzSize = 4;
    if (r == 2) c->weightBits = 8;
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out[r].result, zpSuccess) << "rank " << r << ": " << out[r].message;
    EXPECT_EQ(out[r].message, "hpzSize 4") << "rank " << r;
  }
  // Different node ids are the point of nodeId: one layout, two nodes.
  const std::vector<InitOutcome> nodes = initRanks(4, [](int r, zpConfig_t* c) {
    c->nodeId = r / 2 + 7;
    c->hpzSize = 2;
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(nodes[r].result, zpSuccess) << "rank " << r << ": " << nodes[r].message;
}

TEST(InitHost, ASettingTheLayoutRefusesFailsEveryRankAtOnce) {
  double seconds = 0;
  const std::vector<InitOutcome> out = initRanks(
      4, [](int, zpConfig_t* c) { c->hpzSize = 3; }, &seconds);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out[r].result, zpInvalidArgument) << "rank " << r << ": " << out[r].message;
    EXPECT_NE(out[r].message.find("zpCommInitRankConfig : hpzSize 3 does not divide the 4 ranks of node 0"),
              std::string::npos)
        << out[r].message;
    EXPECT_EQ(out[r].comm, nullptr);
  }
  EXPECT_LT(seconds, 5.0);
}

// Callers that pass different nranks, or the same rank twice, under one unique id cannot form a communicator: each of
// them is refused with zpInvalidUsage at once, naming what differs, also the ranks that came first and wait for their
// peers (they would otherwise wait out ZP_INIT_TIMEOUT_MS and fail otherwise than the caller refused at its arrival).
TEST(InitHost, NranksOrRanksThatDifferAreRefusedOnEveryCallerAtOnce) {
  struct Caller {
    int nranks, rank;
    const char* mention;  // in its message
  };
  struct Case {
    const char* name;
    std::vector<Caller> callers;  // joining in this order
  };
  const Case cases[] = {
      {"nranks 2 then 3",
       {{2, 0, "nranks 2 differs from the 3 of rank 1"}, {3, 1, "nranks 3 differs from the 2 given by another rank"}}},
      {"nranks 3, 3 then 4",
       {{3, 0, "nranks 3 differs from the 4 of rank 2"},
        {3, 1, "nranks 3 differs from the 4 of rank 2"},
        {4, 2, "nranks 4 differs from the 3 given by another rank"}}},
      {"rank 0 twice", {{2, 0, "a second caller joined as rank 0"}, {2, 0, "rank 0 already joined"}}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    zpUniqueId id;
    ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
    const size_t n = k.callers.size();
    std::vector<InitOutcome> out(n);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * i));  // join in order
        zpConfig_t c = ZP_CONFIG_INITIALIZER;
        c.backend = zpBackendHost;
        InitOutcome& o = out[i];
        o.comm = reinterpret_cast<zpComm_t>(0x1);
        o.result = zpCommInitRankConfig(&o.comm, k.callers[i].nranks, id, k.callers[i].rank, &c);
        o.message = zpGetLastError(nullptr);
        if (o.result == zpSuccess) zpCommDestroy(o.comm);
      });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(out[i].result, zpInvalidUsage) << "caller " << i << ": " << out[i].message;
      EXPECT_NE(out[i].message.find("zpCommInitRankConfig : "), std::string::npos) << out[i].message;
      EXPECT_NE(out[i].message.find(k.callers[i].mention), std::string::npos)
          << "caller " << i << ": " << out[i].message;
      EXPECT_EQ(out[i].comm, nullptr);
    }
    EXPECT_LT(seconds, 5.0);  // no caller waits for ZP_INIT_TIMEOUT_MS
    // The refusal leaves nothing behind under the id: matching callers form a communicator with it.
    std::vector<zpResult_t> again(2, zpInternalError);
    std::vector<std::thread> pair;
    for (int r = 0; r < 2; ++r) {
      pair.emplace_back([&, r] {
        zpConfig_t c = ZP_CONFIG_INITIALIZER;
        c.backend = zpBackendHost;
        zpComm_t comm = nullptr;
        again[r] = zpCommInitRankConfig(&comm, 2, id, r, &c);
        if (again[r] == zpSuccess) EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
      });
    }
    for (auto& t : pair) t.join();
    EXPECT_EQ(again, std::vector<zpResult_t>(2, zpSuccess));
  }
}

}  // namespace
