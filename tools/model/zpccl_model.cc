// zpccl-model: what ZeRO++'s collectives save against ZeRO-3 on a layout, from the cost model of
// tools/model/cost_model.h (formulas in tools/model/cost_model.cc). Prints per collective the bytes per GPU on
// each link class, the cross-node volume, the time, then the step time and the speedup; --sweep runs 1..128 nodes
// at several inter-node bandwidths and writes a CSV for tools/plot_model.py; --calibrate fits the links, the
// kernels and the pipelines' overlap to perf JSON files (-J of the perf binaries), reports predicted against
// measured time for every row, and models the layout with what it fitted.
//
//   zpccl-model --nodes 16 --gpus 8 --params 20B --inter-gbps 100
//   zpccl-model --params 20B --sweep --sweep-inter-gbps 100,800 --csv sweep.csv
//   zpccl-model --nodes 16 --gpus 8 --params 20B --inter-gbps 100 --calibrate perf/results/2026-11-30-h200x2.json
//       perf/results/2026-11-30-h200x2-baselines.json
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "tools/model/cost_model.h"

namespace {

constexpr const char* kUsage =
    "usage: zpccl-model [options]\n"
    "layout and model\n"
    "  --nodes N              nodes (16)\n"
    "  --gpus L               GPUs per node (8)\n"
    "  --layout A,B,...       GPUs of each node (uneven layouts), instead of --nodes/--gpus\n"
    "  --params P             model parameters: 20e9, 20B, 1.3B, 350M (20B)\n"
    "  --elem-bytes E         bytes per weight/gradient element: 2 (bf16, default) or 4\n"
    "  --bucket-params P      parameters per collective call (0: the whole model in one call, default)\n"
    "links (inter-node bandwidth is per node: all its NICs together)\n"
    "  --intra-gbs B          intra-node bus bandwidth per GPU, GB/s, or with a unit (270GB/s)\n"
    "  --intra-lat-us A       intra-node latency per step, us (2); drops a calibrated small-message line\n"
    "  --inter-gbps B         inter-node bandwidth per node, Gb/s, or with a unit (100Gb/s, 12.5GB/s)\n"
    "  --inter-lat-us A       inter-node latency per step, us (10); drops a calibrated small-message line\n"
    "kernels (defaults: two H200, bf16, calibrated) and the chunk pipeline of qwZ and qgZ\n"
    "  --quantize-gbs B       quantize kernel, GB/s of bytes read + written, both code widths\n"
    "  --quantize8-gbs B      the same for int8 codes only (2630)\n"
    "  --quantize4-gbs B      the same for int4 codes only (2250)\n"
    "  --dequantize-gbs B     dequantize kernel, GB/s of bytes read + written (3570)\n"
    "  --copy-gbs B           device copy (hpZ over one-rank groups), GB/s read + written (4100)\n"
    "  --mem-gbs B            sets quantize, dequantize and copy at once\n"
    "  --reduce-rate R        qgZ's reduce kernels, G element-sources/s: sources x elements summed (1380)\n"
    "  --launch-us T          fixed cost of every kernel launch, us (quantize 4.2-4.7, others 1.3-11)\n"
    "  --qwz-overlap W        share of an ideal pipeline's overlap qwZ achieves with every SM, 0..1 (0.43)\n"
    "  --qwz-green-overlap W  the same in a green context, the library's default configuration (0.62)\n"
    "  --nccl-sms N           SMs qwZ's kernels leave to NCCL, the library's ZP_NCCL_SMS (32): non-zero models the\n"
    "                         green context (--qwz-green-overlap), 0 every SM (--qwz-overlap)\n"
    "  --qgz-overlap W        qgZ's share (0.60; its kernels always run on every SM)\n"
    "  --pair-allgather M     how qgZ exchanges slots between two ranks, the library's ZP_PAIR_ALLGATHER: 2 (default)\n"
    "                         one all-gather (priced on the all-gather line, plus a copy) when they are on different\n"
    "                         nodes, else the all-to-all; 1 always the all-gather; 0 never\n"
    "  --max-chunks C         most pipeline chunks per call (8, the library's ZP_MAX_CHUNKS)\n"
    "compute and overlap\n"
    "  --compute-ms T         compute time of one step per GPU; default 6 * params * tokens / flops\n"
    "  --tokens-per-gpu T     tokens per GPU per step for the default compute time (4096)\n"
    "  --tflops F             achieved TFLOP/s per GPU for the default compute time (400)\n"
    "  --overlap X            share of min(compute, comm) hidden: 0 or sum (step = compute + comm, default),\n"
    "                         1 or max (step = max(compute, comm)), or anything between\n"
    "ZeRO++\n"
    "  --qwz on|off, --hpz on|off, --qgz on|off   techniques (all on); --no-qwz, --no-hpz, --no-qgz\n"
    "  --qwz-backward         without hpZ, quantize the backward gather too\n"
    "  --wbits 8|4            qwZ weight bits (8)\n"
    "  --gbits 4|8            qgZ gradient bits (4)\n"
    "  --block G              quantization block size (256)\n"
    "  --hpz-size H           ranks per hpZ group (0: the node)\n"
    "calibration\n"
    "  --calibrate FILE...    fit links, kernels and overlaps to perf JSON files (one or more paths, or the flag\n"
    "                         repeated) and check every row\n"
    "  --intra-regime NAME    regime whose fit becomes the intra-node link (default nvlink)\n"
    "  --inter-regime NAME    regime whose fit becomes the inter-node link (default net, else shm)\n"
    "  --no-apply             report the calibration, but model with the flags' links\n"
    "sweep\n"
    "  --sweep                1..128 nodes of --gpus GPUs at each --sweep-inter-gbps; writes --csv\n"
    "  --sweep-nodes A,B,...  node counts (1,2,4,8,16,32,64,128)\n"
    "  --sweep-inter-gbps A,B inter-node bandwidths per node, Gb/s or with units (100,800)\n"
    "  --csv FILE             sweep CSV (zpccl_model_sweep.csv)\n";

struct Options {
  zp::ClusterSpec cluster = zp::ClusterSpec::even(16, 8);
  int nodes = 16, gpus = 8;
  std::vector<int> layout;
  zp::StepConfig step;
  zp::ZeroppOptions zpp;
  double intraGBs = 270, intraLatUs = 2, interGBs = 12.5, interLatUs = 10;
  bool intraBwSet = false, intraLatSet = false, interBwSet = false, interLatSet = false;
  // Kernel and pipeline flags; negative: not given (the defaults, or the calibration's).
  double quantize8GBs = -1, quantize4GBs = -1, dequantizeGBs = -1, copyGBs = -1, reduceRate = -1, launchUs = -1;
  double qwzOverlap = -1, qwzGreenOverlap = -1, qgzOverlap = -1;
  int maxChunks = 0, ncclSms = -1, pairAllGather = -1;
  bool computeSet = false;
  double tokensPerGpu = 4096, tflops = 400;
  std::vector<std::string> calibrateFiles;
  std::string intraRegime, interRegime;
  bool apply = true;
  bool sweep = false;
  std::vector<int> sweepNodes = {1, 2, 4, 8, 16, 32, 64, 128};
  std::vector<double> sweepInterGBs = {12.5, 100};
  std::string csv = "zpccl_model_sweep.csv";
};

bool fail(const std::string& message) {
  std::fprintf(stderr, "zpccl-model: %s\n", message.c_str());
  return false;
}

bool parseDouble(const std::string& text, double* out) {
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0' && std::isfinite(*out);
}

// 20e9, 20B, 1.3b, 350M, 7.5K, 1T.
bool parseCount(std::string text, double* out) {
  double scale = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'k':
      case 'K':
        scale = 1e3;
        break;
      case 'm':
      case 'M':
        scale = 1e6;
        break;
      case 'b':
      case 'B':
      case 'g':
      case 'G':
        scale = 1e9;
        break;
      case 't':
      case 'T':
        scale = 1e12;
        break;
      default:
        break;
    }
    if (scale != 1) text.pop_back();
  }
  if (!parseDouble(text, out)) return false;
  *out *= scale;
  return *out >= 0;
}

