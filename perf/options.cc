#include "perf/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

#include "host/dtype.h"
#include "host/quant_format.h"

namespace zp {
namespace perf {

namespace {

// A sweep longer than this is a typo (e.g. -i 1 with -e 1G), not a measurement plan.
constexpr size_t kMaxSweepLength = 100000;

bool parseInt(const char* text, int* value) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    return false;
  *value = static_cast<int>(v);
  return true;
}

bool parseDouble(const char* text, double* value) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *value = v;
  return true;
}

bool equalsIgnoreCase(const char* a, const char* b) {
  for (; *a && *b; ++a, ++b) {
    char x = *a, y = *b;
    if (x >= 'A' && x <= 'Z') x = char(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = char(y - 'A' + 'a');
    if (x != y) return false;
  }
  return *a == *b;
}

struct Flag {
  char shortName;
  const char* longName;
  // Returns "" on success, else what is wrong with the value.
  std::function<std::string(const char*, Options*)> apply;
  // Non-null for switches whose value may be left out ("-H" alone means "-H 1"); then only "0" or "1" after
  // them is taken as their value.
  const char* implicitValue = nullptr;
};

std::string intFlag(const char* v, int* out, int lo, int hi, const char* what) {
  int x;
  if (!parseInt(v, &x) || x < lo || x > hi)
    return std::string(what) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  *out = x;
  return "";
}

std::string bytesFlag(const char* v, size_t* out, const char* what) {
  if (!parseBytes(v, out)) return std::string(what) + " must be a byte count such as 1024, 64K, 32M or 1G";
  return "";
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {'b', "minbytes", [](const char* v, Options* o) { return bytesFlag(v, &o->minBytes, "-b"); }},
      {'e', "maxbytes", [](const char* v, Options* o) { return bytesFlag(v, &o->maxBytes, "-e"); }},
      {'i', "stepbytes", [](const char* v, Options* o) { return bytesFlag(v, &o->stepBytes, "-i"); }},
      {'f', "stepfactor",
       [](const char* v, Options* o) -> std::string {
         if (!parseDouble(v, &o->stepFactor) || o->stepFactor < 1.0) return "-f must be a number >= 1";
         return "";
       }},
      {'n', "iters", [](const char* v, Options* o) { return intFlag(v, &o->iters, 1, 1000000, "-n"); }},
      {'w', "warmup_iters", [](const char* v, Options* o) { return intFlag(v, &o->warmup, 0, 1000000, "-w"); }},
      {'r', "rounds", [](const char* v, Options* o) { return intFlag(v, &o->rounds, 1, kMaxRounds, "-r"); }},
      {'c', "check", [](const char* v, Options* o) { return intFlag(v, &o->check, 0, 1, "-c"); }},
      {'d', "datatype",
       [](const char* v, Options* o) -> std::string {
         o->type = parseDataType(v);
         if (o->type < 0) return std::string("-d: unknown data type '") + v + "'";
         return "";
       }},
      {'o', "op",
       [](const char* v, Options* o) -> std::string {
         o->redOp = parseRedOp(v);
         if (o->redOp < 0) return std::string("-o: unknown reduction '") + v + "' (sum, avg)";
         return "";
       }},
      {'g', "ngpus",
       [](const char* v, Options* o) -> std::string {
         int g;
         if (!parseInt(v, &g) || g != 1) return "-g: only one GPU per thread is supported (-g 1); use -t for more";
         o->gpusPerThread = g;
         return "";
       }},
      {'t', "nthreads", [](const char* v, Options* o) { return intFlag(v, &o->threads, 1, 4096, "-t"); }},
      {'B', "bits",
       [](const char* v, Options* o) -> std::string {
         int b;
         if (!parseInt(v, &b) || !isValidBits(b)) return std::string("-B must be ") + kBitsRule;
         o->bits = b;
         return "";
       }},
      {'G', "blocksize",
       [](const char* v, Options* o) -> std::string {
         int g;
         if (!parseInt(v, &g) || !isValidBlockSize(g)) return std::string("-G must be ") + kBlockSizeRule;
         o->blockSize = g;
         return "";
       }},
      {'J', "json",
       [](const char* v, Options* o) -> std::string {
         if (*v == '\0') return "-J needs a file name";
         o->json = v;
         return "";
       }},
      {'R', "regime",
       [](const char* v, Options* o) -> std::string {
         o->regime = v;
         return "";
       }},
      {'H', "host", [](const char* v, Options* o) { return intFlag(v, &o->host, 0, 1, "-H"); }, "1"},
      {'N', "nodes", [](const char* v, Options* o) { return intFlag(v, &o->nodes, 1, 1 << 20, "-N"); }},
      {'p', "inplace", [](const char* v, Options* o) { return intFlag(v, &o->inPlace, 0, 1, "-p"); }},
      {'S', "sharegpus", [](const char* v, Options* o) { return intFlag(v, &o->shareGpus, 0, 1, "-S"); }, "1"},
      {'s', "stochastic", [](const char* v, Options* o) { return intFlag(v, &o->stochastic, 0, 1, "-s"); }, "1"},
      {'E', "feedback", [](const char* v, Options* o) { return intFlag(v, &o->feedback, 0, 1, "-E"); }, "1"},
      {'P', "nprocs", [](const char* v, Options* o) { return intFlag(v, &o->nprocs, 1, 4096, "-P"); }},
      {'I', "procindex", [](const char* v, Options* o) { return intFlag(v, &o->procIndex, 0, 4095, "-I"); }},
      {'D', "rendezvous",
       [](const char* v, Options* o) -> std::string {
         if (*v == '\0') return "-D needs a directory";
         o->rendezvousDir = v;
         return "";
       }},
  };
  return table;
}

std::string checkConsistency(Options* o) {
  if (o->minBytes > o->maxBytes) return "-b must not exceed -e";
  if (o->stepFactor <= 1.0 && o->stepBytes == 0 && o->minBytes < o->maxBytes)
    return "-i must be positive when -f is 1 and -b < -e";
  if (o->stepFactor <= 1.0 && o->stepBytes > 0 && (o->maxBytes - o->minBytes) / o->stepBytes >= kMaxSweepLength)
    return "-b/-e/-i describe more than " + std::to_string(kMaxSweepLength) + " sizes";
  if (o->nprocs == 0 && o->procIndex >= 0) return "-I needs -P";
  if (o->nprocs > 1) {
    if (o->procIndex < 0) return "-P needs -I (this process's index)";
    if (o->procIndex >= o->nprocs) return "-I must be below -P";
    if (o->rendezvousDir.empty()) {
      const char* env = std::getenv("ZP_PERF_RENDEZVOUS");
      if (env == nullptr || *env == '\0') return "-P > 1 needs -D <dir> or $ZP_PERF_RENDEZVOUS";
      o->rendezvousDir = env;
    }
    if (o->host) return "-H 1 runs every rank as a thread of one process; it cannot be combined with -P > 1";
  } else if (o->nprocs == 1 && o->procIndex > 0) {
    return "-I must be below -P";
  }
  return "";
}

}  // namespace

