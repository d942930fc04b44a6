#!/usr/bin/env python3
"""Splits each small read back of `cuda_bench --idle[-busy]` into its legs, from the client's
and the server's traces (TANDEM_TRACE=1 TANDEM_LOG_TIME=1, both on one host): client post ->
server starts it -> server done -> client has the reply. Prints the median of each leg for
the warm reads and for the reads after each idle gap (the time since the previous reply).
  idle_trace.py CLIENT_LOG SERVER_LOG"""
import re
import statistics
import sys

stamp = r"^(\d+\.\d+) "
post = re.compile(stamp + r"\[tandem .*\] -> \S+ #(\d+) BufferRead")
recv = re.compile(stamp + r"\[tandem .*\] <- \S+ #(\d+) BufferRead")
run = re.compile(stamp + r"\[tandemd-worker .*\] run #(\d+) BufferRead")
ran = re.compile(stamp + r"\[tandemd-worker .*\] ran #(\d+) BufferRead")


def times(path, pattern):
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = pattern.match(line)
            if m:
                out[int(m.group(2))] = float(m.group(1)) * 1e6
    return out


client, server = sys.argv[1], sys.argv[2]
p, r = times(client, post), times(client, recv)
s0, s1 = times(server, run), times(server, ran)
seqs = sorted(k for k in p if k in r and k in s0 and k in s1)
classes = {}
prev_reply = None
for k in seqs:
    gap = (p[k] - prev_reply) / 1000 if prev_reply is not None else 0
    prev_reply = r[k]
    label = "warm" if gap < 0.05 else next(
        (name for limit, name in [(0.5, "0.1ms"), (3, "1ms"), (10, "5ms"), (50, "20ms")] if gap < limit), "100ms")
    legs = (s0[k] - p[k], s1[k] - s0[k], r[k] - s1[k], r[k] - p[k])
    classes.setdefault(label, []).append(legs)
print(f"{'reads':>6} {'gap':>6} | {'post->run':>10} {'run':>8} {'ran->reply':>11} {'total':>8}  (median us)")
for label in ["warm", "0.1ms", "1ms", "5ms", "20ms", "100ms"]:
    rows = classes.get(label)
    if not rows:
        continue
    med = [statistics.median(x[i] for x in rows) for i in range(4)]
    print(f"{len(rows):>6} {label:>6} | {med[0]:>10.1f} {med[1]:>8.1f} {med[2]:>11.1f} {med[3]:>8.1f}")
