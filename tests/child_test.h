// Runs one test of this binary in a child process with more environment variables. Tunables are read once per
// process (host/base/params.h), so a test of a short ZP_INIT_TIMEOUT_MS or ZP_HOST_TIMEOUT_MS needs a process of its
// own: its body is a DISABLED_ test, which the normal run skips and the child runs alone.
#pragma once

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

extern char** environ;

namespace zptest {

struct ChildRun {
  int exitCode = -1;   // -1: it did not exit normally, or could not start
  std::string output;  // what it printed
};

// Runs a shell command line and collects what it prints on stdout (add 2>&1 for stderr too).
inline ChildRun runCommand(const std::string& command) {
  ChildRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  while (fgets(buffer, sizeof(buffer), pipe)) run.output += buffer;
  const int status = pclose(pipe);
  run.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// Runs this binary with `args` (gtest flags, quoted for the shell) and `env` ("NAME=value") added; stdout and stderr.
inline ChildRun runSelf(const std::string& args, const std::vector<std::string>& env) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return ChildRun();
  self[n] = '\0';
  std::string command = "env";
  for (const std::string& e : env) command += " '" + e + "'";
  command += std::string(" '") + self + "' " + args + " 2>&1";
  return runCommand(command);
}

// Runs test `name` ("Suite.DISABLED_Test") of this binary with `env` ("NAME=value") added; stdout and stderr.
inline ChildRun runTestInChild(const std::string& name, const std::vector<std::string>& env) {
  return runSelf("--gtest_also_run_disabled_tests --gtest_filter='" + name + "'", env);
}

// The end of a child's output, which says why it failed, without the megabytes of log before it.
inline std::string outputTail(const ChildRun& run, size_t bytes = 20000) {
  return run.output.substr(run.output.size() > bytes ? run.output.size() - bytes : 0);
}

// The child ran that one test, and it passed.
inline void expectChildPassed(const std::string& name, const std::vector<std::string>& env) {
  const ChildRun run = runTestInChild(name, env);
  EXPECT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("[       OK ] " + name), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("[  PASSED  ] 1 test."), std::string::npos) << run.output;
}

// The link regimes of child processes that are hosts of their own, as tools/regimes.sh (the scripts) and zpccl.launch
// (Python) name them and set their variables:
enum class Regime {
  // "net": NCCL's peer-to-peer and shared-memory transports off, every transfer over sockets, as between nodes;
  // processes of one rank each, which may share a GPU.
  kNet,
  // "2x2": a node of several GPUs whose ranks reach each other as NCCL finds them (NVLink inside the node), sockets
  // between nodes.
  kNodesOfSeveral
};

// The variables ("NAME=value") of `regime` for child process `process` (0, 1, ...): its own NCCL_HOSTID (NCCL refuses
// two ranks of one host on one GPU, not two of different hosts), NVLink multicast off, and, over sockets, NCCL's
// peer-to-peer and shared memory off.
inline std::vector<std::string> regimeEnv(Regime regime, int process) {
  std::vector<std::string> env = {"NCCL_NVLS_ENABLE=0", "NCCL_HOSTID=zp-node-" + std::to_string(process)};
  if (regime == Regime::kNet) env.insert(env.end(), {"NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"});
  return env;
}

// Starts this binary running the tests of `filter` with `env` ("NAME=value") and the rest of this process's
// environment (`env` replaces a variable of the same name: getenv would find the first of two); the child's id.
inline pid_t spawnSelf(const std::string& filter, const std::vector<std::string>& env) {
  std::vector<std::string> entries = env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e, name = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const std::string& mine : env) replaced = replaced || mine.compare(0, name.size(), name) == 0;
    if (!replaced) entries.push_back(entry);
  }
  std::vector<char*> envp;
  for (auto& e : entries) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", filterFlag = "--gtest_filter=" + filter;
  char* argv[] = {self.data(), filterFlag.data(), nullptr};
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  return pid;
}

// Starts `processes` copies of this binary at once, each running the tests of `filter`, child k with envOf(k)
// ("NAME=value") and the rest of this process's environment (spawnSelf), and waits for all of them; each must exit
// 0. For tests whose children meet each other (the ranks of one communicator in processes of their own).
inline void runConcurrentChildren(const std::string& filter, int processes,
                                  const std::function<std::vector<std::string>(int)>& envOf) {
  std::vector<pid_t> children;
  for (int k = 0; k < processes; ++k) {
    const pid_t pid = spawnSelf(filter, envOf(k));
    ASSERT_GT(pid, 0);
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child exited with status " << status;
  }
}

}  // namespace zptest
