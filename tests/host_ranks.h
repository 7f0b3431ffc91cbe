// Runs a test body on N thread-ranks of one host-backend communicator, as a user of the host backend would. With
// ZP_TEST_TRANSPORT=loopback in the environment the ranks meet through a caller's transport instead
// (zpCommInitFromTransport over tests/loopback_transport.h, which copies every byte as a transport between
// processes does), so that the collective suites also run over the callbacks (tests/test_transport_host.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "include/zpccl.h"
#include "tests/loopback_transport.h"

namespace zptest {

// Each rank's config starts from ZP_CONFIG_INITIALIZER with backend = host; configure may change it per rank.
using ConfigureFn = std::function<void(int rank, zpConfig_t* config)>;
using RankFn = std::function<void(int rank, zpComm_t comm)>;

// Creates the communicator on nranks threads, runs body on each, destroys it. Failures are gtest failures.
inline bool overLoopbackTransport() {
  const char* mode = std::getenv("ZP_TEST_TRANSPORT");
  return mode != nullptr && std::strcmp(mode, "loopback") == 0;
}

inline void runHostRanks(int nranks, const ConfigureFn& configure, const RankFn& body) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  const bool loopback = overLoopbackTransport();
  LoopbackHub hub(nranks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      config.backend = zpBackendHost;
      if (configure) configure(rank, &config);
      zpComm_t comm = nullptr;
      const zpTransport_t transport = hub.transport(rank);
      zpResult_t res = loopback ? zpCommInitFromTransport(&comm, &transport, &config)
                                : zpCommInitRankConfig(&comm, nranks, id, rank, &config);
      EXPECT_EQ(res, zpSuccess) << "rank " << rank << ": " << zpGetLastError(nullptr);
      if (res != zpSuccess) return;
      body(rank, comm);
      EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace zptest
