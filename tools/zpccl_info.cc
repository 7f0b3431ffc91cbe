// zpccl-info: brings up one communicator over every visible GPU (a thread each), or over thread-ranks of the
// host backend with an emulated layout when there is no GPU, and prints the topology and groups each rank
// found. The first half of README's main job.
//
//   zpccl-info [-H] [-r ranks] [-N nodes]     -H forces the host backend; -r/-N size the emulated layout
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "include/zpccl.h"

namespace {

// One line per rank, printed in rank order once every thread is done.
int report(int rank, zpComm_t comm, std::string* line) {
  int nranks = 0, dev = -1, nodes = 0, node = 0, localRank = 0, localSize = 0, hpzRank = 0, hpzSize = 0;
  zpBackend_t backend;
  if (zpCommCount(comm, &nranks) || zpCommCuDevice(comm, &dev) || zpCommBackend(comm, &backend) ||
      zpCommNodeCount(comm, &nodes) || zpCommNodeRank(comm, &node) || zpCommLocalRank(comm, &localRank) ||
      zpCommLocalSize(comm, &localSize) || zpCommHpzRank(comm, &hpzRank) || zpCommHpzSize(comm, &hpzSize)) {
    fprintf(stderr, "rank %d: query failed: %s\n", rank, zpGetLastError(comm));
    return 1;
  }
  char text[160];
  snprintf(text, sizeof(text), "  rank %2d/%d  %-4s dev %2d  node %d/%d  local %d/%d  hpZ %d/%d", rank, nranks,
           backend == zpBackendHost ? "host" : "cuda", dev, node, nodes, localRank, localSize, hpzRank, hpzSize);
  *line = text;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool host = false;
  int ranks = 8, nodes = 2;
  for (int opt; (opt = getopt(argc, argv, "Hr:N:h")) != -1;) {
    switch (opt) {
      case 'H':
        host = true;
        break;
      case 'r':
        ranks = atoi(optarg);
        break;
      case 'N':
        nodes = atoi(optarg);
        break;
      default:
        fprintf(stderr, "usage: %s [-H] [-r ranks] [-N nodes]\n", argv[0]);
        return 2;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (gpus == 0) host = true;
  if (!host) ranks = gpus;  // the cuda backend takes its layout from the hosts: -N is for emulated nodes only
  if (host && (ranks <= 0 || nodes <= 0 || ranks % nodes != 0)) {
    fprintf(stderr, "ranks (%d) must be a positive multiple of nodes (%d)\n", ranks, nodes);
    return 2;
  }
  int version = 0;
  zpGetVersion(&version);
  printf("# zpccl %d.%d.%d: %d rank(s) on the %s backend%s\n", version / 10000, version / 100 % 100, version % 100,
         ranks, host ? "host" : "cuda",
         host ? (" as " + std::to_string(nodes) + " emulated node(s) of threads").c_str() : " (one thread per GPU)");

  zpUniqueId id;
  if (zpGetUniqueId(&id) != zpSuccess) {
    fprintf(stderr, "zpGetUniqueId: %s\n", zpGetLastError(nullptr));
    return 1;
  }
  std::vector<int> failed(ranks, 0);
  std::vector<std::string> lines(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      if (host) {
        config.backend = zpBackendHost;
        config.ranksPerNode = ranks / nodes;
      } else if (cudaSetDevice(r) != cudaSuccess) {
        failed[r] = 1;
        return;
      }
      zpComm_t comm = nullptr;
      if (zpCommInitRankConfig(&comm, ranks, id, r, &config) != zpSuccess) {
        fprintf(stderr, "rank %d: zpCommInitRankConfig: %s\n", r, zpGetLastError(nullptr));
        failed[r] = 1;
        return;
      }
      failed[r] = report(r, comm, &lines[r]);
      if (zpCommDestroy(comm) != zpSuccess) failed[r] = 1;
    });
  }
  for (auto& t : threads) t.join();
  int bad = 0;
  for (int r = 0; r < ranks; ++r) {
    if (!lines[r].empty()) printf("%s\n", lines[r].c_str());
    bad += failed[r];
  }
  printf("# %s\n", bad ? "FAILED" : "communicators up and down on every rank");
  return bad ? 1 : 0;
}
