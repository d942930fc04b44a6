#!/usr/bin/env python3
"""legs.py PREFIX [skip]: joins PREFIX.client.* and PREFIX.server.* rows by seq and prints the
median of each leg of a synchronous round trip (us). "posted": when the fabric's fi_inject or
fi_send for the frame returned, on whichever thread posted it (the caller's, or the one it was
handed to)."""
import glob, sys
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
# A late reply (OpenCL's read back and synchronize) is sent by the worker's waiter, whose row
# adds when it took the reply over and when the wait ended.
late = any(len(v) == 8 for v in s.values())
names = ["client: post -> Send called", "client: Send -> frame posted", "wire -> server's Push",
         "server: Push -> Next returns", "server: -> batch starts", "server: the batch"]
if late:
    names += ["server: executor -> waiter", "server: the waiter's wait"]
names += ["server: reply -> frame posted", "wire -> client's Push", "client: Push -> Next returns",
          "client: Next -> OnMessage", "client: OnMessage -> Set", "client: Set -> returns", "TOTAL",
          "(client: Send call itself)", "(server: reply's Send call)"]
legs = []
for k in keys:
    post, ss, sd, cr, cn, om, st, ret, cpost = c[k]
    v = s[k]
    if len(v) == 8:
        r, n, p, h, sent, wpop, wdone, spost = v
        mid, from_ = [wpop - h, wdone - wpop], wdone
    else:
        r, n, p, h, sent, spost = v
        mid, from_ = ([0, 0] if late else []), h
    legs.append([ss - post, cpost - ss, r - cpost, n - r, p - n, h - p] + mid +
                [spost - from_, cr - spost, cn - cr, om - cn, st - om, ret - st, ret - post, sd - ss, sent - from_])
if not legs: print("no joined rows", len(c), len(s)); sys.exit(0)
print(f"{len(legs)} round trips")
for i, name in enumerate(names):
    col = sorted(x[i] / 1000 for x in legs)
    print(f"  {name:32} p50 {col[len(col)//2]:7.2f}  p10 {col[len(col)//10]:7.2f}  p90 {col[9*len(col)//10]:7.2f}")
