#!/usr/bin/env python3
"""Where a step of the 4-server advection goes, from the tandemd logs of
bench/experiments/opencl_4srv_trace.sh (TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1: each
line starts with CLOCK_MONOTONIC in us, one clock for every process on the host).

For server S (default 1), step by step, times in us after its kernel of that step finished
(its EventExport done, the earlier of its two), each the later of its two neighbours' or
transfers':
  src kernel  the neighbours' kernels of the step finished
  src enq     their source halves' reads enqueued (a held read: when the executor replayed it)
  src read    their source halves' reads done
  came        the transfers' bytes arriving here
  gate        the destination writes done (gate set) here; held transfers: their writes
              enqueued by the executor's replay
  next        this server's kernel of the next step finished
and the median of each column.
  python3 trace_4srv.py LOG0 LOG1 LOG2 LOG3 [--server S]"""
import re
import statistics
import sys

argv = sys.argv[1:]
server = 1
if "--server" in argv:
    i = argv.index("--server")
    server = int(argv[i + 1])
    del argv[i:i + 2]
args = argv
logs = []
line_re = re.compile(r"^\s*(\d+(?:\.\d+)?)\s")
for path in args:
    ev = []
    with open(path, errors="replace") as f:
        for line in f:
            m = line_re.match(line)
            if m:
                ev.append((float(m.group(1)) * 1e6, line))  # seconds.micros
    logs.append(ev)

def times(ev, pattern):
    rx = re.compile(pattern)
    return [(t, rx.search(l)) for t, l in ev if rx.search(l)]

def halo_recvs(ev):
    """The halo transfers into a server (the most common size: a buffer's first use moves it
    whole), as (transfer id, size) in order; two a step."""
    recvs = [(m.group(1), int(m.group(2))) for _, m in times(ev, r"s2s recv (0x[0-9a-f]+): (\d+) bytes into")]
    halo = statistics.mode([n for _, n in recvs]) if recvs else 0
    return [i for i, n in recvs if n == halo], halo


def kernels_done(ev):
    """Per step, the earlier of a server's two EventExport dones (its kernel finished: each
    neighbour's two halo copies import it, with two servers too)."""
    t = [x for x, _ in times(ev, r"event export 0x[0-9a-f]+: done")]
    return [min(t[2 * s:2 * s + 2]) for s in range(len(t) // 2)]

done = [kernels_done(ev) for ev in logs]
me = logs[server]
recv_posted, halo = halo_recvs(me)
gates = [t for t, m in times(me, r"s2s write of (\d+) bytes .*gate set") if int(m.group(1)) == halo]
came = {m.group(1): t for t, m in times(me, r"s2s recv (0x[0-9a-f]+): bytes came")}
# A held transfer (TANDEM_SERVER_HOLD, on for OpenCL) has no gate: its write is enqueued when
# the executor replays it ("written"), and that is the column's time instead.
written = {m.group(1): t for t, m in times(me, r"s2s recv (0x[0-9a-f]+): written")}
if not gates and written:
    gates = [written.get(i, float("nan")) for i in recv_posted]
read_done = {}  # transfer -> (time, source server)
read_enq = {}  # transfer -> time
for k, ev in enumerate(logs):
    for t, m in times(ev, r"s2s send (0x[0-9a-f]+): read done"):
        read_done[m.group(1)] = (t, k)
    for t, m in times(ev, r"s2s send (0x[0-9a-f]+): \d+ bytes from buffer"):
        read_enq[m.group(1)] = t

nan = float("nan")
steps = min(len(done[server]) - 1, len(gates) // 2, len(recv_posted) // 2)
hdr = ["src kernel", "src enq", "src read", "came", "gate", "next"]
rows = []
for s in range(steps):
    k = done[server][s]
    src_k, src_e, src_r, cm = [], [], [], []
    for i in recv_posted[2 * s:2 * s + 2]:
        t, src = read_done.get(i, (nan, None))
        src_r.append(t)
        src_e.append(read_enq.get(i, nan))
        cm.append(came.get(i, nan))
        src_k.append(done[src][s] if src is not None and s < len(done[src]) else nan)
    rows.append([max(src_k) - k, max(src_e) - k, max(src_r) - k, max(cm) - k, max(gates[2 * s:2 * s + 2]) - k,
                 done[server][s + 1] - k])
print("server %d, %d steps; us after its own kernel of the step finished (the later of the two"
      " neighbours / transfers)" % (server, len(rows)))
print("step " + " ".join("%10s" % h for h in hdr))
for s, r in enumerate(rows[:10]):
    print("%4d " % s + " ".join("%10.1f" % v for v in r))
if rows:
    print("med  " + " ".join("%10.1f" % statistics.median([r[i] for r in rows]) for i in range(len(hdr))))
