#!/usr/bin/env bash
# A short GPU pass for a tight device budget: build, the pipelined-path GPU tests, and the qwZ/qgZ perf tables
# against NCCL in the three regimes (nvlink, shm, net), with JSON under $OUT. tools/gpu-check.sh is the full run.
set -u
top=$(cd "$(dirname "$0")/.." && pwd); cd "$top"
# shellcheck source=tools/regimes.sh
source "$top/tools/regimes.sh"
zp_export_regime nvlink
out=${OUT:-$top/build-gpu/results}; mkdir -p "$out"
meson setup build-gpu -Dgpu_archs=90 --buildtype=release >"$out/setup.log" 2>&1 || { tail -20 "$out/setup.log"; exit 1; }
ninja -C build-gpu >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -20; exit 1; }
B=build-gpu/perf
row() { grep -E '^ +[0-9]+ ' | sed "s/^/$1 /"; }
echo "## GPU tests (pipelined paths, graphs)"
timeout 45 build-gpu/tests/zpccl_gpu_tests --gtest_filter='GpuPipeline*:GpuGraphs*:GpuLifecycle*' 2>&1 | grep -E "OK \]|FAILED|PASSED|Failure" | tail -12
for op in qwz qgz; do
  timeout 30 $B/${op}_perf -b 1M -e 16M -f 4 -n 5 -w 2 -c 1 -R nvlink -J "$out/${op}_check.json" 2>&1 | row "$op-check"
done
echo "## nvlink"
timeout 40 $B/qwz_perf -b 1M -e 1G -f 4 -n 10 -w 3 -c 0 -B 8 -R nvlink -J "$out/qwz8_nvlink.json" 2>&1 | row qwz8-nvlink
timeout 40 $B/qgz_perf -b 1M -e 1G -f 4 -n 10 -w 3 -c 0 -B 4 -R nvlink -J "$out/qgz4_nvlink.json" 2>&1 | row qgz4-nvlink
echo "## shm"
mapfile -t shm_env < <(zp_regime_env shm)
for b in 8 4; do
  env "${shm_env[@]}" timeout 30 $B/qwz_perf -b 64M -e 1G -f 4 -n 5 -w 1 -c 0 -B $b -R shm -J "$out/qwz${b}_shm.json" 2>&1 | row qwz$b-shm
  env "${shm_env[@]}" timeout 30 $B/qgz_perf -b 64M -e 1G -f 4 -n 5 -w 1 -c 0 -B $b -R shm -J "$out/qgz${b}_shm.json" 2>&1 | row qgz$b-shm
done
echo "## net (two processes, distinct NCCL_HOSTID)"
for spec in qwz:8 qgz:4; do
  op=${spec%:*}; b=${spec#*:}; D=$(mktemp -d)
  for i in 0 1; do
    mapfile -t net_env < <(zp_regime_env net "$i")
    env "${net_env[@]}" timeout 40 $B/${op}_perf -P 2 -I $i -D "$D" -t 1 \
      -b 64M -e 256M -f 4 -n 3 -w 1 -c 0 -B $b -R net -J "$out/${op}${b}_net_$i.json" >"$out/${op}${b}_net_$i.log" 2>&1 &
  done
  wait
  row $op$b-net <"$out/${op}${b}_net_0.log"
done
