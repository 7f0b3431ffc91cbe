#include "host/base/debug.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "host/base/log_env.h"

namespace zp {

std::atomic<int> gLogLevel{kLogUnset};
unsigned gLogSubsys = kSubsysInit | kSubsysEnv;  // NCCL's default: INIT and ENV

namespace {

std::mutex gLogMutex;
FILE* gLogFile = stderr;

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

int readLogLevel(const char* text, std::string* warning) {
  warning->clear();
  if (text == nullptr || text[0] == '\0') return kLogWarn;
  const struct {
    const char* name;
    int level;
  } levels[] = {
      {"NONE", kLogNone}, {"VERSION", kLogVersion}, {"WARN", kLogWarn}, {"INFO", kLogInfo}, {"TRACE", kLogTrace}};
  for (const auto& l : levels) {
    if (strcasecmp(text, l.name) == 0) return l.level;
  }
  *warning = std::string("ZP_DEBUG='") + text + "' is not a level (NONE, VERSION, WARN, INFO or TRACE): WARN used";
  return kLogWarn;
}

unsigned readLogSubsys(const char* text, std::string* warning) {
  warning->clear();
  const char* spec = text;
  const bool invert = spec[0] == '^';
  if (invert) spec++;
  const struct {
    const char* name;
    unsigned mask;
  } words[] = {{"INIT", kSubsysInit},   {"COLL", kSubsysColl}, {"QUANT", kSubsysQuant}, {"TOPO", kSubsysTopo},
               {"ALLOC", kSubsysAlloc}, {"ENV", kSubsysEnv},   {"ALL", kSubsysAll}};
  unsigned mask = 0;
  std::string unknown;
  const std::string all(spec);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    std::string word = all.substr(start, end - start);
    for (auto& c : word) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
    bool known = word.empty();  // "INIT," or an empty value: nothing to name
    for (const auto& w : words) {
      if (word == w.name) {
        mask |= w.mask;
        known = true;
      }
    }
    if (!known) unknown += (unknown.empty() ? "" : ", ") + all.substr(start, end - start);
    start = end + 1;
  }
  if (!unknown.empty()) {
    *warning = std::string("ZP_DEBUG_SUBSYS='") + text + "' names no subsystem " + unknown +
               " (INIT, COLL, QUANT, TOPO, ALLOC, ENV, ALL): skipped";
  }
  return invert ? ~mask : mask;
}

FILE* openLogFile(const char* pattern, std::string* warning) {
  warning->clear();
  const std::string path = expandLogPath(pattern);
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) {
    *warning = std::string("ZP_DEBUG_FILE='") + pattern + "': cannot open " + path + " (" + strerror(errno) +
               "): logging to stderr";
  }
  return f;
}

void logInit() {
  std::string warnings[3];
  {
    std::lock_guard<std::mutex> lock(gLogMutex);
    if (gLogLevel.load() != kLogUnset) return;
    const int level = readLogLevel(getenv("ZP_DEBUG"), &warnings[0]);
    if (const char* env = getenv("ZP_DEBUG_SUBSYS")) gLogSubsys = readLogSubsys(env, &warnings[1]);
    if (const char* env = getenv("ZP_DEBUG_FILE")) {
      if (FILE* f = openLogFile(env, &warnings[2])) gLogFile = f;
    }
    gLogLevel.store(level);
  }
  // Once, after the level is set (logMessage takes the lock): a value the variables could not take is said.
  for (const std::string& w : warnings) {
    if (!w.empty()) logMessage(kLogWarn, kSubsysAll, __FILE__, __LINE__, "%s", w.c_str());
  }
}

void logMessage(LogLevel level, unsigned subsys, const char* file, int line, const char* fmt, ...) {
  if (!logEnabled(level, subsys)) {
    // WARN is never filtered by subsystem (debug.h): ZP_DEBUG_SUBSYS=^ALL, or words it does not know, must not
    // silence the messages of refused calls.
    if (level != kLogWarn || gLogLevel.load(std::memory_order_relaxed) < kLogWarn) return;
  }
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
