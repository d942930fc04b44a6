#!/usr/bin/env python3
"""The cross-server event legs of the 4-server advection, from tandemd logs written with
TANDEM_LOG=info TANDEM_TRACE=1 TANDEM_LOG_TIME=1 TANDEM_TRACE_CL_TIMES=1 (one host, so the
logs' CLOCK_MONOTONIC times compare across servers). Medians, us:
  export->answered  an event's EventExport done on its server -> the EventImport of it
                    answered on the importing one (PeerSignal's way)
  import late       imports the importing executor ran (PeerWatch sent) after the export
                    was done already, of all
  answered->submit  an s2s read's submit (device clock, put on the host clock by the
                    smallest log-time-minus-end of the server's reads) after the last
                    import answered before it on that server
  end->logged       a kernel's end -> its cl times line (the event watcher's delay)
  python3 cl_align.py LOG..."""
import re
import statistics
import sys

from cl_times import LINE as CL  # the "cl times" line (this folder is on the script's path)

T = re.compile(r"^\s*(\d+\.\d+)\s")
RUN_IMPORT = re.compile(r"run #\d+ EventImport\(.*token=(\d+)\)")
ANSWERED = re.compile(r"event import (0x[0-9a-f]+): answered")
EXPORTED = re.compile(r"event export (0x[0-9a-f]+): done")


def med(xs):
    return f"{statistics.median(xs):8.1f} (n={len(xs)})" if xs else "       - (n=0)"


def parse(path):
    out = {"cl": [], "run_import": {}, "answered": {}, "exported": {}}
    with open(path, errors="replace") as f:
        for line in f:
            m = T.match(line)
            if not m:
                continue
            t = float(m.group(1)) * 1e6
            if c := CL.search(line):
                out["cl"].append((t, c.group(1), *(float(c.group(i)) for i in range(2, 6))))
            elif c := RUN_IMPORT.search(line):
                out["run_import"][int(c.group(1))] = t
            elif c := ANSWERED.search(line):
                out["answered"][int(c.group(1), 16)] = t
            elif c := EXPORTED.search(line):
                out["exported"][int(c.group(1), 16)] = t
    return out


logs = [parse(p) for p in sys.argv[1:]]
if not logs:
    sys.exit(__doc__)
exported = {}
for lg in logs:
    exported.update(lg["exported"])
for path, lg in zip(sys.argv[1:], logs):
    legs = [t - exported[k] for k, t in lg["answered"].items() if k in exported]
    late = sum(1 for k, t in lg["run_import"].items() if k in exported and t > exported[k])
    reads = [c for c in lg["cl"] if c[1].startswith("s2s read")]
    print(f"{path}:")
    print(f"  export->answered {med(legs)}   import late {late} of {len(lg['run_import'])}")
    if reads:
        offset = min(c[0] - c[5] / 1.0 for c in reads)  # host us - device us
        answers = sorted(lg["answered"].values())
        gaps = []
        for c in reads:
            submit = c[3] + offset
            before = [a for a in answers if a <= submit + 5]
            if before:
                gaps.append(submit - before[-1])
        print(f"  answered->submit {med(gaps)}")
        kernels = [c for c in lg["cl"] if c[1].startswith("kernel")]
        print(f"  end->logged      {med([c[0] - (c[5] + offset) for c in kernels])} (kernels, against the reads' best)")
