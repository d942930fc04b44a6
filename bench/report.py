#!/usr/bin/env python3
"""Builds the table (stdout) and bench.json from the files run_bench.sh leaves in OUT.

   python3 bench/report.py --out OUT --quick 0|1 --gpu 0|1 --provider P --shm 0|1
                           --host NAME --apis "cuda opencl"

Files read (API is cuda or opencl; each holds `name value unit` or `name n/a reason`
lines, or one `# n/a (reason)` line when the whole run could not be made):
  API-native.txt  API-tandem.txt  API-shm.txt       main runs (native, Tandem, Tandem on shm)
  API-tandem-ka0.txt                                idle read-back with TANDEM_KEEPALIVE_MS=0
  API-native-ka.txt                                 idle read-back natively, keepalive in the program
  API-s2s-native.txt  API-s2s-tandem.txt  API-s2s-shm.txt   device 0 -> 1 copies
  fabric-tandem.txt  fabric-shm.txt                 tandem_fabric_pingpong's output
  fabric-raw-tandem.txt  fabric-raw-shm.txt         libfabric's fi_pingpong (round trips), if installed
  workloads.txt (name, servers, native n/a reason, tandem n/a reason; tab-separated) and
  work-NAME-native.txt / work-NAME-tandem.txt       the examples' stdout (`time: X s`)
Ratios are Tandem's cost over native (time: tandem/native, GB/s: native/tandem; >1 slower),
"x wire" is Tandem's cost over the fabric of the same provider (time: over the 8 B round trip
of tandem_fabric_pingpong; GB/s: the RMA bandwidth of that direction over Tandem's), and keepalive rows divide
each idle read-back by the warm one (target <= 1.3 with keepalive on). Nothing is asserted.
"""
import argparse
import functools
import glob
import json
import os
import re
import statistics
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--quick", type=int, default=0)
ap.add_argument("--gpu", type=int, default=0)
ap.add_argument("--provider", default="tcp")
ap.add_argument("--shm", type=int, default=0)
ap.add_argument("--host", default="")
ap.add_argument("--apis", default="")
args = ap.parse_args()
OUT = args.out
apis = args.apis.split()


def unparen(s):
    s = s.strip()
    return s[1:-1] if s.startswith("(") and s.endswith(")") else s


class Col:
    """One run's measurements: name -> (value or None, unit, note)."""

    def __init__(self, path):
        self.rows, self.order, self.note = {}, [], None
        if not os.path.exists(path):
            self.note = "not run"
            return
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                if line.startswith("#"):
                    self.note = unparen(line.lstrip("# ").removeprefix("n/a ")) or "failed"
                    continue
                parts = line.split(None, 2)
                if len(parts) < 3:
                    continue
                name, val, rest = parts
                if val == "n/a":
                    self.rows[name] = (None, "", unparen(rest))
                else:
                    try:
                        self.rows[name] = (float(val), rest.strip(), None)
                    except ValueError:
                        continue
                self.order.append(name)
        if not self.rows and self.note is None:
            self.note = "no output"

    def get(self, name):
        """(value or None, unit, note)"""
        if name in self.rows:
            return self.rows[name]
        return (None, "", self.note or "missing")


@functools.lru_cache(maxsize=None)
def col(name):
    """One run's file, read once: the tables and the target lines share it (Col is read-only)."""
    return Col(os.path.join(OUT, name + ".txt"))


notes = []  # footnotes: reasons for n/a cells


def na(reason):
    reason = reason or "n/a"
    if reason not in notes:
        notes.append(reason)
    return "n/a [%d]" % (notes.index(reason) + 1)


def fmt(v):
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return "%.0f" % v
    if a >= 10:
        return "%.1f" % v
    if a >= 0.1 or a == 0:
        return "%.2f" % v
    return "%.3g" % v


def cell(entry, unit=None):
    v, u, note = entry
    if v is None:
        return na(note)
    return "%s %s" % (fmt(v), unit if unit is not None else u)


def cost(unit, native, tandem):
    """Tandem's cost over native: time tandem/native, GB/s native/tandem."""
    if native is None or tandem is None or native <= 0 or tandem <= 0:
        return None
    return native / tandem if unit == "GB/s" else tandem / native


def rnd(v, digits=3):
    return None if v is None else round(v, digits)


# ---- the raw fabric, per provider ----
# The quiet gaps of `tandem_fabric_pingpong --idle 1`, in ms, as it prints them.
FABRIC_GAPS = ("0.1", "1", "2", "5", "20", "100")
# The message sizes of libfabric's fi_pingpong runs (run_bench.sh's raw_pingpong).
RAW_SIZES = ("8", "256")


