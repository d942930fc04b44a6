#!/usr/bin/env python3
"""Bar chart of the ratios in bench.json (Tandem's cost over native; 1 = parity).
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
rows = [m for m in data["measurements"] if m.get("ratio") is not None]
if not rows:
    sys.exit(0)
names = [m["name"] for m in rows]
ratios = [m["ratio"] for m in rows]
fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.5))
colors = ["tab:green" if r <= 1.2 else "tab:orange" if r <= 2 else "tab:red" for r in ratios]
ax.barh(names, ratios, color=colors)
ax.axvline(1.0, color="black", linewidth=0.8)
ax.invert_yaxis()
ax.set_xscale("log")
ax.set_xlabel("Tandem / native cost (log scale; >1 = slower)")
ax.set_title("Tandem vs native" + (" (quick run)" if data.get("quick") else ""))
ax.tick_params(axis="y", labelsize=7)
fig.tight_layout()
fig.savefig(dst, dpi=120)
