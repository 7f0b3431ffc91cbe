/* A C program as a user of an installed zpccl builds it: `cc $(pkg-config --cflags zpccl) ...
 * $(pkg-config --libs zpccl) -pthread` (tools/run-tests.sh builds it against a `meson install` tree). Two
 * thread-ranks of the host backend run qwZ's all-gather and qgZ's reduce-scatter on int8 codes, with values the
 * block format carries exactly (integers in [-127, 127], each block holding +-127: scale 1), so that every output
 * element is checked for equality. Exit status 0 when every element is right. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "zpccl.h"

enum { kRanks = 2, kShard = 512 };

static zpUniqueId uniqueId;

typedef struct {
  int rank;
  int wrong;     /* output elements that differ from the expected values */
  char why[256]; /* the first failed call or element */
} RankResult;

/* Rank r's value at element i of a tensor: an integer in [-127, 127]; every 255 consecutive elements hold all of
 * them, so each block of 256 has absmax 127 and its codes are the values themselves. */
static float valueOf(int rank, int i) { return (float)((i + 7 * rank) % 255 - 127); }

static int fail(RankResult* r, const char* call, zpResult_t result, zpComm_t comm) {
  snprintf(r->why, sizeof(r->why), "rank %d: %s returned %d: %s", r->rank, call, (int)result, zpGetLastError(comm));
  return 1;
}

static void* runRank(void* arg) {
  RankResult* r = (RankResult*)arg;
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendHost;
  config.weightBits = 8;
  config.gradBits = 8;
  zpComm_t comm = NULL;
  zpResult_t result = zpCommInitRankConfig(&comm, kRanks, uniqueId, r->rank, &config);
  if (result != zpSuccess) {
    r->wrong = fail(r, "zpCommInitRankConfig", result, NULL);
    return NULL;
  }
  static float shard[kRanks][kShard], full[kRanks][kRanks * kShard];
  static float grads[kRanks][kRanks * kShard], gradShard[kRanks][kShard];
  for (int i = 0; i < kShard; ++i) shard[r->rank][i] = valueOf(r->rank, i);
  for (int i = 0; i < kRanks * kShard; ++i) grads[r->rank][i] = valueOf(r->rank, i);

  result = zpQuantAllGather(shard[r->rank], full[r->rank], kShard, zpFloat32, comm, NULL);
  if (result != zpSuccess) {
    r->wrong = fail(r, "zpQuantAllGather", result, comm);
  } else {
    for (int i = 0; i < kRanks * kShard; ++i) {
      const float expected = valueOf(i / kShard, i % kShard);
      if (full[r->rank][i] != expected && r->wrong++ == 0) {
        snprintf(r->why, sizeof(r->why), "rank %d: zpQuantAllGather element %d is %g, expected %g", r->rank, i,
                 full[r->rank][i], expected);
      }
    }
  }
  result = zpQuantReduceScatterA2A(grads[r->rank], gradShard[r->rank], kShard, zpFloat32, zpSum, comm, NULL);
  if (result != zpSuccess) {
    r->wrong += fail(r, "zpQuantReduceScatterA2A", result, comm);
  } else {
    for (int i = 0; i < kShard; ++i) {
      float expected = 0;
      for (int peer = 0; peer < kRanks; ++peer) expected += valueOf(peer, r->rank * kShard + i);
      if (gradShard[r->rank][i] != expected && r->wrong++ == 0) {
        snprintf(r->why, sizeof(r->why), "rank %d: zpQuantReduceScatterA2A element %d is %g, expected %g", r->rank, i,
                 gradShard[r->rank][i], expected);
      }
    }
  }
  result = zpCommDestroy(comm);
  if (result != zpSuccess) r->wrong += fail(r, "zpCommDestroy", result, NULL);
  return NULL;
}

int main(void) {
  int version = 0;
  if (zpGetVersion(&version) != zpSuccess || version != ZPCCL_VERSION_CODE) {
    fprintf(stderr, "pkgconfig_consumer: library version %d, header ZPCCL_VERSION_CODE %d\n", version,
            ZPCCL_VERSION_CODE);
    return 1;
  }
  if (zpGetUniqueId(&uniqueId) != zpSuccess) {
    fprintf(stderr, "pkgconfig_consumer: zpGetUniqueId: %s\n", zpGetLastError(NULL));
    return 1;
  }
  RankResult results[kRanks];
  pthread_t threads[kRanks];
  for (int rank = 0; rank < kRanks; ++rank) {
    memset(&results[rank], 0, sizeof(results[rank]));
    results[rank].rank = rank;
    if (pthread_create(&threads[rank], NULL, runRank, &results[rank]) != 0) {
      fprintf(stderr, "pkgconfig_consumer: pthread_create failed for rank %d\n", rank);
      return 1;
    }
  }
  int wrong = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    pthread_join(threads[rank], NULL);
    if (results[rank].wrong) fprintf(stderr, "pkgconfig_consumer: %s\n", results[rank].why);
    wrong += results[rank].wrong;
  }
  if (wrong) {
    fprintf(stderr, "pkgconfig_consumer: %d wrong\n", wrong);
    return 1;
  }
  printf("pkgconfig_consumer: zpccl %d, qwZ all-gather and qgZ reduce-scatter on %d host ranks: OK\n", version, kRanks);
  return 0;
}
