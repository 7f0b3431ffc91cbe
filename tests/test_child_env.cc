// The environment of the tests' child processes (tests/child_test.h): a child's own variables replace this process's
// of the same name, and each link regime's variables are those tools/regimes.sh gives the scripts (which
// tools/python/tests/test_regimes.py ties to zpccl.launch).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/child_test.h"

namespace {

const char* kValueEnv = "ZP_TEST_CHILD_VALUE";
const char* kExpectedEnv = "ZP_TEST_CHILD_EXPECTED";

// Runs in the children of TheChildsVariablesReplaceTheParents (skipped in a normal run).
TEST(ChildEnvChild, SeesItsOwnValue) {
  const char* expected = getenv(kExpectedEnv);
  if (expected == nullptr) GTEST_SKIP() << "runs only inside ChildEnv.TheChildsVariablesReplaceTheParents";
  ASSERT_NE(getenv(kValueEnv), nullptr);
  EXPECT_STREQ(getenv(kValueEnv), expected);
}

TEST(ChildEnv, TheChildsVariablesReplaceTheParents) {
  if (getenv(kExpectedEnv)) GTEST_SKIP();
  setenv(kValueEnv, "parent", 1);
  zptest::runConcurrentChildren("ChildEnvChild.SeesItsOwnValue", 2, [](int k) {
    const std::string value = "child-" + std::to_string(k);
    return std::vector<std::string>{std::string(kValueEnv) + "=" + value, std::string(kExpectedEnv) + "=" + value};
  });
  unsetenv(kValueEnv);
}

// The variables tools/regimes.sh prints for `regime` and process `process`, sorted; empty when bash or the file is
// missing.
std::vector<std::string> shellRegimeEnv(const std::string& regime, int process) {
  const std::string script = std::string(ZP_SOURCE_DIR) + "/tools/regimes.sh";
  const zptest::ChildRun run = zptest::runCommand("bash -c 'source \"$0\" && zp_regime_env \"$1\" \"$2\"' '" + script +
                                                  "' " + regime + " " + std::to_string(process) + " 2>/dev/null");
  std::vector<std::string> words;
  if (run.exitCode != 0) return words;
  std::stringstream lines(run.output);
  for (std::string line; std::getline(lines, line);) words.push_back(line);
  std::sort(words.begin(), words.end());
  return words;
}

TEST(ChildEnv, RegimesAreTheScripts) {
  if (shellRegimeEnv("nvlink", 0).empty()) GTEST_SKIP() << "no bash, or no tools/regimes.sh under " << ZP_SOURCE_DIR;
  for (const auto& [regime, name] :
       {std::pair{zptest::Regime::kNet, "net"}, {zptest::Regime::kNodesOfSeveral, "2x2"}}) {
    for (int process : {0, 1, 3}) {
      std::vector<std::string> mine = zptest::regimeEnv(regime, process);
      std::sort(mine.begin(), mine.end());
      EXPECT_EQ(mine, shellRegimeEnv(name, process)) << name << " process " << process;
    }
  }
}

}  // namespace
