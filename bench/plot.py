#!/usr/bin/env python3
"""Charts of bench.json (report.py writes it): Tandem's cost over native per measurement
(tcp and, when run, shm; 1 = parity), and each idle read-back over the warm one with
keepalive on and off (target line at 1.3).
   python3 bench/plot.py bench.json bench.png   (does nothing without matplotlib)"""
import json
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)

src, dst = sys.argv[1], sys.argv[2]
with open(src) as f:
    data = json.load(f)
rows = [m for m in data.get("measurements", [])
        if m.get("ratio") is not None or m.get("ratio_shm") is not None]
ka = [k for k in data.get("keepalive", [])
      if k.get("keepalive_on_over_warm") is not None or k.get("keepalive_off_over_warm") is not None]
if not rows and not ka:
    sys.exit(0)

panels = (1 if rows else 0) + (1 if ka else 0)
heights = ([0.3 * len(rows) + 1.2] if rows else []) + ([0.3 * len(ka) + 1.2] if ka else [])
fig, axes = plt.subplots(panels, 1, figsize=(8, sum(heights) + 0.5), squeeze=False,
                         gridspec_kw={"height_ratios": heights})
axes = [a[0] for a in axes]
quick = " (quick run)" if data.get("quick") else ""


def bars(ax, names, series, xlabel, ref, title):
    """Horizontal bars, one group per name, one bar per (label, values, color) series."""
    n = len(series)
    h = 0.8 / n
    for i, (label, vals, color) in enumerate(series):
        ys = [y + (i - (n - 1) / 2) * h for y in range(len(names))]
        ax.barh(ys, [v if v is not None else 0 for v in vals], height=h, color=color, label=label)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=7)
    ax.axvline(ref, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    if n > 1:
        ax.legend(fontsize=7)


i = 0
if rows:
    series = [("tandem (%s)" % data.get("provider", "tcp"), [m.get("ratio") for m in rows], "tab:blue")]
    if data.get("shm"):
        series.append(("tandem (shm)", [m.get("ratio_shm") for m in rows], "tab:orange"))
    ax = axes[i]
    bars(ax, [m["name"] for m in rows], series, "Tandem / native cost (log scale; >1 = slower)", 1.0,
         "Tandem vs native" + quick)
    ax.set_xscale("log")
    i += 1
if ka:
    series = [("keepalive on", [k.get("keepalive_on_over_warm") for k in ka], "tab:green"),
              ("keepalive off", [k.get("keepalive_off_over_warm") for k in ka], "tab:red")]
    if any(k.get("bound_over_warm") is not None for k in ka):
        series.append(("bound: the GPU's and program's share", [k.get("bound_over_warm") for k in ka], "tab:gray"))
    bars(axes[i], [k["name"] for k in ka], series, "idle read-back / warm read-back (target <= 1.3)", 1.3,
         "Idle read-back through Tandem" + quick)
fig.tight_layout()
fig.savefig(dst, dpi=120)
