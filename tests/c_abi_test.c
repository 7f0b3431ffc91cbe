/* The installed header compiles as plain C11 and links against libzpccl.so: a one-rank host-backend
 * communicator is created, queried and destroyed through the C ABI, and one over a caller's transport written in C
 * (one rank: its all-gather copies its block, its all-to-all has nothing to move) runs a collective. */
#include <stdio.h>
#include <string.h>

#include "zpccl.h"

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "c_abi_test: %s failed at line %d\n", #cond, __LINE__); \
      return 1;                                                               \
    }                                                                         \
  } while (0)

static int finalized = 0;

static int oneRankAllGather(void* context, const void* sendbuf, void* recvbuf, size_t bytes, zpTransportCall_t* call) {
  (void)context;
  memcpy(recvbuf, sendbuf, bytes);
  call->received = bytes;
  return 0;
}

static int oneRankAllToAll(void* context, const void* sendbuf, const size_t* sendCounts, const size_t* sendOffsets,
                           void* recvbuf, const size_t* recvCounts, const size_t* recvOffsets,
                           zpTransportCall_t* call) {
  (void)context;
  memcpy((char*)recvbuf + recvOffsets[0], (const char*)sendbuf + sendOffsets[0], sendCounts[0]);
  call->received = recvCounts[0];
  return 0;
}

static void oneRankFinalize(void* context) { *(int*)context += 1; }

int main(void) {
  int version = 0;
  EXPECT(zpGetVersion(&version) == zpSuccess && version == ZPCCL_VERSION_CODE);
  EXPECT(strcmp(zpGetErrorString(zpSuccess), "no error") == 0);
  EXPECT(zpGetVersion(NULL) == zpInvalidArgument);
  EXPECT(strstr(zpGetLastError(NULL), "zpGetVersion") != NULL);

  zpUniqueId id;
  EXPECT(zpGetUniqueId(&id) == zpSuccess);
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.backend = zpBackendHost;
  zpComm_t comm = NULL;
  EXPECT(zpCommInitRankConfig(&comm, 1, id, 0, &config) == zpSuccess && comm != NULL);
  int count = 0, rank = -1, nodes = 0;
  EXPECT(zpCommCount(comm, &count) == zpSuccess && count == 1);
  EXPECT(zpCommUserRank(comm, &rank) == zpSuccess && rank == 0);
  EXPECT(zpCommNodeCount(comm, &nodes) == zpSuccess && nodes == 1);
  size_t bytes = 0;
  EXPECT(zpQuantPayloadSize(1000, 8, 256, &bytes) == zpSuccess && bytes == 16 + 1008);
  EXPECT(zpCommDestroy(comm) == zpSuccess);

  zpTransport_t transport = ZP_TRANSPORT_INITIALIZER;
  transport.nranks = 1;
  transport.rank = 0;
  transport.context = &finalized;
  transport.allGather = oneRankAllGather;
  transport.allToAll = oneRankAllToAll;
  transport.finalize = oneRankFinalize;
  EXPECT(zpCommInitFromTransport(&comm, &transport, NULL) == zpSuccess && comm != NULL);
  zpBackend_t backend = zpBackendDefault;
  EXPECT(zpCommBackend(comm, &backend) == zpSuccess && backend == zpBackendHost);
  float send[300], recv[300];
  for (int i = 0; i < 300; ++i) send[i] = (float)i;
  EXPECT(zpQuantReduceScatterA2A(send, recv, 300, zpFloat32, zpSum, comm, NULL) == zpSuccess);
  EXPECT(recv[0] == 0.0f && recv[299] > 297.0f && recv[299] < 301.0f);
  EXPECT(finalized == 0);
  EXPECT(zpCommDestroy(comm) == zpSuccess);
  EXPECT(finalized == 1);
  printf("c_abi_test: OK\n");
  return 0;
}
