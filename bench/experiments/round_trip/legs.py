#!/usr/bin/env python3
"""legs.py PREFIX [skip]: joins PREFIX.client.* and PREFIX.server.* rows by seq and prints the
median of each leg of a synchronous round trip (us)."""
import glob, statistics, sys
pre = sys.argv[1]; skip = int(sys.argv[2]) if len(sys.argv) > 2 else 200
def rows(side):
    out = {}
    for f in glob.glob(f"{pre}.{side}.*"):
        for line in open(f):
            v = [int(x) for x in line.split()]
            if v: out[v[0]] = v[1:]
    return out
c, s = rows("client"), rows("server")
keys = sorted(k for k in c if k in s)[skip:]
names = ["client post->send", "fi send (client)", "wire+srv progress", "srv progress->recv thread",
         "recv thread->executor", "execute batch", "reply send (server)", "wire+cli progress",
         "cli progress->recv thread", "recv thread->OnMessage", "parse+dispatch", "Set->app returns", "TOTAL"]
# A late reply (OpenCL's synchronize) is sent by the worker's waiter, whose row adds when it
# took the reply over and when the wait ended: "reply send" then splits in three.
late = any(len(v) == 7 for v in s.values())
if late:
    names[6:7] = ["executor -> waiter", "waiter's wait", "reply send (waiter)"]
legs = []
for k in keys:
    post, ss, sd, cr, cn, om, st, ret = c[k]
    r, n, p, h, sent, *w = s[k]
    if not late:
        mid = [sent-h]
    elif w:
        mid = [w[0]-h, w[1]-w[0], sent-w[1]]
    else:  # a batch the executor answered itself
        mid = [0, 0, sent-h]
    legs.append([ss-post, sd-ss, r-sd, n-r, p-n, h-p] + mid + [cr-sent, cn-cr, om-cn, st-om, ret-st, ret-post])
if not legs: print("no joined rows", len(c), len(s)); sys.exit(0)
print(f"{len(legs)} round trips")
for i, name in enumerate(names):
    col = sorted(x[i] / 1000 for x in legs)
    print(f"  {name:28} p50 {col[len(col)//2]:7.2f}  p10 {col[len(col)//10]:7.2f}  p90 {col[9*len(col)//10]:7.2f}")