bool parseBytes(const char* text, size_t* bytes) {
  if (text == nullptr || *text < '0' || *text > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0) return false;
  unsigned shift = 0;
  switch (*end) {
    case 'k':
    case 'K':
      shift = 10;
      ++end;
      break;
    case 'm':
    case 'M':
      shift = 20;
      ++end;
      break;
    case 'g':
    case 'G':
      shift = 30;
      ++end;
      break;
    case 't':
    case 'T':
      shift = 40;
      ++end;
      break;
    default:
      break;
  }
  if (shift != 0 && *end == 'i') ++end;  // "MiB"
  if (*end == 'b' || *end == 'B') ++end;
  if (*end != '\0') return false;
  if (shift != 0 && v > (std::numeric_limits<unsigned long long>::max() >> shift)) return false;
  unsigned long long result = v << shift;
  if (result > std::numeric_limits<size_t>::max()) return false;
  *bytes = static_cast<size_t>(result);
  return true;
}

int parseDataType(const char* text) {
  static const struct {
    const char* name;
    int type;
  } names[] = {
      {"int8", zpInt8},       {"char", zpInt8},         {"uint8", zpUint8},    {"int32", zpInt32},
      {"int", zpInt32},       {"uint32", zpUint32},     {"int64", zpInt64},    {"uint64", zpUint64},
      {"half", zpFloat16},    {"float16", zpFloat16},   {"fp16", zpFloat16},   {"float", zpFloat32},
      {"float32", zpFloat32}, {"fp32", zpFloat32},      {"double", zpFloat64}, {"float64", zpFloat64},
      {"fp64", zpFloat64},    {"bfloat16", zpBfloat16}, {"bf16", zpBfloat16},
  };
  for (const auto& n : names)
    if (equalsIgnoreCase(text, n.name)) return n.type;
  return -1;
}

