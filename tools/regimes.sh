# shellcheck shell=bash
# The link regimes of one host (DESIGN.md, "Speed: what to measure and against what"), sourced by the scripts that
# drive GPU runs: the environment that makes each regime, the GPUs a CUDA process started here sees, and the label of
# rows measured as emulated nodes over sockets. zpccl.launch decides the same for Python and tests/child_test.h for
# the C++ GPU tests; tools/python/tests/test_regimes.py holds this file and zpccl.launch together.
#   nvlink        NCCL's own links (NVLink between the GPUs of one process, or of processes of one host)
#   nvlink-procs  as nvlink, a process per GPU, every process naming the same host
#   shm           NCCL's peer-to-peer transport off: the GPUs talk through host shared memory
#   net           a host of its own for each process (NCCL_HOSTID), peer-to-peer and shared memory off: every
#                 transfer over sockets, as between nodes; processes may then share a GPU (NCCL refuses two ranks
#                 of one host on one GPU, not two of different hosts)
#   2x2           a host of its own for each process, whose ranks reach each other as NCCL finds them: nodes of
#                 several GPUs (NVLink inside a node), sockets between nodes
# Every regime keeps NVLink multicast (NVLS) off: the machines are shared.
#   source tools/regimes.sh
#   mapfile -t env_words < <(zp_regime_env net "$i")   # VAR=value words, e.g. for env(1)
#   zp_export_regime nvlink                            # or exported into this shell
#   gpus=$(zp_visible_gpus); label=$(zp_net_label "$gpus")     # net-on1gpu, or net-on1gpu-mps under CUDA MPS

ZP_REGIMES="nvlink nvlink-procs shm net 2x2"

# Whether NAME is one of ZP_REGIMES.
zp_is_regime() { case " $ZP_REGIMES " in *" ${1-} "*) return 0 ;; esac; return 1; }

# The NCCL_HOSTID of process PROCESS of a run whose processes are hosts of their own.
zp_host_id() { echo "zp-node-$1"; }

# zp_regime_env REGIME [PROCESS]: REGIME's variables for process PROCESS of the run (0, 1, ...), a VAR=value word a
# line. net and 2x2 name each process's host, so they need PROCESS; the others take the same variables in every
# process. Exit status 2, with a message, for an unknown regime or a missing index.
zp_regime_env() {
  local regime=${1-} process=${2-}
  zp_is_regime "$regime" || { echo "regimes.sh: unknown regime '$regime' (known: $ZP_REGIMES)" >&2; return 2; }
  if [ "$regime" = net ] || [ "$regime" = 2x2 ]; then
    [[ $process =~ ^[0-9]+$ ]] || { echo "regimes.sh: regime $regime needs the index of the process" >&2; return 2; }
  fi
  echo NCCL_NVLS_ENABLE=0
  case $regime in
    nvlink-procs) echo "NCCL_HOSTID=$(zp_host_id 0)" ;;
    shm) echo NCCL_P2P_DISABLE=1 ;;
    net) printf '%s\n' NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 "NCCL_HOSTID=$(zp_host_id "$process")" ;;
    2x2) echo "NCCL_HOSTID=$(zp_host_id "$process")" ;;
  esac
}

# zp_export_regime REGIME [PROCESS]: REGIME's variables exported into this shell (and what it starts).
zp_export_regime() {
  local words word
  words=$(zp_regime_env "$@") || return
  for word in $words; do export "${word?}"; done
}

# The GPUs a CUDA process started from here sees: nvidia-smi's list (none without nvidia-smi), narrowed by
# CUDA_VISIBLE_DEVICES when it is set, read as CUDA reads it: its entries up to the first that names no GPU (an
# index beyond the list, or a word that is neither an index nor a GPU- or MIG- UUID).
zp_visible_gpus() {
  local listed wanted=0 entry entries
  listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  listed=${listed:-0}
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    IFS=, read -ra entries <<<"$CUDA_VISIBLE_DEVICES"
    for entry in "${entries[@]}"; do
      entry=${entry//[[:space:]]/}
      if [[ $entry =~ ^[0-9]+$ ]]; then
        [ "$((10#$entry))" -lt "$listed" ] || break
      elif [[ $entry != GPU-* && $entry != MIG-* ]]; then
        break
      fi
      wanted=$((wanted + 1))
    done
    [ "$wanted" -lt "$listed" ] && listed=$wanted
  fi
  echo "$listed"
}

# "-mps" when CUDA MPS serves the CUDA processes started here, else nothing: the suffix of the labels of rows whose
# processes share GPUs. A client connects to the MPS daemon whose pipe folder (CUDA_MPS_PIPE_DIRECTORY, else
# /tmp/nvidia-mps) holds its "control" endpoint (a UNIX socket; a named pipe in older drivers). Under MPS the
# processes' kernels run together instead of taking turns in time slices, which changes what a call costs
# (perf/RESULTS.md, "What the one-GPU stand-in charges").
zp_sharing_suffix() {
  local control=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}/control
  if [ -S "$control" ] || [ -p "$control" ]; then echo -mps; fi
}

# The regime label of rows measured as emulated nodes over sockets (regime net) on GPUS GPUs, which the processes
# may share.
zp_net_label() { echo "net-on${1}gpu$(zp_sharing_suffix)"; }
