// The JSON file of the perf binaries (-J): an object {"provenance": how the file was made, "rows": one object per
// table row}. A small hand-written writer, so that the harness needs nothing beyond the standard library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zp {
namespace perf {

// Appends JSON tokens with the commas in the right places. Non-finite numbers become null (JSON has no NaN).
class JsonWriter {
 public:
  JsonWriter& beginObject();
  JsonWriter& endObject();
  JsonWriter& beginArray();
  JsonWriter& endArray();
  JsonWriter& key(const char* name);
  JsonWriter& string(const std::string& value);
  JsonWriter& number(double value);
  JsonWriter& integer(long long value);
  JsonWriter& boolean(bool value);
  JsonWriter& null();
  const std::string& str() const { return out_; }

 private:
  void separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool afterKey_ = false;
};

// One measured variant (out-of-place, in-place or a baseline). Absent variants are written as null.
struct Measure {
  bool present = false;
  double timeUs = 0;  // per call: the median over the timed rounds (roundsUs)
  double algbw = 0;   // GB/s, of timeUs
  double busbw = 0;   // GB/s, of timeUs
  bool checked = false;
  uint64_t wrong = 0;
  double enqueueUs = 0;  // of timeUs, the host's time to enqueue one call (mean over the rounds)
  // Each timed round's time per call (the slowest rank's), in the order they ran: median and spread can be
  // recomputed from the file. Written only when there are some.
  std::vector<double> roundsUs;
};

// The NCCL settings zpccl's own communicators get (src/cuda/cuda_backend.cc: ZP_NCCL_MIN_CTAS, ZP_SHM_MIN_CTAS,
// ZP_NET_CHANNELS_PER_PEER); 0 leaves NCCL's default. All 0: the plain NCCL baseline already runs with them.
struct NcclChannels {
  int minCtas = 0;
  int maxCtas = 0;
  int netChannelsPerPeer = 0;
  bool any() const { return minCtas > 0 || maxCtas > 0 || netChannelsPerPeer > 0; }
};

// How a result file was made: perf/provenance.py's record (schema "zpccl-provenance/1"), the same keys from C++.
// Strings left empty and counts below zero are written as null (unknown).
struct Provenance {
  std::string commit;   // the commit the binary was built from (perf/provenance.h says when "dirty" is known)
  int dirty = -1;       // 1: tracked files differed from it, 0: they did not, -1: unknown
  std::string command;  // argv, shell-quoted
  std::string cwd;
  std::vector<std::pair<std::string, std::string>> env;  // the steering variables (steeringEnvironment), sorted
  std::string regime;
  std::string host;
  std::string timeUtc;  // ISO 8601, seconds, "+00:00"
  int gpuCount = 0;
  std::vector<std::string> gpuModels;  // distinct, sorted
  std::string driver;                  // the kernel driver's release (/proc/driver/nvidia/version)
  std::string cudaRuntime;             // "13.0"
  std::string ncclLoaded;              // "2.28.3": ncclGetVersion of the NCCL this process loaded
  std::string ncclFile;                // the file it was loaded from
  std::string zpcclVersion;            // zpGetVersion
  std::string zpcclLibrary;            // the file holding zpccl's code (the binary itself when linked statically)
};

// Bytes one rank sends per call, averaged over ranks (host backend): zpccl's from the op's plan formula,
// NCCL's ring for the same collective.
struct WireBytes {
  double intra = 0;
  double inter = 0;
};

struct ResultRow {
  std::string op;
  std::string regime;
  std::string grad;     // gradient rounding of the run (-s, -E): "sr", "ef", "sr+ef"; empty (no key): neither
  std::string backend;  // "cuda" or "host"
  size_t size = 0;      // logical bytes
  size_t count = 0;     // elements of the logical size
  std::string type;
  std::string redop;  // empty when the op does not reduce
  int bits = 0;       // 0: not quantized
  int block = 0;      // 0: not quantized
  int ranks = 0;
  int nodes = 0;
  Measure oop;
  Measure ip;
  std::string baselineName;  // "nccl", "memcpy", or empty
  Measure baseline;
  double speedup = 0;  // baseline time / oop time (medians); written only with a baseline
  // Of the rounds' own ratios (each round's baseline time / its zpccl time): the least and the greatest.
  double speedupMin = 0, speedupMax = 0;
  // NCCL with zpccl's own communicators' settings (ncclConfig), beside the default NCCL baseline; rows whose
  // baseline is NCCL write "nccl_config", and "nccl_matched" and "speedup_matched" when ncclConfig.any().
  NcclChannels ncclConfig;
  Measure matched;
  double speedupMatched = 0;
  bool hasWire = false;
  WireBytes zpWire;
  WireBytes ringWire;
  // zpccl's tunables set for the run (ZP_* variables, debug output aside), so that a row says how it was made;
  // written as "env" only when there are some.
  std::vector<std::pair<std::string, std::string>> env;
};

// The ZP_* variables of this process's environment that change what zpccl does (ZP_DEBUG*, and the harness's
// ZP_GPU_CHECK_* and ZP_PERF_*, left out), by name, and the pathTunables() with their effective values when they
// are not set.
std::vector<std::pair<std::string, std::string>> zpTunablesInEnvironment();

// The tunables that choose how a collective runs, with the values the library uses: every row records them,
// set or not (zpTunablesInEnvironment).
std::vector<std::pair<const char*, int64_t>> pathTunables();

std::string rowToJson(const ResultRow& row);
std::string provenanceToJson(const Provenance& provenance);
// The whole file: "{\"provenance\": {...},\n \"rows\": [\n  row,\n  row\n ]}\n".
std::string perfFileJson(const Provenance& provenance, const std::vector<ResultRow>& rows);

// Writes path.tmp, then renames it over path, so that a reader never sees half a file. The harness rewrites
// the whole file after every size, so a run that dies midway leaves the rows it finished.
bool writeJsonFile(const std::string& path, const Provenance& provenance, const std::vector<ResultRow>& rows,
                   std::string* error);

}  // namespace perf
}  // namespace zp
