// Runs a test body on N thread-ranks of one host-backend communicator, as a user of the host backend would.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "include/zpccl.h"

namespace zptest {

// Each rank's config starts from ZP_CONFIG_INITIALIZER with backend = host; configure may change it per rank.
using ConfigureFn = std::function<void(int rank, zpConfig_t* config)>;
using RankFn = std::function<void(int rank, zpComm_t comm)>;

// Creates the communicator on nranks threads, runs body on each, destroys it. Failures are gtest failures.
inline void runHostRanks(int nranks, const ConfigureFn& configure, const RankFn& body) {
  zpUniqueId id;
  ASSERT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nranks; ++rank) {
    threads.emplace_back([&, rank] {
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      config.backend = zpBackendHost;
      if (configure) configure(rank, &config);
      zpComm_t comm = nullptr;
      zpResult_t res = zpCommInitRankConfig(&comm, nranks, id, rank, &config);
      EXPECT_EQ(res, zpSuccess) << "rank " << rank << ": " << zpGetLastError(nullptr);
      if (res != zpSuccess) return;
      body(rank, comm);
      EXPECT_EQ(zpCommDestroy(comm), zpSuccess) << zpGetLastError(nullptr);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace zptest
