#include "host/base/debug.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace zp {

std::atomic<int> gLogLevel{kLogUnset};
unsigned gLogSubsys = kSubsysInit | kSubsysEnv;  // NCCL's default: INIT and ENV

namespace {

std::mutex gLogMutex;
FILE* gLogFile = stderr;

unsigned parseSubsys(const char* spec) {
  bool invert = spec[0] == '^';
  if (invert) spec++;
  unsigned mask = 0;
  std::string all(spec);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    std::string word = all.substr(start, end - start);
    for (auto& c : word) c = static_cast<char>(toupper(c));
    if (word == "INIT")
      mask |= kSubsysInit;
    else if (word == "COLL")
      mask |= kSubsysColl;
    else if (word == "QUANT")
      mask |= kSubsysQuant;
    else if (word == "TOPO")
      mask |= kSubsysTopo;
    else if (word == "ALLOC")
      mask |= kSubsysAlloc;
    else if (word == "ENV")
      mask |= kSubsysEnv;
    else if (word == "ALL")
      mask |= kSubsysAll;
    start = end + 1;
  }
  return invert ? ~mask : mask;
}

// Expands %h (hostname) and %p (pid) in a ZP_DEBUG_FILE pattern.
std::string expandLogPath(const char* pattern) {
  std::string out;
  for (const char* p = pattern; *p; ++p) {
    if (p[0] == '%' && p[1] == 'h') {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      out += host;
      ++p;
    } else if (p[0] == '%' && p[1] == 'p') {
      out += std::to_string(getpid());
      ++p;
    } else {
      out += *p;
    }
  }
  return out;
}

}  // namespace

void logInit() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  if (gLogLevel.load() != kLogUnset) return;
  int level = kLogWarn;
  if (const char* env = getenv("ZP_DEBUG")) {
    if (strcasecmp(env, "VERSION") == 0)
      level = kLogVersion;
    else if (strcasecmp(env, "WARN") == 0)
      level = kLogWarn;
    else if (strcasecmp(env, "INFO") == 0)
      level = kLogInfo;
    else if (strcasecmp(env, "TRACE") == 0)
      level = kLogTrace;
    else if (strcasecmp(env, "NONE") == 0)
      level = kLogNone;
  }
  if (const char* env = getenv("ZP_DEBUG_SUBSYS")) gLogSubsys = parseSubsys(env);
  if (const char* env = getenv("ZP_DEBUG_FILE")) {
    std::string path = expandLogPath(env);
    if (FILE* f = fopen(path.c_str(), "w")) gLogFile = f;
  }
  gLogLevel.store(level);
}

void logMessage(LogLevel level, unsigned subsys, const char* file, int line, const char* fmt, ...) {
  if (!logEnabled(level, subsys)) return;
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  char msg[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(msg, sizeof(msg), fmt, args);
  va_end(args);
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  std::lock_guard<std::mutex> lock(gLogMutex);
  if (level == kLogWarn) {
    fprintf(gLogFile, "%s:%d:%d [zpccl] %s:%d WARN %s\n", host, getpid(), gettid(), base, line, msg);
  } else {
    fprintf(gLogFile, "%s:%d:%d [zpccl] %s %s\n", host, getpid(), gettid(), level == kLogTrace ? "TRACE" : "INFO", msg);
  }
  fflush(gLogFile);
}

}  // namespace zp