int parseRedOp(const char* text) {
  if (equalsIgnoreCase(text, "sum")) return zpSum;
  if (equalsIgnoreCase(text, "avg")) return zpAvg;
  return -1;
}

ParseResult parseOptions(int argc, char** argv, Options* options, std::string* error) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strcmp(arg, "-h") == 0 || std::strcmp(arg, "--help") == 0) return ParseResult::kHelp;
    const Flag* flag = nullptr;
    const char* value = nullptr;
    if (arg[0] == '-' && arg[1] == '-' && arg[2] != '\0') {
      // --name value or --name=value
      const char* name = arg + 2;
      const char* eq = std::strchr(name, '=');
      size_t len = eq ? size_t(eq - name) : std::strlen(name);
      for (const Flag& f : flags())
        if (std::strlen(f.longName) == len && std::strncmp(f.longName, name, len) == 0) flag = &f;
      if (flag != nullptr && eq != nullptr) value = eq + 1;
    } else if (arg[0] == '-' && arg[1] != '\0') {
      // -x value or -xvalue
      for (const Flag& f : flags())
        if (f.shortName == arg[1]) flag = &f;
      if (flag != nullptr && arg[2] != '\0') value = arg + 2;
    }
    if (flag == nullptr) {
      *error = std::string("unknown argument '") + arg + "'";
      return ParseResult::kError;
    }
    if (value == nullptr && flag->implicitValue != nullptr) {
      const bool next01 = i + 1 < argc && (std::strcmp(argv[i + 1], "0") == 0 || std::strcmp(argv[i + 1], "1") == 0);
      value = next01 ? argv[++i] : flag->implicitValue;
    }
    if (value == nullptr) {
      if (i + 1 >= argc) {
        *error = std::string(arg) + " needs a value";
        return ParseResult::kError;
      }
      value = argv[++i];
    }
    std::string problem = flag->apply(value, &o);
    if (!problem.empty()) {
      *error = problem;
      return ParseResult::kError;
    }
  }
  std::string problem = checkConsistency(&o);
  if (!problem.empty()) {
    *error = problem;
    return ParseResult::kError;
  }
  *options = o;
  return ParseResult::kOk;
}

std::vector<size_t> sizeSweep(const Options& o) {
  std::vector<size_t> sizes;
  size_t size = o.minBytes;
  while (size <= o.maxBytes && sizes.size() < kMaxSweepLength) {
    sizes.push_back(size);
    size_t next;
    if (o.stepFactor > 1.0) {
      double scaled = double(size) * o.stepFactor;
      next = scaled >= double(std::numeric_limits<size_t>::max()) ? std::numeric_limits<size_t>::max()
                                                                  : static_cast<size_t>(scaled);
      if (next <= size) next = size + 1;  // keep moving from 0 or with factors close to 1
    } else {
      if (o.stepBytes == 0) break;
      next = size + o.stepBytes;
    }
    if (next <= size) break;  // overflow
    size = next;
  }
  return sizes;
}

