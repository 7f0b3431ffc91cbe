// Command-line flags of the perf binaries (nccl-tests' meanings plus zpccl's own) and the size sweep they
// describe. Kept free of CUDA so that the host-only unit tests can exercise it.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace zp {
namespace perf {

// Timed rounds: at most this many (-r), and this many by default where a baseline is compared with zpccl
// (DESIGN.md, "Evidence": at least 5 alternating rounds), else one.
constexpr int kMaxRounds = 64;
constexpr int kDefaultComparedRounds = 5;

struct Options {
  size_t minBytes = size_t(32) << 20;  // -b
  size_t maxBytes = size_t(32) << 20;  // -e
  size_t stepBytes = size_t(1) << 20;  // -i: additive step, used when the factor is 1
  double stepFactor = 1.0;             // -f: multiplicative step when > 1
  int iters = 20;                      // -n
  int warmup = 5;                      // -w
  int rounds = 0;                      // -r: timed rounds, zpccl's and the baselines' in turn; 0: the default
  int check = 1;                       // -c
  int type = -1;                       // -d (zpDataType_t); -1: the op's default
  int redOp = -1;                      // -o (zpRedOp_t); -1: sum
  int bits = 0;                        // -B; 0: the op's default
  int blockSize = 256;                 // -G
  int threads = 0;                     // -t; 0: one per visible GPU (per process), 8 on the host backend
  int gpusPerThread = 1;               // -g; only 1 is supported
  std::string json;                    // -J
  std::string regime;                  // -R: free-text label copied into the table and the JSON
  int host = 0;                        // -H: 1 = host backend (ranks as threads, host memory)
  int nodes = 0;                       // -N: emulated nodes (ranksPerNode = ranks / nodes); 0: real layout
  int inPlace = 1;                     // -p: also run the in-place variant
  int nprocs = 0;                      // -P: processes meeting through a rendezvous directory; 0: 1 or MPI
  int procIndex = -1;                  // -I: this process's index in [0, nprocs)
  std::string rendezvousDir;           // -D (or $ZP_PERF_RENDEZVOUS)
  int shareGpus = 0;                   // -S: every process of a host numbers its ranks' GPUs from 0
  int stochastic = 0;                  // -s: qgZ's stochastic rounding (include/zpccl.h, Gradient rounding)
  int feedback = 0;                    // -E: qgZ's error feedback (residuals in the op's scratch)
};

enum class ParseResult { kOk, kHelp, kError };

// Parses argv (argv[0] is the program). On kError, *error says what was wrong. Reads $ZP_PERF_RENDEZVOUS
// when -D is absent. Checks ranges (bits 4|8, block a power of two in [32, 8192], -g 1, ...) but not what
// depends on the op or the machine.
ParseResult parseOptions(int argc, char** argv, Options* options, std::string* error);

// "64", "1K", "32M", "1G", "2GB", "4MiB": binary multiples as nccl-tests. False on garbage or overflow.
bool parseBytes(const char* text, size_t* bytes);

// Names as nccl-tests spells them, plus common aliases; -1 when unknown.
int parseDataType(const char* text);
int parseRedOp(const char* text);

// Sizes run, in order: minBytes, then *stepFactor (when > 1) or +stepBytes, up to maxBytes inclusive.
std::vector<size_t> sizeSweep(const Options& options);

void printUsage(FILE* out, const char* program);

// "1.00 MB"-style label for table headers and messages.
std::string formatBytes(size_t bytes);

}  // namespace perf
}  // namespace zp
