#!/usr/bin/env bash
# DS-CUDA's fault-tolerance overhead table, reproduced on the REMD example (examples/cuda/remd):
#   T0  native
#   T1  through Tandem, no fault tolerance (one tandemd)
#   T2  TANDEM_REDUNDANCY=2 with checkpoints every P s, no faults
#   T3  the same with bit flips injected into one replica's read backs
# for P = 2, 10, 50 s; prints T1/T0, T2/T1, T3/T1 per period (ratios only, never asserted).
# Flips: DS-CUDA used lambda = 1/900 s. Scaled to this run's length, a T1-second run sees what
# a 900 s run sees at 1/900 s: FLIPS (default 1) per run on average, injected by
# tandemd --inject-bitflip-per-s FLIPS/T1 (a Poisson process in time). A T3 run in which no
# flip landed measures nothing and is run again (up to 5 tries); the table gives the flips of
# the run it reports and the cost of one flip, (T3 - T2) / flips.
#   bash bench/ft_overhead.sh BUILD_DIR OUT_DIR [STEPS]
set -uo pipefail
BUILD=$1 OUT=$2 STEPS=${3:-200000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../scripts/lib/tandemd.sh"
TANDEMD=$BUILD/server/tandemd TANDEM=$BUILD/tools/tandem REMD=$BUILD/examples/cuda/remd
FLIPS=${FLIPS:-1}
mkdir -p "$OUT"
log() { echo "ft_overhead: $*" >&2; }
for f in "$TANDEMD" "$TANDEM" "$REMD"; do [[ -x $f ]] || { log "not built: $f"; exit 1; }; done
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { log "no GPU"; exit 77; }
gpus=$(nvidia-smi -L | grep -c '^GPU')
pids=()
cleanup() { local p; for p in "${pids[@]}"; do stop_tandemd "$p"; done; }
trap cleanup EXIT
unset TANDEM_SERVERS TANDEM_REDUNDANCY TANDEM_SPARE_SERVERS TANDEM_CHECKPOINT_PERIOD LD_PRELOAD

# server NAME GPU [options]: echoes host:port
server() {
  local name=$1 gpu=$2 port; shift 2
  port=$(free_port)
  setsid "$TANDEMD" --listen 127.0.0.1:$port --backend cuda --devices "$gpu" "$@" >"$OUT/tandemd-$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do
    TANDEM_CONNECT_TIMEOUT_MS=2000 "$TANDEM" info --servers 127.0.0.1:$port >/dev/null 2>&1 && { echo 127.0.0.1:$port; return 0; }
    sleep 0.2
  done
  log "tandemd $name did not start"; exit 1
}
seconds() { grep -o '^time: [0-9.]* s for' "$1" | grep -o '[0-9.]*' | head -1; }
# run NAME [VAR=VALUE...]: remd through Tandem (or natively for NAME=T0)
run() {
  local name=$1; shift
  if [[ $name == T0 ]]; then
    timeout 1200 "$REMD" --steps "$STEPS" >"$OUT/$name.out" 2>"$OUT/$name.err"
  else
    env TANDEM_STATS=1 TANDEM_FAILOVER_TIMEOUT_MS=60000 "$@" timeout 1200 "$TANDEM" run -- "$REMD" --steps "$STEPS" \
      >"$OUT/$name.out" 2>"$OUT/$name.err"
  fi || { log "$name failed:"; tail -5 "$OUT/$name.err" >&2; return 1; }
  grep -v '^time:' "$OUT/$name.out" >"$OUT/$name.result"
  if [[ $name != T0 ]] && ! cmp -s "$OUT/T0.result" "$OUT/$name.result"; then log "$name: output differs from native"; return 1; fi
  log "$name: $(seconds "$OUT/$name.out") s $(grep -o 'fault tolerance: .*' "$OUT/$name.err" | head -1)"
}

g1=0; ((gpus >= 2)) && g1=1
a=$(server a 0); b=$(server b "$g1")
run T0 || exit 1
run T1 TANDEM_SERVERS="$a" || exit 1
T0=$(seconds "$OUT/T0.out") T1=$(seconds "$OUT/T1.out")
lambda=$(awk -v f="$FLIPS" -v t="$T1" 'BEGIN { printf "%.6f", f / t }')
fa=$(server flip-a 0 --inject-bitflip-per-s "$lambda"); fb=$(server flip-b "$g1")
{
  echo "REMD ${STEPS} steps; GPUs on this machine: $gpus; replicas on GPU 0 and GPU $g1; flips: lambda=$lambda/s (~$FLIPS per run)"
  printf "%-8s %10s %10s %10s %10s %10s %10s %6s %10s %12s\n" period T0_s T1_s T2_s T3_s T2/T1 T3/T1 flips rollbacks s_per_flip
} | tee "$OUT/ft_overhead.txt"
flipped() { grep -c 'fault injection: flipped' "$OUT/tandemd-flip-a.log"; }
for period in ${PERIODS:-2 10 50}; do
  run T2-$period TANDEM_SERVERS="$a,$b" TANDEM_REDUNDANCY=2 TANDEM_CHECKPOINT_PERIOD=$period || continue
  # A T3 run in which no flip happened to land measures nothing: up to 5 tries.
  for try in 1 2 3 4 5; do
    before=$(flipped)
    run T3-$period TANDEM_SERVERS="$fa,$fb" TANDEM_REDUNDANCY=2 TANDEM_CHECKPOINT_PERIOD=$period || continue 2
    flips=$(($(flipped) - before))
    ((flips > 0)) && break
  done
  rollbacks=$(grep -o '[0-9]* rollbacks' "$OUT/T3-$period.err" | grep -o '^[0-9]*')
  T2=$(seconds "$OUT/T2-$period.out") T3=$(seconds "$OUT/T3-$period.out")
  printf "%-8s %10.2f %10.2f %10.2f %10.2f %10.3f %10.3f %6d %10s %12s\n" "${period}s" "$T0" "$T1" "$T2" "$T3" \
    "$(awk -v x="$T2" -v y="$T1" 'BEGIN{print x/y}')" "$(awk -v x="$T3" -v y="$T1" 'BEGIN{print x/y}')" "$flips" \
    "${rollbacks:-0}" "$(awk -v a="$T3" -v b="$T2" -v f="$flips" 'BEGIN{ if (f > 0) printf "%.2f", (a - b) / f; else print "-" }')" |
    tee -a "$OUT/ft_overhead.txt"
done
printf "T1/T0 = %.3f\n" "$(awk -v x="$T1" -v y="$T0" 'BEGIN{print x/y}')" | tee -a "$OUT/ft_overhead.txt"
echo "flips injected in all T3 runs (retries included): $(flipped)" | tee -a "$OUT/ft_overhead.txt"
