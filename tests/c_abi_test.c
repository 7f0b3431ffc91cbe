/* The installed header compiles as plain C11 and links against libzpccl.so: a one-rank host-backend
 * communicator is created, queried and destroyed through the C ABI. */
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
  printf("c_abi_test: OK\n");
  return 0;
}