def fabric(path):
    """The pingpong's figures: each the median over its rounds (path, then path's .rN files)."""
    res = {"provider": None, "note": None, "raw": [], "values": {}}
    if not os.path.exists(path):
        res["note"] = "not run"
        return res
    rounds = [path] + sorted(glob.glob(path[:-len(".txt")] + ".r[0-9]*.txt"))
    samples = {}
    for p in rounds:
        with open(p) as f:
            raw = [l.rstrip("\n") for l in f if l.strip()]
        res["raw"] += raw if p == path else ["round %s: %s" % (p.rsplit(".", 2)[-2], l) for l in raw]
        one = fabric_values(raw, res)
        for name, v in one.items():
            samples.setdefault(name, ([], v[1]))[0].append(v[0])
    res["values"] = {name: (statistics.median(vals), unit) for name, (vals, unit) in samples.items()}
    if not res["values"] and not res["note"]:
        res["note"] = "no output"
    return res


def fabric_values(raw, res):
    """One pingpong run's figures; its provider and any n/a note go into res."""
    values = {}
    pats = [
        (r"^provider (\S+)", None, None),
        (r"^8 B round trip: p50 ([0-9.]+) us, p90 ([0-9.]+) us", ("rtt_8B_p50", "rtt_8B_p90"), "us"),
        (r"^messages 1 MiB streamed.*?([0-9.]+) GB/s", ("stream_msg_1MiB",), "GB/s"),
        (r"^RMA read 64 MiB:.*?([0-9.]+) GB/s", ("rma_read_64MiB",), "GB/s"),
        (r"^RMA write 64 MiB:.*?([0-9.]+) GB/s", ("rma_write_64MiB",), "GB/s"),
    ] + [(r"^8 B round trip after %s ms idle: p50 ([0-9.]+) us" % re.escape(g), ("rtt_idle_%sms" % g,), "us")
         for g in FABRIC_GAPS] + [
        (r"^fi_pingpong %s B round trip: mean ([0-9.]+) us" % b, ("fi_rtt_%sB" % b,), "us") for b in RAW_SIZES]
    for line in raw:
        if line.startswith("n/a"):
            res["note"] = unparen(line[3:])
        for pat, names, unit in pats:
            m = re.match(pat, line)
            if not m:
                continue
            if names is None:
                res["provider"] = m.group(1)
            else:
                for i, n in enumerate(names):
                    values[n] = (float(m.group(i + 1)), unit)
    return values


fab = {"tandem": fabric(os.path.join(OUT, "fabric-tandem.txt"))}
if args.shm:
    fab["shm"] = fabric(os.path.join(OUT, "fabric-shm.txt"))
# The provider alone (fi_pingpong), where it ran: its figures join the pingpong's.
for k in list(fab):
    raw = fabric(os.path.join(OUT, "fabric-raw-%s.txt" % ("tandem" if k == "tandem" else "shm")))
    fab[k]["values"].update(raw["values"])
    fab[k]["raw"] += ["fi_pingpong: " + l for l in raw["raw"]]


def wire(kind, name, unit, tandem):
    """Tandem's cost over the raw fabric of its provider, or None where no pair fits."""
    vals = fab.get(kind, {}).get("values", {})
    if tandem is None or tandem <= 0:
        return None
    if unit == "us":
        if "async" in name or "readback" in name or "rtt_8B_p50" not in vals:
            return None
        return tandem / vals["rtt_8B_p50"][0]
    if unit == "GB/s":
        rd, wr = vals.get("rma_read_64MiB", (None,))[0], vals.get("rma_write_64MiB", (None,))[0]
        if "relay" in name:
            return None
        if "s2s" in name:
            w = max([x for x in (rd, wr) if x is not None], default=None)
        elif "h2d" in name or "_write_" in name:
            w = rd  # the server pulls the host's data
        elif "d2h" in name or "_read_" in name:
            w = wr  # the server pushes into the host
        else:
            w = None
        return None if w is None else w / tandem
    return None


shm = bool(args.shm)
columns = ["tandem"] + (["shm"] if shm else [])
label = {"tandem": "tandem", "shm": "tandem(shm)"}
json_rows, json_keepalive, json_s2s = [], [], []
lines = []


