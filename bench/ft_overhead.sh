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
# flip landed measures nothing and is run again. T3 is the mean of T3_REPS (default 1) runs
# with flips; the table gives their flips/runs and the cost of one flip, (T3 - T2) / (flips/run).
# On a machine with one GPU both replicas' tandemd share it; there every run (T0 included)
# goes through NVIDIA's MPS (scripts/lib/mps.sh), without which the driver time-slices the two
# servers and T2 would measure two copies of the work instead of fault tolerance. FT_MPS=0
# leaves MPS off.
#   bash bench/ft_overhead.sh BUILD_DIR OUT_DIR [STEPS]
set -uo pipefail
BUILD=$1 OUT=$2 STEPS=${3:-200000}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../scripts/lib/tandemd.sh"
source "$HERE/../scripts/lib/mps.sh"
TANDEMD=$BUILD/server/tandemd TANDEM=$BUILD/tools/tandem REMD=$BUILD/examples/cuda/remd
FLIPS=${FLIPS:-1}
mkdir -p "$OUT"
log() { echo "ft_overhead: $*" >&2; }
for f in "$TANDEMD" "$TANDEM" "$REMD"; do [[ -x $f ]] || { log "not built: $f"; exit 1; }; done
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { log "no GPU"; exit 77; }
gpus=$(nvidia-smi -L | grep -c '^GPU')
# server() runs in $(...): it records its tandemd's pid in a file the exit trap reads.
: >"$OUT/pids"
cleanup() { local p; while read -r p; do stop_tandemd "$p"; done <"$OUT/pids"; rm -f "$OUT/pids"; mps_stop; }
trap cleanup EXIT
unset TANDEM_SERVERS TANDEM_REDUNDANCY TANDEM_SPARE_SERVERS TANDEM_CHECKPOINT_PERIOD LD_PRELOAD
mps=off
if ((gpus < 2)) && [[ ${FT_MPS:-1} != 0 ]]; then
  if mps_start; then mps=on; else log "MPS did not start: the two replicas time-slice the GPU"; fi
fi

# server NAME GPU [options]: echoes host:port
server() {
  local name=$1 gpu=$2 port; shift 2
  port=$(free_port)
  # shellcheck disable=SC2086
  env $MPS_ENV setsid "$TANDEMD" --listen 127.0.0.1:$port --backend cuda --devices "$gpu" "$@" >"$OUT/tandemd-$name.log" 2>&1 &
  echo $! >>"$OUT/pids"
  tandemd_listens "$!" "$OUT/tandemd-$name.log" || { log "tandemd $name did not start"; exit 1; }
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
    # shellcheck disable=SC2086
    env $MPS_ENV timeout 1200 "$REMD" --steps "$STEPS" >"$OUT/$name.out" 2>"$OUT/$name.err"
  else
    env TANDEM_STATS=1 TANDEM_FAILOVER_TIMEOUT_MS=60000 "$@" timeout 1200 "$TANDEM" run -- "$REMD" --steps "$STEPS" \
      >"$OUT/$name.out" 2>"$OUT/$name.err"
  fi || { log "$name failed:"; tail -5 "$OUT/$name.err" >&2; return 1; }
  grep -v '^time:' "$OUT/$name.out" >"$OUT/$name.result"
  if [[ $name != T0 ]] && ! cmp -s "$OUT/T0.result" "$OUT/$name.result"; then log "$name: output differs from native"; return 1; fi
  log "$name: $(seconds "$OUT/$name.out") s $(grep -o 'fault tolerance: .*' "$OUT/$name.err" | head -1)"
}

g1=0; ((gpus >= 2)) && g1=1
a=$(server a 0) && b=$(server b "$g1") || exit 1
run T0 || exit 1
run T1 TANDEM_SERVERS="$a" || exit 1
T0=$(seconds "$OUT/T0.out") T1=$(seconds "$OUT/T1.out")
[[ -n $T0 && -n $T1 ]] || { log "no time in T0 or T1's output"; exit 1; }
lambda=$(awk -v f="$FLIPS" -v t="$T1" 'BEGIN { printf "%.6f", f / t }')
fa=$(server flip-a 0 --inject-bitflip-per-s "$lambda") && fb=$(server flip-b "$g1") || exit 1
{
  echo "REMD ${STEPS} steps; GPUs on this machine: $gpus; replicas on GPU 0 and GPU $g1 (MPS $mps); flips: lambda=$lambda/s (~$FLIPS per run)"
  printf "%-8s %10s %10s %10s %10s %10s %10s %6s %10s %12s\n" period T0_s T1_s T2_s T3_s T2/T1 T3/T1 flips rollbacks s_per_flip
} | tee "$OUT/ft_overhead.txt"
flipped() { grep -c 'fault injection: flipped' "$OUT/tandemd-flip-a.log"; }
T3_REPS=${T3_REPS:-1}
for period in ${PERIODS:-2 10 50}; do
  run T2-$period TANDEM_SERVERS="$a,$b" TANDEM_REDUNDANCY=2 TANDEM_CHECKPOINT_PERIOD=$period || continue
  # T3_REPS runs with a flip each, averaged; a run in which no flip happened to land
  # measures nothing (up to 5 tries per rep).
  sum=0 flips=0 rollbacks=0 got=0
  for ((try = 1; try <= 5 * T3_REPS && got < T3_REPS; ++try)); do
    before=$(flipped)
    run T3-$period TANDEM_SERVERS="$fa,$fb" TANDEM_REDUNDANCY=2 TANDEM_CHECKPOINT_PERIOD=$period || continue 2
    f=$(($(flipped) - before))
    ((f > 0)) || continue
    got=$((got + 1)) flips=$((flips + f))
    rollbacks=$((rollbacks + $(grep -o '[0-9]* rollbacks' "$OUT/T3-$period.err" | grep -o '^[0-9]*' || echo 0)))
    sum=$(awk -v a="$sum" -v b="$(seconds "$OUT/T3-$period.out")" 'BEGIN { print a + b }')
    cp "$OUT/T3-$period.err" "$OUT/T3-$period-rep$got.err"
  done
  ((got > 0)) || { log "period $period: no T3 run got a flip"; continue; }
  T2=$(seconds "$OUT/T2-$period.out") T3=$(awk -v s="$sum" -v n="$got" 'BEGIN { print s / n }')
  printf "%-8s %10.2f %10.2f %10.2f %10.2f %10.3f %10.3f %6s %10s %12s\n" "${period}s" "$T0" "$T1" "$T2" "$T3" \
    "$(awk -v x="$T2" -v y="$T1" 'BEGIN{print x/y}')" "$(awk -v x="$T3" -v y="$T1" 'BEGIN{print x/y}')" \
    "$flips/$got" "$rollbacks" "$(awk -v t="$T3" -v b="$T2" -v f="$flips" -v n="$got" 'BEGIN{ printf "%.2f", (t - b) * n / f }')" |
    tee -a "$OUT/ft_overhead.txt"
done
printf "T1/T0 = %.3f\n" "$(awk -v x="$T1" -v y="$T0" 'BEGIN{print x/y}')" | tee -a "$OUT/ft_overhead.txt"
echo "flips injected in all T3 runs (retries included): $(flipped)" | tee -a "$OUT/ft_overhead.txt"