// A bandwidth in GB/s from "270", "270GB/s", "100Gb/s", "100Gbps", "0.8Tb/s"; a bare number is in Gbit/s when
// bareIsGbit, else in GByte/s.
bool parseBandwidth(const std::string& text, bool bareIsGbit, double* gbs) {
  size_t unitAt = 0;
  while (unitAt < text.size() && (std::isdigit(static_cast<unsigned char>(text[unitAt])) || text[unitAt] == '.' ||
                                  text[unitAt] == 'e' || text[unitAt] == '-' || text[unitAt] == '+'))
    ++unitAt;
  double value = 0;
  if (!parseDouble(text.substr(0, unitAt), &value) || !(value > 0)) return false;
  const std::string unit = text.substr(unitAt);
  double factor = 0;
  if (unit.empty())
    factor = bareIsGbit ? 1.0 / 8 : 1.0;
  else if (unit == "GB/s" || unit == "GBps" || unit == "GB")
    factor = 1.0;
  else if (unit == "Gb/s" || unit == "Gbps" || unit == "Gbit/s" || unit == "Gb")
    factor = 1.0 / 8;
  else if (unit == "TB/s" || unit == "TBps")
    factor = 1e3;
  else if (unit == "Tb/s" || unit == "Tbps")
    factor = 1e3 / 8;
  else if (unit == "MB/s")
    factor = 1e-3;
  else
    return false;
  *gbs = value * factor;
  return true;
}

bool parseOnOff(const std::string& text, bool* out) {
  if (text == "on" || text == "1" || text == "true" || text == "yes") return *out = true, true;
  if (text == "off" || text == "0" || text == "false" || text == "no") return *out = false, true;
  return false;
}

template <typename T, typename F>
bool parseList(const std::string& text, std::vector<T>* out, F parseOne) {
  out->clear();
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    T value;
    if (!parseOne(item, &value)) return false;
    out->push_back(value);
  }
  return !out->empty();
}

