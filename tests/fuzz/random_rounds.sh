#!/usr/bin/env bash
# Fuzzes a target without libFuzzer (the GPU machine has no clang): ROUNDS runs of its
# `--random SECONDS SEED` mode, seeds 1..ROUNDS, each crash's input kept as DIR/crash-SEED.bin
# with its output in DIR/run-SEED.log (replay one: TARGET DIR/crash-SEED.bin's directory).
#   bash tests/fuzz/random_rounds.sh BUILD/tests/fuzz/cuda_backend_fuzz_replay 45 6 DIR
set -u
bin=${1:?usage: random_rounds.sh TARGET SECONDS ROUNDS DIR} each=${2:-45} rounds=${3:-6} dir=${4:-.}
mkdir -p "$dir"
for seed in $(seq "$rounds"); do
  FUZZ_LAST=$dir/last.bin timeout $((each + 60)) "$bin" --random "$each" "$seed" >"$dir/run-$seed.log" 2>&1
  rc=$?
  echo "seed $seed: exit $rc: $(grep -E "^ran |hang" "$dir/run-$seed.log" | tail -1)"
  if [[ $rc != 0 ]]; then cp "$dir/last.bin" "$dir/crash-$seed.bin"; else rm -f "$dir/run-$seed.log"; fi
done
rm -f "$dir/last.bin"
