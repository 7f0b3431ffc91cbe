#include "perf/provenance.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <limits.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

#include "include/zpccl.h"
#include "source_state.h"  // generated (perf/meson.build)

namespace zp {
namespace perf {

const char* const kSteeringPrefixes[8] = {"NCCL_", "ZP_", "ZPCCL_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_", "NVIDIA_"};

std::vector<std::pair<std::string, std::string>> steeringEnvironment(char** entries) {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = entries; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    for (const char* prefix : kSteeringPrefixes) {
      if (entry.rfind(prefix, 0) == 0) {
        out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string shellQuote(const std::string& word) {
  if (word.empty()) return "''";
  const bool safe = std::all_of(word.begin(), word.end(), [](unsigned char c) {
    return std::isalnum(c) || std::string("@%+=:,./-_").find(char(c)) != std::string::npos;
  });
  if (safe) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\"'\"'") : std::string(1, c);
  return out + "'";
}

std::string commandLine(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) out += (i ? " " : "") + shellQuote(argv[i]);
  return out;
}

void parseSourceState(const std::string& state, std::string* commit, int* dirty) {
  const std::string suffix = "-dirty";
  const bool isDirty =
      state.size() > suffix.size() && state.compare(state.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string hash = isDirty ? state.substr(0, state.size() - suffix.size()) : state;
  const bool isHash = hash.size() == 40 && std::all_of(hash.begin(), hash.end(), [](unsigned char c) {
                        return std::isdigit(c) || (c >= 'a' && c <= 'f');
                      });
  *commit = isHash ? hash : std::string();
  *dirty = isHash ? int(isDirty) : -1;
}

std::string isoTimeUtc(long long secondsSinceEpoch) {
  const std::time_t t = static_cast<std::time_t>(secondsSinceEpoch);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S+00:00", &tm);
  return buf;
}

namespace {

std::string versionText(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

// The first word of /proc/driver/nvidia/version that reads as a release ("580.159.03"), as perf/provenance.py
// reads it; empty without NVIDIA's kernel driver.
std::string driverRelease() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string word;
  while (in >> word) {
    const bool digitsAndDots =
        std::all_of(word.begin(), word.end(), [](unsigned char c) { return std::isdigit(c) || c == '.'; });
    if (digitsAndDots && word.find('.') != std::string::npos && std::isdigit(static_cast<unsigned char>(word[0])))
      return word;
  }
  return "";
}

// The file that holds `address`, resolved to an absolute path; the executable itself when the dynamic linker
// names none (code linked into it).
std::string fileOf(const void* address) {
  if (address == nullptr) return "";
  Dl_info info{};
  char resolved[PATH_MAX];
  if (dladdr(address, &info) != 0 && info.dli_fname != nullptr && info.dli_fname[0] != '\0' &&
      realpath(info.dli_fname, resolved) != nullptr)
    return resolved;
  const ssize_t n = readlink("/proc/self/exe", resolved, sizeof(resolved) - 1);
  return n > 0 ? std::string(resolved, size_t(n)) : std::string();
}

}  // namespace

Provenance collectProvenance(int argc, char** argv, const std::string& regime) {
  Provenance p;
  parseSourceState(ZP_PERF_SOURCE_STATE, &p.commit, &p.dirty);
  p.command = commandLine(argc, argv);
  char buf[PATH_MAX];
  if (getcwd(buf, sizeof(buf)) != nullptr) p.cwd = buf;
  p.env = steeringEnvironment(environ);
  p.regime = regime;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  p.host = host;
  p.timeUtc = isoTimeUtc(static_cast<long long>(std::time(nullptr)));

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: count 0, and no sticky error for what follows
    count = 0;
  }
  std::set<std::string> models;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess) models.insert(prop.name);
  }
  p.gpuCount = count;
  p.gpuModels.assign(models.begin(), models.end());
  p.driver = driverRelease();
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess && runtime > 0)
    p.cudaRuntime = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);

  // The NCCL this process resolved ncclGetVersion in, whichever file the dynamic linker found.
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess && nccl > 0) p.ncclLoaded = versionText(nccl);
  p.ncclFile = fileOf(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  int zpVersion = 0;
  if (zpGetVersion(&zpVersion) == zpSuccess) p.zpcclVersion = versionText(zpVersion);
  p.zpcclLibrary = fileOf(reinterpret_cast<const void*>(&zpGetVersion));
  return p;
}

}  // namespace perf
}  // namespace zp
