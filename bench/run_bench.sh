#!/usr/bin/env bash
# Runs the benchmarks natively and through Tandem in the same run on this machine and
# prints `measurement | native | tandem | ratio`; writes bench.json (and bench.png when
# python3 has matplotlib) to OUT_DIR. Ratios are printed, never asserted.
#   bash bench/run_bench.sh TANDEMD TANDEM BUILD_DIR [OUT_DIR]
# It starts `tandemd --backend cuda` (only with a GPU and a built cuda_bench) and
# `tandemd --backend opencl` on 127.0.0.1 and stops them on exit. The raw fabric limit
# (tandem_fabric_pingpong) is measured and listed too.
# TANDEM_BENCH_QUICK=1: tiny repetition counts, sizes up to 1 MiB (the ctest bench_smoke).
# Exit status: 0 when every program ran, every output line parsed and the table printed.
set -uo pipefail

if (($# < 3)); then
  echo "usage: $0 TANDEMD TANDEM BUILD_DIR [OUT_DIR]" >&2
  exit 2
fi
TANDEMD=$1 TANDEM=$2 BUILD=$3 OUT=${4:-$PWD/bench-out}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../scripts/lib/tandemd.sh"
QUICK=${TANDEM_BENCH_QUICK:-0}
[[ $QUICK == 0 || -z $QUICK ]] && QUICK=0 || QUICK=1
export TANDEM_BENCH_QUICK=$QUICK
log() { echo "run_bench: $*" >&2; }
failed=0
fail() { log "FAIL: $*"; failed=1; }

for f in "$TANDEMD" "$TANDEM"; do [[ -x $f ]] || { log "not built: $f"; exit 1; }; done
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/*.txt "$OUT"/*.log "$OUT/bench.json" "$OUT/bench.png"
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-bench.XXXXXX")

server_pids=()
cleanup() {
  local pid
  for pid in "${server_pids[@]}"; do stop_tandemd "$pid"; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The same environment for native and Tandem runs, except what `tandem run` sets.
unset TANDEM_SERVERS LD_PRELOAD OCL_ICD_VENDORS OCL_ICD_FILENAMES
# Idle gaps of up to 100 ms must not look like a lost server.
export TANDEM_FAILOVER_TIMEOUT_MS=600000
export POCL_CACHE_DIR=${POCL_CACHE_DIR:-$work/pocl-cache}
mkdir -p "$POCL_CACHE_DIR"
if ((QUICK)); then RUN_TIMEOUT=60 PING_ITERS=200; else RUN_TIMEOUT=600 PING_ITERS=10000; fi

# Native OpenCL (NVIDIA's, else PoCL), both ICD loaders pinned to it.
source "$HERE/../scripts/lib/opencl-vendors.sh"
vendors=$(native_opencl_vendors "$work") || exit 1
ocl_libs=$(icd_libs "$vendors")
log "native OpenCL: $vendors ($ocl_libs)"

gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep '^GPU' >/dev/null; then gpu=1; fi

# start_server BACKEND: starts tandemd on a free loopback port; sets $server.
start_server() {
  local backend=$1 port pid
  port=$(free_port)
  server=127.0.0.1:$port
  OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$ocl_libs setsid "$TANDEMD" --listen "$server" --backend "$backend" \
    >"$OUT/tandemd-$backend.log" 2>&1 &
  pid=$!
  server_pids+=("$pid")
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    if TANDEM_CONNECT_TIMEOUT_MS=2000 "$TANDEM" info --servers "$server" >"$OUT/info-$backend.txt" 2>/dev/null; then
      log "tandemd --backend $backend on $server: $(head -n1 "$OUT/info-$backend.txt")"
      return 0
    fi
    sleep 0.3
  done
  log "tandemd --backend $backend did not come up; its log:"
  tail -20 "$OUT/tandemd-$backend.log" >&2
  return 1
}

line_re='^[A-Za-z0-9_.]+ -?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)? (us|GB/s)$'
# check FILE: every line is `name value unit`, and there is at least one.
check() {
  local bad
  bad=$(grep -cvE "$line_re" "$1")
  if [[ ! -s $1 ]]; then fail "$1: no measurements"; return 1; fi
  if ((bad > 0)); then fail "$1: $bad unparsable line(s)"; grep -vE "$line_re" "$1" | head -5 >&2; return 1; fi
}

# bench NAME SERVER PROGRAM [tandem run flags]: native run, then through Tandem.
bench() {
  local name=$1 srv=$2 prog=$3; shift 3
  log "$name: native"
  if ! OCL_ICD_VENDORS=$vendors OCL_ICD_FILENAMES=$ocl_libs timeout -k 5 "$RUN_TIMEOUT" "$prog" \
      >"$OUT/$name-native.txt" 2>"$OUT/$name-native.log"; then
    fail "$name natively (exit $?): $(tail -3 "$OUT/$name-native.log")"
    return 1
  fi
  check "$OUT/$name-native.txt" || return 1
  log "$name: through Tandem ($srv)"
  if ! timeout -k 5 "$RUN_TIMEOUT" "$TANDEM" run "$@" --servers "$srv" -- "$prog" \
      >"$OUT/$name-tandem.txt" 2>"$OUT/$name-tandem.log"; then
    fail "$name through Tandem (exit $?): $(tail -3 "$OUT/$name-tandem.log")"
    return 1
  fi
  check "$OUT/$name-tandem.txt" || return 1
  # Join by name: name unit native tandem ratio (>1: Tandem costs more; GB/s inverted).
  awk 'NR == FNR { v[$1] = $2; next }
       { t = ($1 in v) ? v[$1] : ""; r = "-"
         if (t != "" && $2 > 0 && t > 0) r = sprintf("%.3f", $3 == "GB/s" ? $2 / t : t / $2)
         printf "%s %s %s %s %s\n", $1, $3, $2, (t == "" ? "-" : t), r
         if (t == "") missing++ }
       END { exit missing > 0 }' "$OUT/$name-tandem.txt" "$OUT/$name-native.txt" >>"$work/rows.txt" ||
    fail "$name: some measurements missing from the Tandem run"
}

: >"$work/rows.txt"
ran=0
if ((gpu)) && [[ -x $BUILD/bench/cuda_bench ]]; then
  if start_server cuda; then bench cuda "$server" "$BUILD/bench/cuda_bench" && ran=$((ran + 1)); else fail "no CUDA server"; fi
elif ((gpu)); then
  fail "GPU present but $BUILD/bench/cuda_bench not built (nvcc missing?)"
else
  log "cuda: skipped (no GPU)"
fi
if [[ -x $BUILD/bench/opencl_bench ]]; then
  if start_server opencl; then bench opencl "$server" "$BUILD/bench/opencl_bench" --no-cuda && ran=$((ran + 1)); else fail "no OpenCL server"; fi
else
  fail "not built: $BUILD/bench/opencl_bench"
fi

# The raw fabric limit on the provider Tandem picks by default, same host.
: >"$work/fabric.txt"
PING=$BUILD/fabric/tandem_fabric_pingpong
if [[ -x $PING ]]; then
  if timeout -k 5 "$RUN_TIMEOUT" "$PING" --iters "$PING_ITERS" >"$OUT/fabric-raw.txt" 2>"$OUT/fabric.log"; then
    awk '/^8 B round trip:/ { gsub(",", ""); printf "fabric_rtt_8B_median %s us\nfabric_rtt_8B_p90 %s us\n", $6, $9 }
         /^RMA (read|write) 64 MiB:/ { printf "fabric_rma_%s_64MiB %s GB/s\n", $2, $8 }' \
      "$OUT/fabric-raw.txt" >"$work/fabric.txt"
    check "$work/fabric.txt"
  else
    fail "tandem_fabric_pingpong (exit $?): $(tail -3 "$OUT/fabric.log")"
  fi
else
  fail "not built: $PING"
fi

# The table.
fmt='%-30s | %14s | %14s | %7s\n'
{
  printf "$fmt" measurement native tandem ratio
  printf '%s\n' "-------------------------------+----------------+----------------+--------"
  while read -r n u nat tan r; do
    printf "$fmt" "$n" "$nat $u" "$tan $u" "$r"
  done <"$work/rows.txt"
  if [[ -s $OUT/fabric-raw.txt ]]; then
    echo "raw fabric limit (tandem_fabric_pingpong, no GPU API):"
    sed 's/^/  /' "$OUT/fabric-raw.txt"
  fi
  echo "ratio: Tandem's cost over native (time: tandem/native; GB/s: native/tandem); >1 means slower"
} | tee "$OUT/table.txt"

# bench.json
{
  printf '{\n  "quick": %s,\n  "host": "%s",\n  "gpu": %s,\n' "$([[ $QUICK == 1 ]] && echo true || echo false)" \
    "$(hostname | sed 's/["\\]//g')" "$([[ $gpu == 1 ]] && echo true || echo false)"
  printf '  "measurements": [\n'
  awk '{ printf "%s    {\"name\": \"%s\", \"unit\": \"%s\", \"native\": %s, \"tandem\": %s, \"ratio\": %s}",
         (NR > 1 ? ",\n" : ""), $1, $2, $3, ($4 == "-" ? "null" : $4), ($5 == "-" ? "null" : $5) }
       END { if (NR) printf "\n" }' "$work/rows.txt"
  printf '  ],\n  "fabric": [\n'
  awk '{ printf "%s    {\"name\": \"%s\", \"value\": %s, \"unit\": \"%s\"}", (NR > 1 ? ",\n" : ""), $1, $2, $3 }
       END { if (NR) printf "\n" }' "$work/fabric.txt"
  printf '  ],\n  "fabric_raw": ['
  if [[ -s $OUT/fabric-raw.txt ]]; then
    awk '{ gsub(/["\\]/, ""); printf "%s\"%s\"", (NR > 1 ? ", " : ""), $0 }' "$OUT/fabric-raw.txt"
  fi
  printf ']\n}\n'
} >"$OUT/bench.json"

if python3 -c 'import matplotlib' 2>/dev/null; then
  python3 "$HERE/plot.py" "$OUT/bench.json" "$OUT/bench.png" || log "plot.py failed (chart skipped)"
fi

rows=$(wc -l <"$work/rows.txt")
if ((rows == 0)); then fail "no measurements compared"; fi
log "$rows measurements compared over $ran benchmark(s); table, bench.json in $OUT"
exit "$failed"