bool parseInt(const std::string& text, int* out) {
  double v = 0;
  if (!parseDouble(text, &v) || v != std::floor(v) || v < 0 || v > 1e9) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i], value;
    const size_t eq = name.find('=');
    const bool inlineValue = eq != std::string::npos;
    if (inlineValue) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    // Flags without a value.
    if (name == "-h" || name == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (name == "--sweep") {
      o->sweep = true;
      continue;
    }
    if (name == "--no-apply") {
      o->apply = false;
      continue;
    }
    if (name == "--qwz-backward") {
      o->zpp.qwzBackward = true;
      continue;
    }
    if (name == "--no-qwz" || name == "--no-hpz" || name == "--no-qgz") {
      (name == "--no-qwz" ? o->zpp.qwz : name == "--no-hpz" ? o->zpp.hpz : o->zpp.qgz) = false;
      continue;
    }
    static const char* const kValued[] = {"--nodes",
                                          "--gpus",
                                          "--layout",
                                          "--params",
                                          "--elem-bytes",
                                          "--bucket-params",
                                          "--intra-gbs",
                                          "--intra-lat-us",
                                          "--inter-gbps",
                                          "--inter-lat-us",
                                          "--mem-gbs",
                                          "--quantize-gbs",
                                          "--quantize8-gbs",
                                          "--quantize4-gbs",
                                          "--dequantize-gbs",
                                          "--copy-gbs",
                                          "--reduce-rate",
                                          "--launch-us",
                                          "--qwz-overlap",
                                          "--qwz-green-overlap",
                                          "--nccl-sms",
                                          "--pair-allgather",
                                          "--qgz-overlap",
                                          "--max-chunks",
                                          "--compute-ms",
                                          "--tokens-per-gpu",
                                          "--tflops",
                                          "--overlap",
                                          "--qwz",
                                          "--hpz",
                                          "--qgz",
                                          "--wbits",
                                          "--gbits",
                                          "--block",
                                          "--hpz-size",
                                          "--calibrate",
                                          "--intra-regime",
                                          "--inter-regime",
                                          "--sweep-nodes",
                                          "--sweep-inter-gbps",
                                          "--csv"};
    bool known = false;
    for (const char* k : kValued) known = known || name == k;
    if (!known) return fail("unknown option " + name + " (--help lists the options)");
    if (!inlineValue) {
      if (i + 1 >= argc) return fail(name + " needs a value (--help lists the options)");
      value = argv[++i];
    }
    bool ok = true;
    if (name == "--nodes") {
      ok = parseInt(value, &o->nodes) && o->nodes > 0;
    } else if (name == "--gpus") {
      ok = parseInt(value, &o->gpus) && o->gpus > 0;
    } else if (name == "--layout") {
      ok = parseList<int>(value, &o->layout, parseInt);
    } else if (name == "--params") {
      ok = parseCount(value, &o->step.params) && o->step.params > 0;
    } else if (name == "--elem-bytes") {
      ok = parseInt(value, &o->step.elemBytes);
    } else if (name == "--bucket-params") {
      ok = parseCount(value, &o->step.bucketParams);
    } else if (name == "--intra-gbs") {
      ok = parseBandwidth(value, false, &o->intraGBs);
      o->intraBwSet = true;
    } else if (name == "--intra-lat-us") {
      ok = parseDouble(value, &o->intraLatUs) && o->intraLatUs >= 0;
      o->intraLatSet = true;
    } else if (name == "--inter-gbps") {
      ok = parseBandwidth(value, true, &o->interGBs);
      o->interBwSet = true;
    } else if (name == "--inter-lat-us") {
      ok = parseDouble(value, &o->interLatUs) && o->interLatUs >= 0;
      o->interLatSet = true;
    } else if (name == "--mem-gbs") {
      ok = parseBandwidth(value, false, &o->quantize8GBs);
      o->quantize4GBs = o->dequantizeGBs = o->copyGBs = o->quantize8GBs;
    } else if (name == "--quantize-gbs") {
      ok = parseBandwidth(value, false, &o->quantize8GBs);
      o->quantize4GBs = o->quantize8GBs;
    } else if (name == "--quantize8-gbs") {
      ok = parseBandwidth(value, false, &o->quantize8GBs);
    } else if (name == "--quantize4-gbs") {
      ok = parseBandwidth(value, false, &o->quantize4GBs);
    } else if (name == "--dequantize-gbs") {
      ok = parseBandwidth(value, false, &o->dequantizeGBs);
    } else if (name == "--copy-gbs") {
      ok = parseBandwidth(value, false, &o->copyGBs);
    } else if (name == "--reduce-rate") {
      ok = parseDouble(value, &o->reduceRate) && o->reduceRate > 0;
    } else if (name == "--launch-us") {
      ok = parseDouble(value, &o->launchUs) && o->launchUs >= 0;
    } else if (name == "--qwz-overlap" || name == "--qwz-green-overlap" || name == "--qgz-overlap") {
      double* w = name == "--qwz-overlap"   ? &o->qwzOverlap
                  : name == "--qgz-overlap" ? &o->qgzOverlap
                                            : &o->qwzGreenOverlap;
      ok = parseDouble(value, w) && *w >= 0 && *w <= 1;
    } else if (name == "--nccl-sms") {
      ok = parseInt(value, &o->ncclSms) && o->ncclSms >= 0;
    } else if (name == "--pair-allgather") {
      ok = parseInt(value, &o->pairAllGather) && o->pairAllGather >= 0 && o->pairAllGather <= 2;
    } else if (name == "--max-chunks") {
      ok = parseInt(value, &o->maxChunks) && o->maxChunks >= 1;
    } else if (name == "--compute-ms") {
      ok = parseDouble(value, &o->step.computeMs) && o->step.computeMs >= 0;
      o->computeSet = true;
    } else if (name == "--tokens-per-gpu") {
      ok = parseCount(value, &o->tokensPerGpu);
    } else if (name == "--tflops") {
      ok = parseDouble(value, &o->tflops) && o->tflops > 0;
    } else if (name == "--overlap") {
      if (value == "sum")
        o->step.overlap = 0;
      else if (value == "max")
        o->step.overlap = 1;
      else
        ok = parseDouble(value, &o->step.overlap) && o->step.overlap >= 0 && o->step.overlap <= 1;
    } else if (name == "--qwz") {
      ok = parseOnOff(value, &o->zpp.qwz);
    } else if (name == "--hpz") {
      ok = parseOnOff(value, &o->zpp.hpz);
    } else if (name == "--qgz") {
      ok = parseOnOff(value, &o->zpp.qgz);
    } else if (name == "--wbits") {
      ok = parseInt(value, &o->zpp.weightBits);
    } else if (name == "--gbits") {
      ok = parseInt(value, &o->zpp.gradBits);
    } else if (name == "--block") {
      ok = parseInt(value, &o->zpp.blockSize);
    } else if (name == "--hpz-size") {
      ok = parseInt(value, &o->zpp.hpzSize);
    } else if (name == "--calibrate") {
      // One path, or several: the arguments after it up to the next option.
      o->calibrateFiles.push_back(value);
      while (!inlineValue && i + 1 < argc && argv[i + 1][0] != '-') o->calibrateFiles.push_back(argv[++i]);
    } else if (name == "--intra-regime") {
      o->intraRegime = value;
    } else if (name == "--inter-regime") {
      o->interRegime = value;
    } else if (name == "--sweep-nodes") {
      ok = parseList<int>(value, &o->sweepNodes, [](const std::string& t, int* v) { return parseInt(t, v) && *v > 0; });
    } else if (name == "--sweep-inter-gbps") {
      ok = parseList<double>(value, &o->sweepInterGBs,
                             [](const std::string& t, double* v) { return parseBandwidth(t, true, v); });
    } else if (name == "--csv") {
      o->csv = value;
    } else {
      return fail("unknown option " + name + " (--help lists the options)");
    }
    if (!ok) return fail("bad value '" + value + "' for " + name);
  }
  if (!(o->step.params > 0)) o->step.params = 20e9;
  return true;
}

