#!/usr/bin/env python3
"""Reads the "cl times" lines of OpenCL tandemd logs (TANDEM_TRACE_CL_TIMES=1) and prints,
per log, medians (us, the device's profiling clock) of where a step's kernel and the
server-to-server reads and gated copies around it spend their time:
  kernel: queued->submit (held on the host), submit->start, start->end;
  s2s read (its source half): submit and start after the end of the last kernel queued
    before it, and its own start->end;
  s2s gated copy (the destination half): queued->submit (held behind its gate), submit->start.
Usage: cl_times.py LOG..."""
import re
import statistics
import sys

LINE = re.compile(r"cl times (.+?): queued ([\d.]+) submit ([\d.]+) start ([\d.]+) end ([\d.]+)")


def med(xs):
    return f"{statistics.median(xs):9.1f}" if xs else "        -"


def report(path):
    kernels, reads, copies = [], [], []
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if not m:
                continue
            what = m.group(1)
            t = tuple(float(m.group(i)) for i in range(2, 6))
            (kernels if what.startswith("kernel") else reads if what.startswith("s2s read") else
             copies if what.startswith("s2s gated copy") else []).append(t)
    kernels.sort()
    rows = []
    for r in reads:
        before = [k for k in kernels if k[0] <= r[0]]
        if before:
            k = before[-1]
            rows.append((r[1] - k[3], r[2] - k[3], r[3] - r[2], r[1] - r[0]))
    print(f"{path}: {len(kernels)} kernels, {len(reads)} s2s reads, {len(copies)} gated copies")
    print(f"  kernel     queued->submit {med([k[1] - k[0] for k in kernels])}  submit->start "
          f"{med([k[2] - k[1] for k in kernels])}  start->end {med([k[3] - k[2] for k in kernels])}")
    print(f"  s2s read   submit-kernel end {med([x[0] for x in rows])}  start-kernel end "
          f"{med([x[1] for x in rows])}  start->end {med([x[2] for x in rows])}  queued->submit {med([x[3] for x in rows])}")
    print(f"  gated copy queued->submit {med([c[1] - c[0] for c in copies])}  submit->start "
          f"{med([c[2] - c[1] for c in copies])}  start->end {med([c[3] - c[2] for c in copies])}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        report(p)
