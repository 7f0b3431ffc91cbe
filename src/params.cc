#include "src/params.h"

#include <cstdlib>

#include "src/debug.h"

namespace zp {

namespace {
int64_t readParam(const char* env, int64_t def) {
  const char* text = getenv(env);
  if (text == nullptr || *text == '\0') return def;
  char* end = nullptr;
  long long value = strtoll(text, &end, 0);
  if (end == text || *end != '\0') {
    ZP_WARN("%s='%s' is not an integer; using the default %lld", env, text, static_cast<long long>(def));
    return def;
  }
  ZP_INFO(kSubsysEnv, "%s set by environment to %lld", env, value);
  return value;
}
}  // namespace

#define ZP_DEFINE_PARAM(name, env, def, help)         \
  int64_t param##name() {                             \
    static const int64_t value = readParam(env, def); \
    return value;                                     \
  }
ZP_PARAMS(ZP_DEFINE_PARAM)
#undef ZP_DEFINE_PARAM

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
