#!/usr/bin/env bash
# Fuzzes a target without libFuzzer (the GPU machine has no clang): ROUNDS runs of its
# `--random SECONDS SEED` mode, seeds 1..ROUNDS. Each failing input (a crash, an abort, or a
# hang past FUZZ_TIMEOUT_S) is kept as DIR/crashes/SEED.bin with its output as DIR/SEED.log;
# replay them all with `TARGET DIR/crashes`. A target that skips (77: e.g. no GPU) ends the
# rounds.
#   bash tests/fuzz/random_rounds.sh BUILD/tests/fuzz/cuda_backend_fuzz_replay 45 6 DIR
set -u
bin=${1:?usage: random_rounds.sh TARGET SECONDS ROUNDS DIR} each=${2:-45} rounds=${3:-6} dir=${4:-.}
mkdir -p "$dir/crashes"
for seed in $(seq "$rounds"); do
  FUZZ_LAST=$dir/last.bin timeout $((each + 60)) "$bin" --random "$each" "$seed" >"$dir/$seed.log" 2>&1
  rc=$?
  echo "seed $seed: exit $rc: $(grep -E "^ran |succeeded|hang|skipped|no CUDA" "$dir/$seed.log" | tail -2 | tr '\n' ' ')"
  if [[ $rc == 77 ]]; then
    rm -f "$dir/$seed.log"
    break
  elif [[ $rc != 0 ]]; then
    cp "$dir/last.bin" "$dir/crashes/$seed.bin"
  else
    rm -f "$dir/$seed.log"
  fi
done
rm -f "$dir/last.bin"
