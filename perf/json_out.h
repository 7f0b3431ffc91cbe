// The JSON file of the perf binaries (-J): one array, one object per table row. A small hand-written writer,
// so that the harness needs nothing beyond the standard library.
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
  JsonWriter& null();
  const std::string& str() const { return out_; }

 private:
  void separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool afterKey_ = false;
};

// One measured variant (out-of-place, in-place or the baseline). Absent variants are written as null.
struct Measure {
  bool present = false;
  double timeUs = 0;
  double algbw = 0;  // GB/s
  double busbw = 0;  // GB/s
  bool checked = false;
  uint64_t wrong = 0;
  double enqueueUs = 0;  // of timeUs, the host's time to enqueue one call
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
  double speedup = 0;  // baseline time / oop time; written only with a baseline
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
std::string rowsToJson(const std::vector<ResultRow>& rows);  // "[\n row,\n row\n]\n"

// Writes path.tmp, then renames it over path, so that a reader never sees half a file. The harness rewrites
// the whole file after every size, so a run that dies midway leaves the rows it finished.
bool writeJsonFile(const std::string& path, const std::vector<ResultRow>& rows, std::string* error);

}  // namespace perf
}  // namespace zp
