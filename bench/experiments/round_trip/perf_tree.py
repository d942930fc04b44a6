#!/usr/bin/env python3
"""Where the samples under one function go (perf_profile.sh): reads `perf script` output
(frame-pointer stacks) on stdin and, for each ANCHOR (a substring of a
demangled symbol), prints how many of COMM's samples have it on their stack, and how those
split by the function it called (the frame right below it) and by the sampled function.
Frames perf leaves unnamed in a binary whose path contains "tandem" are named with addr2line
(the perf copied to the GPU machine reads no symbols from binaries built there).

  perf script -i DATA --comm COMM -F comm,tid,ip,sym,dso | perf_tree.py COMM ANCHOR...
  perf report ... --sort dso,sym | perf_tree.py --flat DSO=PATH...   (names a flat profile's addresses)
"""
import collections
import re
import subprocess
import sys



def addr2line(path, offsets):
    """{offset: function name} for offsets (ints) in the ELF file at path."""
    names = {}
    offsets = sorted(set(offsets))
    for i in range(0, len(offsets), 2000):
        chunk = offsets[i:i + 2000]
        try:
            out = subprocess.run(["addr2line", "-f", "-C", "-e", path] + [hex(o) for o in chunk],
                                 capture_output=True, text=True, check=False).stdout.split("\n")
        except OSError:
            return names
        for j, off in enumerate(chunk):
            if 2 * j < len(out) and out[2 * j] not in ("", "??"):
                names[off] = out[2 * j]
    return names


def short(sym):
    # Drop the argument list and template arguments: the function's qualified name is enough.
    sym = re.sub(r" const$", "", sym)
    if sym.endswith(")"):
        depth = 0
        for i in range(len(sym) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(sym[i], 0)
            if depth == 0:
                sym = sym[:i]
                break
    while "<" in sym:
        new = re.sub(r"<[^<>]*>", "", sym)
        if new == sym:
            break
        sym = new
    return sym[:90]


def samples(lines):
    """Each sample's stack, innermost first, as function names."""
    out, stack = [], []
    for line in lines:
        if not line.strip():
            if stack:
                out.append(stack)
            stack = []
            continue
        if line[0] not in " \t":
            stack = []
            continue
        parts = line.strip().split(" ", 1)
        rest = parts[1] if len(parts) > 1 else "?"
        dso = re.search(r"\(([^()]*)\)$", rest)
        sym = re.sub(r"\s+\([^()]*\)$", "", rest)
        sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        # perf prints a frame in a binary at its address in that file.
        stack.append([int(parts[0], 16) if re.fullmatch(r"[0-9a-f]+", parts[0]) else 0, sym, dso.group(1) if dso else ""])
    if stack:
        out.append(stack)
    wanted = collections.defaultdict(set)
    for st in out:
        for ip, sym, dso in st:
            if sym == "[unknown]" and "tandem" in dso:
                wanted[dso].add(ip)
    names = {dso: addr2line(dso, offs) for dso, offs in wanted.items()}
    for st in out:
        yield [short(names.get(dso, {}).get(ip, sym) if sym == "[unknown]" else sym) for ip, sym, dso in st]


def flat(paths):
    """Names the dso-relative addresses of a flat perf report on stdin."""
    lines = sys.stdin.read().split("\n")
    wanted = collections.defaultdict(set)
    pat = re.compile(r"^(\s*[0-9.]+%\s+)(\S+)(\s+\[\.\]\s+)0x([0-9a-f]+)\s*$")
    for line in lines:
        m = pat.match(line)
        if m and m.group(2) in paths:
            wanted[m.group(2)].add(int(m.group(4), 16))
    names = {d: addr2line(paths[d], offs) for d, offs in wanted.items()}
    for line in lines:
        m = pat.match(line)
        if m and m.group(2) in paths:
            name = names[m.group(2)].get(int(m.group(4), 16))
            if name:
                line = f"{m.group(1)}{m.group(2)}{m.group(3)}{short(name)} (+0x{m.group(4)})"
        print(line)


def main():
    if sys.argv[1] == "--flat":
        return flat(dict(a.split("=", 1) for a in sys.argv[2:]))
    comm, anchors = sys.argv[1], sys.argv[2:]
    total = 0
    under = {a: collections.Counter() for a in anchors}
    leaf = {a: collections.Counter() for a in anchors}
    hits = collections.Counter()
    for stack in samples(sys.stdin):  # stack[0] is the sampled function, then its callers
        total += 1
        for a in anchors:
            idx = next((i for i, f in enumerate(stack) if a in f), None)
            if idx is None:
                continue
            hits[a] += 1
            under[a][stack[idx - 1] if idx > 0 else "(itself)"] += 1
            leaf[a][stack[0]] += 1
    print(f"{comm}: {total} samples")
    for a in anchors:
        n = hits[a]
        print(f"  {a}: {n} samples ({100.0 * n / max(total, 1):.1f}% of {comm}'s)")
        if not n:
            continue
        print("    by the function it called:")
        for f, c in under[a].most_common(14):
            print(f"      {100.0 * c / n:5.1f}%  {f}")
        print("    by the sampled function:")
        for f, c in leaf[a].most_common(14):
            print(f"      {100.0 * c / n:5.1f}%  {f}")


if __name__ == "__main__":
    main()