std::string formatBytes(size_t bytes) {
  static const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  double v = double(bytes);
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  else
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

void printUsage(FILE* out, const char* program) {
  std::fprintf(out,
               "usage: %s [flags]\n"
               "Sizes are logical (unquantized) bytes: all-gather = total received, reduce-scatter = total sent,\n"
               "all-to-all = sent per rank, quantize = input tensor. Byte counts take K, M, G, T (powers of 1024).\n"
               "  -b, --minbytes N      smallest size (default 32M)\n"
               "  -e, --maxbytes N      largest size (default 32M)\n"
               "  -f, --stepfactor X    multiply the size by X (> 1) each step\n"
               "  -i, --stepbytes N     add N each step when -f is 1 (default 1M)\n"
               "  -n, --iters N         timed iterations per size (default 20)\n"
               "  -w, --warmup_iters N  untimed iterations before (default 5)\n"
               "  -r, --rounds N        time zpccl's calls and the baselines' in N alternating rounds of -n\n"
               "                        iterations each (at most 64), and report their medians and each\n"
               "                        round, so that a link whose speed drifts (loopback sockets) slows all\n"
               "                        alike (default 5 against a baseline, else 1)\n"
               "  -c, --check 0|1       compare every rank's output to the host reference (default 1)\n"
               "  -d, --datatype T      half, bfloat16, float (quantized ops); int8, uint8, int32, uint32,\n"
               "                        int64, uint64, double too for NCCL baselines (default bfloat16)\n"
               "  -o, --op sum|avg      reduction of reduce-scatter ops (default sum)\n"
               "  -g, --ngpus 1         GPUs per thread (only 1)\n"
               "  -t, --nthreads N      ranks driven by this process, one thread each (default: one per\n"
               "                        visible GPU shared among this host's processes; 8 with -H 1)\n"
               "  -B, --bits 4|8        bits of quantized codes (default: the op's)\n"
               "  -G, --blocksize N     elements per quantization block (default 256)\n"
               "  -p, --inplace 0|1     also run the in-place variant (default 1)\n"
               "  -J, --json FILE       write every row to FILE as a JSON array\n"
               "  -R, --regime LABEL    link regime label for the table and JSON (nvlink, shm, net, host...)\n"
               "  -H, --host [0|1]      host backend: ranks are threads, buffers host memory, no NCCL column;\n"
               "                        prints the bytes each rank sends inside and across nodes instead\n"
               "  -N, --nodes N         emulate N nodes of ranks/N consecutive ranks (default: real hosts;\n"
               "                        2 with -H 1 when the rank count is even and >= 4)\n"
               "  -S, --sharegpus [0|1] every process of a host numbers its GPUs from 0, so processes share\n"
               "                        GPUs: more ranks than GPUs, for layouts the machine lacks; each\n"
               "                        process needs its own NCCL_HOSTID, and times are not the layout's\n"
               "  -P, --nprocs N        processes meeting through a rendezvous directory (no MPI needed)\n"
               "  -I, --procindex I     this process's index in [0, N)\n"
               "  -D, --rendezvous DIR  a fresh directory shared by the -P processes ($ZP_PERF_RENDEZVOUS)\n"
               "  -s, --stochastic [0|1] gradient ops (qgZ, its requantize, quantize_grad): stochastic rounding\n"
               "  -E, --feedback [0|1]  gradient ops: error feedback with bf16 residuals (include/zpccl.h)\n"
               "  -h, --help            this text\n"
               "Exit status: 0 all good, 1 a wrong element or a failed call, 2 bad flags.\n",
               program);
}

}  // namespace perf
}  // namespace zp
