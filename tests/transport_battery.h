// Every host-backend collective on one rank, in several types, widths and buffer layouts, with inputs that depend
// only on the rank: what the tests of ranks as processes compare byte for byte with thread-ranks on the same inputs
// (tests/test_transport_host.cc over callbacks, tests/test_mpi_host.cc over MPI).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "include/zpccl.h"
#include "tests/collective_check.h"

namespace zptest {

// Each output's name and bytes.
using BatteryOutputs = std::vector<std::pair<std::string, std::vector<unsigned char>>>;

inline BatteryOutputs runBattery(int rank, int nranks, zpComm_t comm) {
  BatteryOutputs out;
  auto keep = [&](const std::string& name, const void* p, size_t bytes) {
    const auto* b = static_cast<const unsigned char*>(p);
    out.emplace_back(name, std::vector<unsigned char>(b, b + bytes));
  };
  auto check = [&](zpResult_t res, const char* what) {
    EXPECT_EQ(res, zpSuccess) << what << " on rank " << rank << ": " << zpGetLastError(comm);
  };
  const size_t n = 3000 + 17;
  int hpz = 0;
  EXPECT_EQ(zpCommHpzSize(comm, &hpz), zpSuccess);
  // hpZ needs nodes of equal size: on uneven layouts its calls are left out (on every rank, alike).
  size_t hpzOffset = 0, hpzCount = 0;
  const bool hpzUsable = zpHierSecondaryShard(static_cast<size_t>(hpz), &hpzOffset, &hpzCount, comm) == zpSuccess;
  uint64_t seed = 100;
  for (zpDataType_t type : {zpBfloat16, zpFloat32, zpFloat16}) {
    const size_t esz = zpcheck::bytesOf(type);
    const std::string t = std::to_string(static_cast<int>(type));
    zpcheck::Buffer x(n * esz), grads(nranks * n * esz), full(nranks * n * esz), shard(n * esz), hp(hpz * n * esz);
    zpcheck::fillRandom(type, x.data(), n, seed++, rank);
    zpcheck::fillRandom(type, grads.data(), nranks * n, seed++, rank);
    check(zpQuantAllGather(x.data(), full.data(), n, type, comm, nullptr), "qwZ");
    keep("qwZ " + t, full.data(), full.size());
    const zpQuantOptions_t int4 = {4, 64};
    check(zpQuantAllGatherEx(x.data(), full.data(), n, type, &int4, comm, nullptr), "qwZ int4");
    keep("qwZ int4/64 " + t, full.data(), full.size());
    check(zpQuantReduceScatterA2A(grads.data(), shard.data(), n, type, zpSum, comm, nullptr), "qgZ");
    keep("qgZ sum " + t, shard.data(), shard.size());
    const zpQuantOptions_t int8 = {8, 128};
    check(zpQuantReduceScatterA2AEx(grads.data(), shard.data(), n, type, zpAvg, &int8, comm, nullptr), "qgZ avg");
    keep("qgZ avg int8/128 " + t, shard.data(), shard.size());
    const zpQuantOptions_t hpz8 = {8, 256};
    if (hpzUsable) {
      check(zpHierAllGatherEx(x.data(), hp.data(), n, type, &hpz8, comm, nullptr), "hpZ int8");
      keep("hpZ int8 " + t, hp.data(), hp.size());
    }
    // The all-reduce of nranks * n elements (its last shard partial), out of place and in place.
    check(zpQuantAllReduce(grads.data(), full.data(), nranks * n, type, zpAvg, comm, nullptr), "all-reduce");
    keep("all-reduce avg " + t, full.data(), full.size());
    zpGradOptions_t ar = ZP_GRAD_OPTIONS_INITIALIZER;
    ar.bits = 8;
    ar.blockSize = 32;
    check(zpQuantAllReduceEx(grads.data(), grads.data(), nranks * n, type, zpSum, &ar, comm, nullptr),
          "all-reduce in place");
    keep("all-reduce sum int8/32 in place " + t, grads.data(), grads.size());
  }
  for (zpDataType_t type : {zpInt32, zpUint8}) {
    if (!hpzUsable) break;
    const size_t esz = zpcheck::bytesOf(type);
    zpcheck::Buffer x(n * esz), hp(hpz * n * esz);
    zpcheck::fillBytes(x.data(), x.size(), seed++, rank);
    check(zpHierAllGather(x.data(), hp.data(), n, type, comm, nullptr), "hpZ exact");
    keep("hpZ exact " + std::to_string(static_cast<int>(type)), hp.data(), hp.size());
  }
  // In place: qwZ from this rank's part of recvbuff, qgZ into this rank's slice of sendbuff.
  zpcheck::Buffer full(nranks * n * 4), grads(nranks * n * 4);
  zpcheck::fillRandom(zpFloat32, full.data() + rank * n * 4, n, seed++, rank);
  check(zpQuantAllGather(full.data() + rank * n * 4, full.data(), n, zpFloat32, comm, nullptr), "qwZ in place");
  keep("qwZ in place", full.data(), full.size());
  zpcheck::fillRandom(zpFloat32, grads.data(), nranks * n, seed++, rank);
  check(zpQuantReduceScatterA2A(grads.data(), grads.data() + rank * n * 4, n, zpFloat32, zpSum, comm, nullptr),
        "qgZ in place");
  keep("qgZ in place", grads.data(), grads.size());
  // Stochastic rounding with error feedback, two calls (the residuals carry over).
  size_t hopCount = 0;
  EXPECT_EQ(zpGradHopResidualCount(n, &hopCount, comm), zpSuccess);
  std::vector<uint16_t> residual(nranks * n, 0), hop(std::max<size_t>(hopCount, 1), 0);
  zpcheck::Buffer shard(n * 4);
  for (int step = 0; step < 2; ++step) {
    zpcheck::fillRandom(zpFloat32, grads.data(), nranks * n, seed++, rank);
    zpGradOptions_t g = ZP_GRAD_OPTIONS_INITIALIZER;
    g.rounding = zpRoundStochastic;
    g.seed = 5;
    g.residual = residual.data();
    g.residualCount = residual.size();
    g.hopResidual = hopCount ? hop.data() : nullptr;
    g.hopResidualCount = hopCount;
    check(zpQuantReduceScatterA2AEx2(grads.data(), shard.data(), n, zpFloat32, zpSum, &g, comm, nullptr),
          "qgZ stochastic");
    keep("qgZ stochastic, feedback " + std::to_string(step), shard.data(), shard.size());
  }
  keep("residual", residual.data(), residual.size() * 2);
  keep("hop residual", hop.data(), hop.size() * 2);
  // Count 0: the ranks still meet.
  check(zpQuantAllGather(full.data(), full.data(), 0, zpFloat32, comm, nullptr), "qwZ count 0");
  return out;
}

// The battery on nranks thread-ranks of the threaded host backend, each rank's config ZP_CONFIG_INITIALIZER with
// backend host, then configure(rank, &config): the reference that ranks as processes must equal. Each rank's
// outputs, in rank order.
inline std::vector<BatteryOutputs> batteryOverThreads(int nranks,
                                                      const std::function<void(int, zpConfig_t*)>& configure) {
  std::vector<BatteryOutputs> all(nranks);
  zpUniqueId id;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) {
    threads.emplace_back([&, r] {
      zpConfig_t c = ZP_CONFIG_INITIALIZER;
      c.backend = zpBackendHost;
      configure(r, &c);
      zpComm_t comm = nullptr;
      ASSERT_EQ(zpCommInitRankConfig(&comm, nranks, id, r, &c), zpSuccess) << zpGetLastError(nullptr);
      all[r] = runBattery(r, nranks, comm);
      EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
    });
  }
  for (auto& t : threads) t.join();
  return all;
}

// rank's outputs against the reference's, byte for byte.
inline void expectSameOutputs(const BatteryOutputs& got, const BatteryOutputs& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << where;
    ASSERT_EQ(got[i].second.size(), want[i].second.size()) << where << ": " << got[i].first;
    EXPECT_GT(got[i].second.size(), 0u) << where << ": " << got[i].first;
    EXPECT_TRUE(zpcheck::sameBits(got[i].second.data(), want[i].second.data(), got[i].second.size(), 1))
        << where << ": " << got[i].first;
  }
}

}  // namespace zptest
