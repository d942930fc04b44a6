#!/usr/bin/env python3
"""thread_sampler.py: samples the threads of running processes from /proc (Linux) to find out why
the same round-trip loop is fast in one process and ~30% slower in the next: which CPU each thread
sits on, whether it sleeps (voluntary context switches, state S) or spins (state R, cpu_ms close to
wall time), and whether the busiest threads of client and server share a CPU.

Usage: thread_sampler.py [--interval-ms 5] [--out FILE] [--children-of LABEL=PID ...] [LABEL=PID ...]
  LABEL=PID                sample PID's threads; the sampler runs until every such process exits
  --children-of LABEL=PID  sample every child process of PID that exists at each sample (e.g. a
                           server forking one worker per client session), labelled LABEL/childpid;
                           these do not keep the sampler alive (unless there are no plain entries)
SIGTERM/SIGINT also stop it; the summary goes to stdout and to --out. Each sample costs the
sampler roughly 50 us of CPU per task (reported as sampler_cpu_ms): raise --interval-ms if the
machine has few free cores.
Example:
  python3 thread_sampler.py --children-of server=$(pgrep -f tandemd) client=$CLIENT_PID
"""
import argparse, collections, os, signal, sys, time

TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def read(path):
    # os.open/os.read: a third of the cost of open().read(), which matters every few ms.
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode(errors="replace")  # /proc files here are far smaller
    finally:
        os.close(fd)


def read_task(pid, tid):
    """(state, ticks, cpu, vcs, ivcs, comm) of one task; raises OSError/ValueError if it is gone."""
    base = f"/proc/{pid}/task/{tid}/"
    stat = read(base + "stat")
    # comm is in parentheses and may itself hold spaces or ')': split after the LAST ')'.
    # man 5 proc numbers fields from 1: (3) state, (14) utime, (15) stime, (39) processor,
    # so field N is at index N-3 here.
    f = stat[stat.rindex(")") + 1:].split()
    state, ticks, cpu = f[0], int(f[11]) + int(f[12]), int(f[36])
    vcs = ivcs = 0
    status = read(base + "status")  # holds "voluntary_ctxt_switches:\tN" and "nonvoluntary..."
    i, j = status.find("\nvoluntary_ctxt_switches:"), status.find("nonvoluntary_ctxt_switches:")
    if i >= 0:
        vcs = int(status[i + 25:].split(None, 1)[0])
    if j >= 0:
        ivcs = int(status[j + 27:].split(None, 1)[0])
    return state, ticks, cpu, vcs, ivcs, read(base + "comm").strip()


def alive(pid):
    try:
        stat = read(f"/proc/{pid}/stat")
        return stat[stat.rindex(")") + 1:].split()[0] not in ("Z", "X")  # a zombie has exited
    except (OSError, ValueError):
        return False


HAVE_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")  # CONFIG_PROC_CHILDREN


def children(pid):
    kids = set()
    if HAVE_CHILDREN:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    kids.update(int(c) for c in read(f"/proc/{pid}/task/{tid}/children").split())
                except OSError:
                    pass
        except OSError:
            pass
        return kids
    for d in os.listdir("/proc"):  # otherwise scan every process's ppid (field 4)
        try:
            stat = read(f"/proc/{d}/stat") if d.isdigit() else ""
            if stat and int(stat[stat.rindex(")") + 1:].split()[1]) == pid:
                kids.add(int(d))
        except (OSError, ValueError):
            pass
    return kids


