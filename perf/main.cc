// The one main of the perf binaries (nccl-tests' shape): each binary's own file defines perfOps(), the harness
// runs them (perf/common.h).
#include "perf/common.h"

int main(int argc, char** argv) { return zp::perf::perfMain(zp::perf::perfOps(), argc, argv); }