def table(header, rows, widths):
    out = []
    out.append(" | ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    out.append("-+-".join("-" * w for w in widths))
    for r in rows:
        out.append(" | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return out


# ---- main table: native | tandem | ratio | x wire [| tandem(shm) | ratio | x wire] ----
main_rows = []
for api in apis:
    native, s2s_native = col(api + "-native"), col(api + "-s2s-native")
    tan = {"tandem": col(api + "-tandem"), "shm": col(api + "-shm")}
    s2s = {"tandem": col(api + "-s2s-tandem"), "shm": col(api + "-s2s-shm")}
    for src_native, src, section in ((native, tan, "main"), (s2s_native, s2s, "s2s")):
        names = list(src_native.order)
        for k in columns:
            names += [n for n in src[k].order if n not in names]
        for name in names:
            if "readback" in name:
                continue  # in the keepalive table
            nv = src_native.get(name)
            unit = nv[1] or next((src[k].get(name)[1] for k in columns if src[k].get(name)[1]), "")
            if not unit:
                unit = "GB/s" if ("_copy_" in name or "_bw_" in name) else "us"
            row = [name, cell(nv, unit)]
            jr = {"name": name, "unit": unit, "native": rnd(nv[0], 4)}
            if nv[0] is None:
                jr["native_note"] = nv[2]
            for k in columns:
                tv = src[k].get(name)
                r, w = cost(unit, nv[0], tv[0]), wire(k, name, unit, tv[0])
                row += [cell(tv, unit), "-" if r is None else "%.2f" % r, "-" if w is None else "%.2f" % w]
                key = "tandem" if k == "tandem" else "tandem_shm"
                jr[key] = rnd(tv[0], 4)
                jr["ratio" if k == "tandem" else "ratio_shm"] = rnd(r)
                jr["wire_ratio" if k == "tandem" else "wire_ratio_shm"] = rnd(w)
                if tv[0] is None:
                    jr[key + "_note"] = tv[2]
            main_rows.append(row)
            json_rows.append(jr)
        if section == "s2s":
            # The point of direct copies: how much faster than relaying through the client.
            pre = "cuda" if api == "cuda" else "ocl"
            s2s_names = [n for n in names if n.startswith(pre + "_s2s_copy_")]
            for n in s2s_names:
                relay = n.replace("_s2s_", "_relay_")
                row = [pre + "_s2s_over_relay"]
                jr = {"name": pre + "_s2s_over_relay", "unit": "x"}

                def speedup(c):
                    a, b = c.get(n)[0], c.get(relay)[0]
                    return None if a is None or b is None or b <= 0 else a / b

                if all(speedup(c) is None for c in [src_native] + [src[k] for k in columns]):
                    continue
                v = speedup(src_native)
                row.append("-" if v is None else "%.2f x" % v)
                jr["native"] = rnd(v)
                for k in columns:
                    v = speedup(src[k])
                    row += ["-" if v is None else "%.2f x" % v, "", ""]
                    jr["tandem" if k == "tandem" else "tandem_shm"] = rnd(v)
                main_rows.append(row)
                json_s2s.append(jr)

hdr = ["measurement", "native"]
for k in columns:
    hdr += [label[k], "ratio", "x wire"]
widths = [max([len(hdr[0])] + [len(r[0]) for r in main_rows])]
for i in range(1, len(hdr)):
    widths.append(max([len(hdr[i])] + [len(r[i]) for r in main_rows if i < len(r)]))
lines += table(hdr, main_rows, widths)
lines.append("ratio: Tandem's cost over native (time: tandem/native; GB/s: native/tandem); >1 means slower")
lines.append("x wire: Tandem's cost over the fabric of its provider (time: over tandem_fabric_pingpong's 8 B round trip p50;")
lines.append("        GB/s: that direction's RMA bandwidth over Tandem's; s2s: the better RMA direction)")
lines.append("s2s: device 0 -> 1 on two servers (natively: two devices); relay: the same bytes through the host")

# ---- keepalive ----
ka_rows = []
for api in apis:
    pre = "cuda" if api == "cuda" else "ocl"
    runs = [("native", col(api + "-native")), ("native, keepalive in program", col(api + "-native-ka")),
            ("keepalive on", col(api + "-tandem")), ("keepalive off", col(api + "-tandem-ka0"))]
    if shm:
        runs.append(("shm, on", col(api + "-shm")))
    warm_name = pre + "_readback_warm"
    names = [warm_name] + [n for n in runs[0][1].order if n.startswith(pre + "_readback_idle_")]
    # The bound: Tandem's warm read plus what the same gap costs natively with the program
    # keeping its GPU warm itself (no network in the path), over Tandem's warm read.
    nk, tk = dict(runs)["native, keepalive in program"], dict(runs)["keepalive on"]
    nk_w, tk_w = nk.get(warm_name)[0], tk.get(warm_name)[0]
    for name in names:
        row = [name.replace(pre + "_readback_", pre + " ")]
        jr = {"name": name, "unit": "us"}
        for title, c in runs:
            v, _, note = c.get(name)
            w = c.get(warm_name)[0]
            over = None if v is None or not w else v / w
            row += [cell((v, "us", note), "us"), "-" if over is None else "%.2f" % over]
            key = title.replace(", ", "_").replace(" ", "_")
            jr[key] = rnd(v, 4)
            jr[key + "_over_warm"] = rnd(over)
        nk_v = nk.get(name)[0]
        bound = None if None in (nk_v, nk_w, tk_w) or not tk_w else (tk_w + max(0.0, nk_v - nk_w)) / tk_w
        row.append("-" if bound is None else "%.2f" % bound)
        jr["bound_over_warm"] = rnd(bound)
        ka_rows.append(row)
        json_keepalive.append(jr)
if ka_rows:
    hdr = ["idle read-back (p50)"]
    for title, _ in runs:
        hdr += [title if title.startswith("native") else "tandem " + title, "/warm"]
    hdr.append("bound")
    widths = [max(len(h), *(len(r[i]) for r in ka_rows)) for i, h in enumerate(hdr)]
    lines.append("")
    lines += table(hdr, ka_rows, widths)
    lines.append("/warm: idle read-back over the warm one (target <= 1.3 with keepalive on, default "
                 "TANDEM_KEEPALIVE_MS; off: TANDEM_KEEPALIVE_MS=0)")
    lines.append("native, keepalive in program: the program's own thread keeps the GPU warm as tandemd does "
                 "(--idle-keepalive)")
    lines.append("bound: (tandem's warm read + that native run's idle cost) / tandem's warm read: the GPU's and "
                 "the program's own share of the idle cost, before the network's")

# ---- raw fabric ----
fab_rows, json_fabric = [], []
fab_names = [("rtt_8B_p50", "8 B round trip p50"), ("rtt_8B_p90", "8 B round trip p90"),
             ("stream_msg_1MiB", "1 MiB messages streamed"), ("rma_read_64MiB", "RMA read 64 MiB"),
             ("rma_write_64MiB", "RMA write 64 MiB")] + [
                 ("rtt_idle_%sms" % g, "8 B round trip after %s ms quiet" % g) for g in FABRIC_GAPS] + [
                 ("fi_rtt_%sB" % b, "provider alone: %s B round trip (mean)" % b) for b in RAW_SIZES]
# The gaps and fi_pingpong's rows only where some provider measured them.
fab_names = [(key, title) for key, title in fab_names
             if not key.startswith(("rtt_idle_", "fi_rtt_")) or any(key in fab[k]["values"] for k in columns)]
for key, title in fab_names:
    row = [title]
    for k in columns:
        f = fab[k]
        v = f["values"].get(key)
        warm = f["values"].get("rtt_8B_p50")
        over = " (%.2fx)" % (v[0] / warm[0]) if v is not None and key.startswith("rtt_idle_") and warm else ""
        row.append(cell((None, "", f["note"] or "missing")) if v is None else "%s %s%s" % (fmt(v[0]), v[1], over))
        if v is not None:
            json_fabric.append({"provider": f["provider"] or (args.provider if k == "tandem" else "shm"),
                                "name": "fabric_" + key, "value": v[0], "unit": v[1]})
    fab_rows.append(row)
hdr = ["fabric (tandem_fabric_pingpong)"] + [
    "%s: %s" % (label[k], fab[k]["provider"] or (args.provider if k == "tandem" else "shm")) for k in columns]
widths = [max(len(h), *(len(r[i]) for r in fab_rows)) for i, h in enumerate(hdr)]
lines.append("")
lines += table(hdr, fab_rows, widths)
if any(key.startswith("rtt_idle_") for key, _ in fab_names):
    lines.append("after N ms quiet: every thread on the path polling through the gap (no sleep anywhere); "
                 "(x): over the warm p50")
if any(key.startswith("fi_rtt_") for key, _ in fab_names):
    lines.append("provider alone: libfabric's fi_pingpong, one thread per side polling its CQ; the rows above go "
                 "through Tandem's fabric layer")

# ---- the launch + synchronize target, against both wires ----
# <= native + 1 fabric round trip + 5 us: the round trip of Tandem's own fabric layer (the
# table's "x wire"), and where fi_pingpong ran, of the provider alone (its 256 B messages:
# Tandem's batches are larger than rxm's inject size).
sync_rows = [("cuda", "cuda_launch_sync"), ("opencl", "ocl_enqueue_finish")]
target_lines = []
for api, name in sync_rows:
    if api not in apis:
        continue
    nv = col(api + "-native").get(name)[0]
    for k in columns:
        tv = col(api + ("-tandem" if k == "tandem" else "-shm")).get(name)[0]
        vals = fab[k]["values"]
        if nv is None or tv is None:
            continue
        parts = []
        for key, what in (("rtt_8B_p50", "Tandem's fabric layer (8 B, p50)"),
                          ("fi_rtt_256B", "provider alone (256 B, mean)")):
            if key in vals:
                bound = nv + vals[key][0] + 5
                parts.append("%s %s -> %s us, %s" % (what, fmt(vals[key][0]), fmt(bound),
                                                     "met" if tv <= bound else "missed by %s us" % fmt(tv - bound)))
        if parts:
            target_lines.append("%s (%s): %s us against native %s + wire + 5: %s" % (
                name, label[k], fmt(tv), fmt(nv), "; ".join(parts)))
if target_lines:
    lines.append("")
    lines.append("launch + synchronize target (<= native + 1 fabric round trip + 5 us):")
    lines += ["  " + l for l in target_lines]

# ---- workloads ----
work_rows, json_work = [], []
wl = os.path.join(OUT, "workloads.txt")
if os.path.exists(wl):
    def seconds(path):
        t = None
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                for line in f:
                    m = re.search(r"time:\s*([0-9.eE+-]+)\s*s\b", line)
                    if m:
                        try:
                            t = float(m.group(1))
                        except ValueError:
                            pass
        return t

    def timed(name, kind, why):
        """A run's (seconds, why not): its time from work-NAME-KIND.txt unless `why` (the runner's
        reason) says it has none, or the file has no time line."""
        t = None if why else seconds(os.path.join(OUT, "work-%s-%s.txt" % (name, kind)))
        return t, why or ("" if t is not None else "no `time: X s` line")

    def share(a, tan):
        return None if a is None or tan is None or tan <= 0 else a / tan

    procs = {}  # name -> why the 4-process native run has no time ("" when it has one)
    wlp = os.path.join(OUT, "workloads-procs.txt")
    if os.path.exists(wlp):
        with open(wlp) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 2:
                    procs[parts[0]] = parts[1]
    with open(wl) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 4:
                continue
            name, n, nat_why, tan_why = parts[:4]
            nat, nat_why = timed(name, "native", nat_why)
            tan, tan_why = timed(name, "tandem", tan_why)
            eff = share(nat, tan)
            pro, pro_cell, pro_eff = None, "-", None
            if name in procs:
                pro, pro_why = timed(name, "procs", procs[name])
                pro_cell = cell((pro, "s", unparen(pro_why)), "s")
                pro_eff = share(pro, tan)
            work_rows.append([name, n, cell((nat, "s", unparen(nat_why)), "s"), cell((tan, "s", unparen(tan_why)), "s"),
                              "-" if eff is None else "%.2f" % eff, pro_cell,
                              "-" if pro_eff is None else "%.2f" % pro_eff])
            jr = {"name": name, "servers": int(n), "native_s": nat, "tandem_s": tan,
                  "native_over_tandem": rnd(eff)}
            if name in procs:
                jr["native_4proc_s"] = pro
                jr["native_4proc_over_tandem"] = rnd(pro_eff)
            if nat is None:
                jr["native_note"] = unparen(nat_why)
            if tan is None:
                jr["tandem_note"] = unparen(tan_why)
            json_work.append(jr)
if work_rows:
    hdr = ["workload (time: X s)", "servers", "native", "tandem", "native/tandem", "native, 4 processes",
           "4 proc/tandem"]
    widths = [max(len(h), *(len(r[i]) for r in work_rows)) for i, h in enumerate(hdr)]
    lines.append("")
    lines += table(hdr, work_rows, widths)
    lines.append("native/tandem: the share of native speed Tandem keeps (1 = parity)")
    lines.append("native, 4 processes: the same bands natively in four processes sharing the device(s), halos "
                 "through the host (bench/advection_procs)")

if notes:
    lines.append("")
    for i, n in enumerate(notes):
        lines.append("[%d] %s" % (i + 1, n))

print("\n".join(lines))

doc = {
    "quick": bool(args.quick),
    "host": args.host,
    "gpu": bool(args.gpu),
    "provider": args.provider,
    "shm": shm,
    "measurements": json_rows,
    "s2s_over_relay": json_s2s,
    "keepalive": json_keepalive,
    "fabric": json_fabric,
    "fabric_raw": {k: fab[k]["raw"] for k in columns},
    "workloads": json_work,
}
with open(os.path.join(OUT, "bench.json"), "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
sys.exit(0)