class Thread:
    def __init__(self, comm, first):
        self.comm, self.first, self.last = comm, first, first
        self.seen = []  # (sample index, state, cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--out")
    ap.add_argument("--children-of", action="append", default=[], metavar="LABEL=PID")
    ap.add_argument("procs", nargs="*", metavar="LABEL=PID")
    a = ap.parse_args()
    split = lambda s: (s.rsplit("=", 1)[0], int(s.rsplit("=", 1)[1]))
    try:
        plain, parents = [split(s) for s in a.procs], [split(s) for s in a.children_of]
    except (IndexError, ValueError):
        ap.error("entries must be LABEL=PID")
    if not plain and not parents:
        ap.error("nothing to sample")
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    for label, pid in plain + parents:
        if not alive(pid):
            print(f"thread_sampler: {label}={pid} is not running", file=sys.stderr)

    threads = {}  # (label, tid) -> Thread
    labels = []   # in order first seen
    n, t0, cpu0 = 0, time.monotonic(), sum(os.times()[:2])
    deadline = t0
    while not stop:
        targets = [(l, p) for l, p in plain if alive(p)]
        live_parents = [(l, p) for l, p in parents if alive(p)]
        if not targets and (plain or not live_parents):
            break
        targets += [(f"{l}/{c}", c) for l, p in live_parents for c in sorted(children(p))]
        for label, pid in targets:
            try:
                tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
            for tid in tids:
                try:
                    state, ticks, cpu, vcs, ivcs, comm = read_task(pid, tid)
                except (OSError, ValueError, IndexError):
                    continue  # the task vanished mid-read: keep its last sample
                th = threads.get((label, tid))
                if th is None:
                    th = threads[(label, tid)] = Thread(comm, (ticks, vcs, ivcs))
                    if label not in labels:
                        labels.append(label)
                th.comm, th.last = comm, (ticks, vcs, ivcs)
                th.seen.append((n, state, cpu))
        n += 1
        deadline += a.interval_ms / 1000.0
        time.sleep(max(0.0, deadline - time.monotonic()))
    span, loop_cpu = time.monotonic() - t0, sum(os.times()[:2])

    out = []
    cpu_ms = {k: (th.last[0] - th.first[0]) * TICK_MS for k, th in threads.items()}
    busiest = {}  # label -> (label, tid) of its thread with the most cpu_ms
    for label in labels:
        keys = sorted((k for k in threads if k[0] == label), key=lambda k: k[1])
        for k in keys:
            th = threads[k]
            cpus = collections.Counter(c for _, _, c in th.seen)
            runs = sum(1 for _, s, _ in th.seen if s == "R")
            out.append(f"{label} {k[1]} {th.comm}  cpu_ms={cpu_ms[k]:.0f}"
                       f"  vcs={th.last[1] - th.first[1]}  ivcs={th.last[2] - th.first[2]}"
                       f"  cpus={','.join(f'{c}:{m}' for c, m in cpus.most_common())}"
                       f"  R={runs / len(th.seen):.2f}")
        busiest[label] = max(keys, key=lambda k: (cpu_ms[k], -k[1]))
    for label in labels:
        total = sum(v for k, v in cpu_ms.items() if k[0] == label)
        b = busiest[label]
        out.append(f"{label} total cpu_ms={total:.0f}  busiest={b[1]} {threads[b].comm}"
                   f" cpu_ms={cpu_ms[b]:.0f}")
    # For each sample: were the busiest threads of two different labels on the same CPU?
    # (processor is the CPU a task last ran on, so also count samples where both were in R.)
    # Labels whose busiest thread used no CPU at all (an idle child) are left out.
    busiest = {l: k for l, k in busiest.items() if cpu_ms[k] > 0}
    at = collections.defaultdict(list)  # sample -> [(label, state, cpu)]
    for label, k in busiest.items():
        for i, s, c in threads[k].seen:
            at[i].append((label, s, c))
    both = same = same_r = 0
    for row in at.values():
        if len(row) < 2:
            continue
        both += 1
        pairs = [(x, y) for j, x in enumerate(row) for y in row[j + 1:] if x[2] == y[2]]
        same += bool(pairs)
        same_r += any(x[1] == "R" and y[1] == "R" for x, y in pairs)
    out.append(f"overlap busiest threads {' '.join(f'{l}:{k[1]}' for l, k in busiest.items())}:"
               f" same_cpu={same} (both R: {same_r}) of {both} samples with two or more present")
    out.append(f"span={span:.2f}s samples={n} interval_ms={a.interval_ms:g}"
               f" sampler_cpu_ms={(loop_cpu - cpu0) * 1000:.0f}")
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
