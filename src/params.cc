#include "src/params.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "src/debug.h"

namespace zp {

int64_t parseParam(const char* env, const char* text, int64_t def, int64_t lo, int64_t hi) {
  if (text == nullptr || *text == '\0') return def;
  char* end = nullptr;
  errno = 0;
  const long long value = strtoll(text, &end, 0);
  if (end == text || *end != '\0' || errno == ERANGE) {
    ZP_WARN("%s='%s' is not an integer; using the default %lld", env, text, static_cast<long long>(def));
    return def;
  }
  if (value < lo || value > hi) {
    ZP_WARN("%s=%lld is outside [%lld, %lld]; using the default %lld", env, value, static_cast<long long>(lo),
            static_cast<long long>(hi), static_cast<long long>(def));
    return def;
  }
  ZP_INFO(kSubsysEnv, "%s set by environment to %lld", env, value);
  return value;
}

int64_t parseWaitParam(const char* env, const char* text, int64_t def, int64_t lo) {
  const int64_t value = parseParam(env, text, def, lo, INT64_MAX);
  if (value <= kMaxWaitMs) return value;
  ZP_INFO(kSubsysEnv, "%s=%lld is longer than the longest wait; waiting %lld ms (about 31 years) instead", env,
          static_cast<long long>(value), static_cast<long long>(kMaxWaitMs));
  return kMaxWaitMs;
}

bool readParam(const char* env, int64_t* value) {
#define ZP_READ_WAIT_PARAM(name, var, def, lo, help)    \
  if (strcmp(env, var) == 0) {                          \
    *value = parseWaitParam(var, getenv(var), def, lo); \
    return true;                                        \
  }
#define ZP_READ_PARAM(name, var, def, lo, hi, help)     \
  if (strcmp(env, var) == 0) {                          \
    *value = parseParam(var, getenv(var), def, lo, hi); \
    return true;                                        \
  }
  ZP_WAIT_PARAMS(ZP_READ_WAIT_PARAM)
  ZP_PARAMS(ZP_READ_PARAM)
#undef ZP_READ_PARAM
#undef ZP_READ_WAIT_PARAM
  return false;
}

#define ZP_DEFINE_WAIT_PARAM(name, env, def, lo, help)                      \
  int64_t param##name() {                                                   \
    static const int64_t value = parseWaitParam(env, getenv(env), def, lo); \
    return value;                                                           \
  }
#define ZP_DEFINE_PARAM(name, env, def, lo, hi, help)                       \
  int64_t param##name() {                                                   \
    static const int64_t value = parseParam(env, getenv(env), def, lo, hi); \
    return value;                                                           \
  }
ZP_WAIT_PARAMS(ZP_DEFINE_WAIT_PARAM)
ZP_PARAMS(ZP_DEFINE_PARAM)
#undef ZP_DEFINE_PARAM
#undef ZP_DEFINE_WAIT_PARAM

bool ncclSwitchOn(const char* value) { return value != nullptr && std::atoi(value) != 0; }

const std::string& paramBackend() {
  static const std::string value = [] {
    const char* text = getenv("ZP_BACKEND");
    if (text == nullptr) return std::string();
    ZP_INFO(kSubsysEnv, "ZP_BACKEND set by environment to %s", text);
    return std::string(text);
  }();
  return value;
}

}  // namespace zp