// Sets every kind of a link to bandwidth bw, keeping the ratios between kinds (a calibrated all-to-all stays
// as much slower than the all-gather as it was measured) and between a kind's small-message line and its large one.
void setBandwidth(zp::LinkParams* p, double bw) {
  const double base = p->allGather.bwGBs > 0 ? p->allGather.bwGBs : bw;
  for (zp::LinkCost* l : {&p->allGather, &p->reduceScatter, &p->allToAll}) {
    l->bwGBs = l->bwGBs / base * bw;
    l->smallBwGBs = l->smallBwGBs / base * bw;
  }
}
// Sets every kind's per-step cost; a calibrated small-message line (its own latency, the calibrated fabric's) is
// dropped: the flag's figure then holds for every size.
void setLatency(zp::LinkParams* p, double us) {
  for (zp::LinkCost* l : {&p->allGather, &p->reduceScatter, &p->allToAll}) {
    l->latencyUs = us;
    l->smallBelowBytes = 0;
  }
}

std::string human(double bytes) {
  char buf[32];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.2f MB", bytes / 1e6);
  else if (bytes >= 1e3)
    std::snprintf(buf, sizeof(buf), "%.2f KB", bytes / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  return buf;
}

std::string humanCount(double n) {
  char buf[32];
  if (n >= 1e9)
    std::snprintf(buf, sizeof(buf), "%.4gB", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(buf, sizeof(buf), "%.4gM", n / 1e6);
  else
    std::snprintf(buf, sizeof(buf), "%.4g", n);
  return buf;
}

std::string describeLink(const zp::LinkParams& p, bool perNode) {
  char buf[256];
  const zp::LinkCost& ag = p.allGather;
  std::snprintf(buf, sizeof(buf), "%.1f GB/s (%.0f Gb/s) per %s, %.1f us/step", ag.bwGBs, ag.bwGBs * 8,
                perNode ? "node" : "GPU", ag.latencyUs);
  std::string s = buf;
  if (p.reduceScatter.bwGBs != ag.bwGBs || p.allToAll.bwGBs != ag.bwGBs || p.reduceScatter.latencyUs != ag.latencyUs ||
      p.allToAll.latencyUs != ag.latencyUs) {
    std::snprintf(buf, sizeof(buf), " [reduce-scatter %.1f GB/s %.1f us, all-to-all %.1f GB/s %.1f us]",
                  p.reduceScatter.bwGBs, p.reduceScatter.latencyUs, p.allToAll.bwGBs, p.allToAll.latencyUs);
    s += buf;
  }
  const char* kinds[] = {"all-gather", "reduce-scatter", "all-to-all"};
  const zp::LinkCost* costs[] = {&p.allGather, &p.reduceScatter, &p.allToAll};
  for (int k = 0; k < 3; ++k) {
    if (!costs[k]->hasSmallLine()) continue;
    std::snprintf(buf, sizeof(buf), "; below %.0f MiB %s %.1f GB/s %.1f us where lower",
                  costs[k]->smallBelowBytes / 1048576, kinds[k], costs[k]->smallBwGBs, costs[k]->smallLatencyUs);
    s += buf;
  }
  return s;
}

std::string describeLayout(const zp::ClusterSpec& c) {
  if (c.isEven())
    return std::to_string(c.nodes()) + " node(s) x " + std::to_string(c.gpusPerNode.front()) +
           " GPUs = " + std::to_string(c.nranks()) + " GPUs";
  std::string s = std::to_string(c.nodes()) + " nodes of {";
  for (int i = 0; i < c.nodes(); ++i) s += (i ? "," : "") + std::to_string(c.gpusPerNode[i]);
  return s + "} GPUs = " + std::to_string(c.nranks()) + " GPUs (uneven)";
}

void printRow(const char* label, const char* who, const zp::CollectiveCost* cc, const zp::Traffic& t,
              double modelBytes) {
  std::printf("    %-16s %-4s %-34s %12.3f %12.3f %9.3f M %10.1f %8.1f %9.1f %9.1f %10.1f\n", label, who,
              cc ? cc->scheme.c_str() : "", t.intraBytes / 1e9, t.interBytes / 1e9, t.nodeEgressBytes / modelBytes,
              t.linkUs / 1e3, t.latencyUs / 1e3, t.kernelUs / 1e3, t.hiddenUs / 1e3, t.timeUs() / 1e3);
}

void printComparison(const Options& o, const zp::ClusterSpec& c, const zp::Comparison& r) {
  const zp::StepConfig& s = o.step;
  const double calls = r.zero3.forward.calls;
  std::printf("# zpccl-model: %s; %s parameters, M = %s (%s); %.0f call(s) per collective\n", describeLayout(c).c_str(),
              humanCount(s.params).c_str(), human(r.modelBytes).c_str(), s.elemBytes == 2 ? "bf16" : "fp32", calls);
  std::printf("# intra-node link: %s\n", describeLink(c.intra, false).c_str());
  std::printf("# inter-node link: %s\n", describeLink(c.inter, true).c_str());
  const zp::KernelParams& k = c.kernel;
  std::printf(
      "# kernels: quantize int8 %.0f GB/s + %.1f us, int4 %.0f GB/s + %.1f us, dequantize %.0f GB/s + %.1f us (bytes "
      "read + written), reduce %.0f G element-sources/s + %.1f us, copy %.0f GB/s + %.1f us\n",
      k.quantizeInt8.rate, k.quantizeInt8.launchUs, k.quantizeInt4.rate, k.quantizeInt4.launchUs, k.dequantize.rate,
      k.dequantize.launchUs, k.reduce.rate, k.reduce.launchUs, k.copy.rate, k.copy.launchUs);
  const zp::PipelineParams& p = c.pipeline;
  std::printf(
      "# pipeline: chunks of %.0f MiB logical, at most %d per call; overlap achieved (share of an ideal pipeline's): "
      "qwZ %.2f (%s; %s: %.2f), qgZ %.2f\n",
      p.chunkBytes / (1024.0 * 1024), p.maxChunks, p.gatherOverlap(),
      p.greenContext() ? ("kernels in a green context, " + std::to_string(p.ncclSms) + " SMs left to NCCL").c_str()
                       : "kernels on every SM",
      p.greenContext() ? "every SM, --nccl-sms 0" : "green context, the default",
      p.greenContext() ? p.qwzOverlap : p.qwzGreenOverlap, p.qgzOverlap);
  const char* pairModes[] = {"ncclSend/ncclRecv", "one all-gather (plus a copy)",
                             "one all-gather (plus a copy) across nodes, ncclSend/ncclRecv within one"};
  std::printf("# qgZ's exchanges between two ranks: %s (--pair-allgather %d)\n",
              p.pairAllGather >= 0 && p.pairAllGather <= 2 ? pairModes[p.pairAllGather] : "?", p.pairAllGather);
  std::printf("# ZeRO++: qwZ %s, hpZ %s, qgZ %s; block %d\n",
              o.zpp.qwz ? ("int" + std::to_string(o.zpp.weightBits) + (o.zpp.qwzBackward ? " fwd+bwd" : " fwd")).c_str()
                        : "off",
              o.zpp.hpz ? "on" : "off", o.zpp.qgz ? ("int" + std::to_string(o.zpp.gradBits)).c_str() : "off",
              o.zpp.blockSize);
  std::printf("#\n#   %-16s %-4s %-34s %12s %12s %11s %10s %8s %9s %9s %10s\n", "collective", "", "scheme",
              "intra GB/GPU", "inter GB/GPU", "x-node/node", "link ms", "lat ms", "kernel ms", "hidden ms", "time ms");
  std::printf("#   (time = link + lat + kernel - hidden: what the chunk pipeline overlaps)\n");
  const char* labels[] = {"forward gather", "backward gather", "grad reduce-scat"};
  const zp::CollectiveCost* z3[] = {&r.zero3.forward, &r.zero3.backward, &r.zero3.gradient};
  const zp::CollectiveCost* zpp[] = {&r.zeropp.forward, &r.zeropp.backward, &r.zeropp.gradient};
  for (int k = 0; k < 3; ++k) {
    printRow(labels[k], "Z3", z3[k], z3[k]->traffic, r.modelBytes);
    printRow("", "Z++", zpp[k], zpp[k]->traffic, r.modelBytes);
  }
  printRow("total comm", "Z3", nullptr, r.zero3.comm, r.modelBytes);
  printRow("", "Z++", nullptr, r.zeropp.comm, r.modelBytes);
  if (c.isEven())
    std::printf("#\n# cross-node volume per step in units of M (bytes leaving a node; per GPU NIC: / %d):\n",
                c.gpusPerNode.front());
  else
    std::printf("#\n# cross-node volume per step in units of M (bytes leaving the busiest node):\n");
  const double pz3 = r.paperZero3.total(), pzpp = r.paperZeropp.total();
  std::printf(
      "#   paper accounting (bf16 baseline, no block scales, large-n limit): ZeRO-3 %.2f M -> ZeRO++ %.2f M"
      " (fwd %.2f + bwd %.2f + grad %.2f), %.2fx less\n",
      pz3, pzpp, r.paperZeropp.forward, r.paperZeropp.backward, r.paperZeropp.gradient, pzpp > 0 ? pz3 / pzpp : 0.0);
  std::printf(
      "#   exact (an fp32 scale per %d elements adds %.2f%% to int%d weights and %.2f%% to int%d gradients; 16-byte"
      " padding; (n-1)/n): ZeRO-3 %.3f M -> ZeRO++ %.3f M",
      o.zpp.blockSize, 3200.0 / (o.zpp.blockSize * o.zpp.weightBits), o.zpp.weightBits,
      3200.0 / (o.zpp.blockSize * o.zpp.gradBits), o.zpp.gradBits, r.zero3.crossNodeM, r.zeropp.crossNodeM);
  if (r.zeropp.crossNodeM > 0)
    std::printf(", %.2fx less\n", r.zero3.crossNodeM / r.zeropp.crossNodeM);
  else
    std::printf("\n");
  std::printf("# step: compute %.1f ms%s, overlap %.2f (step = compute + comm - overlap * min(compute, comm))\n",
              s.computeMs, o.computeSet ? "" : " (6 x params x tokens / flops)", s.overlap);
  std::printf("#   ZeRO-3 comm %.1f ms, step %.1f ms | ZeRO++ comm %.1f ms, step %.1f ms | speedup %.2fx\n",
              r.zero3.comm.timeUs() / 1e3, r.zero3.stepUs / 1e3, r.zeropp.comm.timeUs() / 1e3, r.zeropp.stepUs / 1e3,
              r.speedup);
  if (r.hpzSecondaryBytes > 0)
    std::printf("# hpZ memory: secondary shard %s per GPU (M / hpZ group size)\n", human(r.hpzSecondaryBytes).c_str());
  for (const std::string& note : r.notes) std::printf("# note: %s\n", note.c_str());
}

bool readFile(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return true;
}

std::string describeFit(const zp::ParamFit& f) {
  if (!f.ok) return "(not fitted)";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "(%d pts, rms %.1f%%)", f.points, f.rmsErrPct);
  return buf;
}

// The second count: the checks averaged per measured point (the same call in several files), with the repeats'
// spread; listed from 16 MiB up where a point has repeats or is flagged.
void printPoints(const zp::Calibration& cal) {
  int large = 0, repeated = 0;
  for (const zp::PointCheck& p : cal.points) {
    large += p.size >= zp::kCheckMinBytes;
    repeated += p.size >= zp::kCheckMinBytes && p.repeats > 1;
  }
  std::printf(
      "# measured points: the rows of one op, regime, type, size, bits, block, nodes, ranks and configuration averaged"
      " across files (%d of %d from 16 MiB up repeated)\n",
      repeated, large);
  std::printf("#   %-34s %-8s %14s %4s %5s %-15s %3s %12s %25s %7s %12s %8s\n", "op", "regime", "size", "bits", "nodes",
              "configuration", "n", "mean us", "min .. max us", "spread", "predicted us", "error %");
  for (const zp::PointCheck& p : cal.points) {
    if (p.size < zp::kCheckMinBytes || (p.repeats < 2 && !p.flagged)) continue;
    char range[64];
    std::snprintf(range, sizeof(range), "%.1f .. %.1f", p.minUs, p.maxUs);
    std::printf("  %c %-34s %-8s %14.0f %4d %5d %-15s %3d %12.1f %25s %6.1f%% %12.1f %+8.1f\n", p.flagged ? '!' : ' ',
                p.what.c_str(), p.regime.c_str(), p.size, p.bits, p.nodes, p.config.empty() ? "-" : p.config.c_str(),
                p.repeats, p.measuredUs, range, 100 * (p.maxUs - p.minUs) / p.measuredUs, p.predictedUs, p.errPct);
  }
  std::printf(
      "# %zu measured point(s), %d from 16 MiB up, %d flagged: %d of %d within %.0f%% (per row above: the"
      " headline)\n",
      cal.points.size(), large, cal.pointsFlagged, large - cal.pointsFlagged, large, zp::kCheckMaxErrPct);
}

// Fits, reports, and (unless --no-apply) puts the fitted links, kernels and overlaps into the cluster.
bool runCalibration(Options* o) {
  std::vector<zp::PerfRow> rows;
  std::string names;
  for (const std::string& path : o->calibrateFiles) {
    std::string text, error;
    if (!readFile(path, &text)) return fail("cannot read " + path);
    const size_t before = rows.size();
    if (!zp::parsePerfJson(text, &rows, &error)) return fail(path + ": " + error);
    names += (names.empty() ? "" : ", ") + path + " (" + std::to_string(rows.size() - before) + ")";
  }
  const zp::Calibration cal = zp::calibrate(rows, o->cluster.kernel, o->cluster.pipeline);
  std::printf("# calibration from %s: %zu row(s)\n", names.c_str(), rows.size());
  std::printf("#   links, fitted from %.0f MiB up (a step of x bytes: latency + x / bw)\n",
              zp::kFitMinBytes / (1024.0 * 1024));
  const char* kinds[] = {"all-gather", "reduce-scatter", "all-to-all"};
  for (const auto& entry : cal.regimes) {
    const zp::RegimeFit& f = entry.second;
    const zp::LinkFit* fits[] = {&f.allGather, &f.reduceScatter, &f.allToAll};
    std::printf("#   regime %-8s", entry.first.c_str());
    for (int k = 0; k < 3; ++k) {
      if (fits[k]->ok)
        std::printf("  %s %.2f GB/s %.2f us/step (%d pts, rms %.1f%%)", kinds[k], fits[k]->cost.bwGBs,
                    fits[k]->cost.latencyUs, fits[k]->points, fits[k]->rmsErrPct);
      else
        std::printf("  %s -", kinds[k]);
    }
    std::printf("\n");
    const zp::LinkFit* small[] = {&f.smallAllGather, &f.smallReduceScatter, &f.smallAllToAll};
    std::printf("#     small messages");
    for (int k = 0; k < 3; ++k) {
      if (small[k]->ok)
        std::printf("  %s below %.0f MiB %.2f GB/s %.2f us/step (%d pts, rms %.1f%%)", kinds[k],
                    fits[k]->cost.smallBelowBytes / (1024.0 * 1024), small[k]->cost.bwGBs, small[k]->cost.latencyUs,
                    small[k]->points, small[k]->rmsErrPct);
      else
        std::printf("  %s - (the large line)", kinds[k]);
    }
    std::printf("\n");
  }
  std::printf("#   (below its range a collective costs the lower of its small- and large-message lines)\n");
  const zp::KernelParams& k = cal.kernel;
  std::printf("#   kernels: quantize int8 %.0f GB/s + %.2f us %s, int4 %.0f GB/s + %.2f us %s\n", k.quantizeInt8.rate,
              k.quantizeInt8.launchUs, describeFit(cal.quantizeInt8Fit).c_str(), k.quantizeInt4.rate,
              k.quantizeInt4.launchUs, describeFit(cal.quantizeInt4Fit).c_str());
  std::printf("#            dequantize %.0f GB/s + %.2f us %s, copy %.0f GB/s + %.2f us %s\n", k.dequantize.rate,
              k.dequantize.launchUs, describeFit(cal.dequantizeFit).c_str(), k.copy.rate, k.copy.launchUs,
              describeFit(cal.copyFit).c_str());
  std::printf("#            reduce %.1f G element-sources/s + %.2f us %s\n", k.reduce.rate, k.reduce.launchUs,
              describeFit(cal.reduceFit).c_str());
  std::printf("#   pipeline overlap: qwZ %.3f %s with every SM, %.3f %s in a green context (%d row(s)); qgZ %.3f %s\n",
              cal.pipeline.qwzOverlap, describeFit(cal.qwzOverlapFit).c_str(), cal.pipeline.qwzGreenOverlap,
              describeFit(cal.qwzGreenOverlapFit).c_str(), cal.greenRows, cal.pipeline.qgzOverlap,
              describeFit(cal.qgzOverlapFit).c_str());
  for (const std::string& note : cal.notes) std::printf("#   note: %s\n", note.c_str());
  std::printf("# predicted vs measured (flag '!': size >= 16 MiB and |error| > %.0f%%)\n", zp::kCheckMaxErrPct);
  std::printf("#   %-34s %-8s %14s %5s %5s %13s %13s %8s\n", "op", "regime", "size", "ranks", "nodes", "measured us",
              "predicted us", "error %");
  for (const zp::RowCheck& c : cal.checks)
    std::printf("  %c %-34s %-8s %14.0f %5d %5d %13.1f %13.1f %+8.1f\n", c.flagged ? '!' : ' ', c.what.c_str(),
                c.regime.c_str(), c.size, c.ranks, c.nodes, c.measuredUs, c.predictedUs, c.errPct);
  int large = 0;
  for (const zp::RowCheck& c : cal.checks) large += c.size >= zp::kCheckMinBytes;
  std::printf("# %zu row(s) checked, %d from 16 MiB up, %d flagged: %d of %d within %.0f%%\n", cal.checks.size(), large,
              cal.flagged, large - cal.flagged, large, zp::kCheckMaxErrPct);
  printPoints(cal);
  std::printf("#\n");
  if (!o->apply) return true;

  auto pick = [&](const std::string& wanted, std::initializer_list<const char*> defaults) -> std::string {
    if (!wanted.empty()) return cal.regimes.count(wanted) ? wanted : std::string();
    for (const char* d : defaults)
      if (cal.regimes.count(d)) return d;
    return std::string();
  };
  const std::string intra = pick(o->intraRegime, {"nvlink"});
  const std::string inter = pick(o->interRegime, {"net", "shm"});
  if (!o->intraRegime.empty() && intra.empty()) return fail("no fitted regime '" + o->intraRegime + "'");
  if (!o->interRegime.empty() && inter.empty()) return fail("no fitted regime '" + o->interRegime + "'");
  if (!intra.empty()) o->cluster.intra = cal.regimes.at(intra).link;
  if (!inter.empty()) o->cluster.inter = cal.regimes.at(inter).link;
  o->cluster.kernel = cal.kernel;      // kinds without rows kept the ones given
  o->cluster.pipeline = cal.pipeline;  // ncclSms as given: the model's configuration, not the rows'
  std::printf(
      "# the model below: intra-node link %s, inter-node link %s (taken as the bandwidth of a whole node),"
      " kernels and overlaps %s; flags given explicitly still win\n#\n",
      intra.empty() ? "from the flags" : ("= regime " + intra).c_str(),
      inter.empty() ? "from the flags" : ("= regime " + inter).c_str(),
      cal.kernelFitted ? "as calibrated" : "from the flags");
  return true;
}

bool runSweep(const Options& o, const zp::ClusterSpec& base) {
  std::FILE* f = std::fopen(o.csv.c_str(), "w");
  if (f == nullptr) return fail("cannot write " + o.csv);
  std::fprintf(f,
               "inter_gbps,inter_gbs,nodes,gpus_per_node,gpus,params,bucket_params,compute_ms,overlap,zero3_comm_ms,"
               "zeropp_comm_ms,"
               "zero3_step_ms,zeropp_step_ms,speedup,zero3_inter_gb_per_gpu,zeropp_inter_gb_per_gpu,"
               "zero3_intra_gb_per_gpu,zeropp_intra_gb_per_gpu,zero3_crossnode_m,zeropp_crossnode_m\n");
  const int gpus = base.gpusPerNode.front();
  for (double bw : o.sweepInterGBs) {
    std::printf("# sweep: %d GPUs per node, inter-node %.0f Gb/s (%.1f GB/s) per node, compute %.1f ms\n", gpus, bw * 8,
                bw, o.step.computeMs);
    std::printf("#   %5s %5s %12s %12s %12s %12s %8s %10s %10s\n", "nodes", "GPUs", "Z3 comm ms", "Z++ comm ms",
                "Z3 step ms", "Z++ step ms", "speedup", "Z3 xnode", "Z++ xnode");
    for (int nodes : o.sweepNodes) {
      zp::ClusterSpec c = base;
      c.gpusPerNode.assign(nodes, gpus);
      setBandwidth(&c.inter, bw);
      std::string error;
      const zp::Comparison r = zp::compareStep(c, o.step, o.zpp, &error);
      if (!error.empty()) {
        std::fclose(f);
        return fail(error);
      }
      std::printf("    %5d %5d %12.1f %12.1f %12.1f %12.1f %7.2fx %8.3f M %8.3f M\n", nodes, c.nranks(),
                  r.zero3.comm.timeUs() / 1e3, r.zeropp.comm.timeUs() / 1e3, r.zero3.stepUs / 1e3,
                  r.zeropp.stepUs / 1e3, r.speedup, r.zero3.crossNodeM, r.zeropp.crossNodeM);
      std::fprintf(f, "%g,%g,%d,%d,%d,%g,%g,%g,%g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n", bw * 8, bw,
                   nodes, gpus, c.nranks(), o.step.params, o.step.bucketParams, o.step.computeMs, o.step.overlap,
                   r.zero3.comm.timeUs() / 1e3, r.zeropp.comm.timeUs() / 1e3, r.zero3.stepUs / 1e3,
                   r.zeropp.stepUs / 1e3, r.speedup, r.zero3.comm.interBytes / 1e9, r.zeropp.comm.interBytes / 1e9,
                   r.zero3.comm.intraBytes / 1e9, r.zeropp.comm.intraBytes / 1e9, r.zero3.crossNodeM,
                   r.zeropp.crossNodeM);
    }
  }
  std::fclose(f);
  std::printf("# sweep written to %s (plot: python3 tools/plot_model.py %s)\n", o.csv.c_str(), o.csv.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parseArgs(argc, argv, &o)) return 2;
  o.cluster.intra = zp::LinkParams::uniform(o.intraGBs, o.intraLatUs);
  o.cluster.inter = zp::LinkParams::uniform(o.interGBs, o.interLatUs);
  if (!o.calibrateFiles.empty() && !runCalibration(&o)) return 1;
  // Flags given explicitly win over a calibration.
  zp::KernelParams& k = o.cluster.kernel;
  if (o.quantize8GBs > 0) k.quantizeInt8.rate = o.quantize8GBs;
  if (o.quantize4GBs > 0) k.quantizeInt4.rate = o.quantize4GBs;
  if (o.dequantizeGBs > 0) k.dequantize.rate = o.dequantizeGBs;
  if (o.copyGBs > 0) k.copy.rate = o.copyGBs;
  if (o.reduceRate > 0) k.reduce.rate = o.reduceRate;
  if (o.launchUs >= 0)
    for (zp::KernelCost* kc : {&k.quantizeInt8, &k.quantizeInt4, &k.dequantize, &k.reduce, &k.copy})
      kc->launchUs = o.launchUs;
  if (o.qwzOverlap >= 0) o.cluster.pipeline.qwzOverlap = o.qwzOverlap;
  if (o.qwzGreenOverlap >= 0) o.cluster.pipeline.qwzGreenOverlap = o.qwzGreenOverlap;
  if (o.ncclSms >= 0) o.cluster.pipeline.ncclSms = o.ncclSms;
  if (o.pairAllGather >= 0) o.cluster.pipeline.pairAllGather = o.pairAllGather;
  if (o.qgzOverlap >= 0) o.cluster.pipeline.qgzOverlap = o.qgzOverlap;
  if (o.maxChunks > 0) o.cluster.pipeline.maxChunks = o.maxChunks;
  if (o.intraBwSet) setBandwidth(&o.cluster.intra, o.intraGBs);
  if (o.intraLatSet) setLatency(&o.cluster.intra, o.intraLatUs);
  if (o.interBwSet) setBandwidth(&o.cluster.inter, o.interGBs);
  if (o.interLatSet) setLatency(&o.cluster.inter, o.interLatUs);
  if (!o.layout.empty())
    o.cluster.gpusPerNode = o.layout;
  else
    o.cluster.gpusPerNode.assign(o.nodes, o.gpus);
  if (!o.computeSet) o.step.computeMs = 6 * o.step.params * o.tokensPerGpu / (o.tflops * 1e12) * 1e3;

  std::string error;
  const zp::Comparison r = zp::compareStep(o.cluster, o.step, o.zpp, &error);
  if (!error.empty()) return fail(error) ? 0 : 2;
  printComparison(o, o.cluster, r);
  if (o.sweep) {
    std::printf("#\n");
    if (!o.cluster.isEven()) return fail("--sweep needs an even layout (--gpus)") ? 0 : 2;
    if (!runSweep(o, o.cluster)) return 1;
  }
  return 0;
}
