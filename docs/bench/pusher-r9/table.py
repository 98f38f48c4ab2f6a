#!/usr/bin/env python3
"""The table of docs/bench/pusher-r9/section.md from the runs' .txt files."""
import glob, os, re, sys

D = os.path.dirname(os.path.abspath(__file__))

def read(path):
    t = open(path).read()
    lat = re.search(r"delivery latency\s+n=(\d+) p50=([\d.]+) p90=[\d.]+ p99=([\d.]+)", t)
    cpu = re.search(r"server\s+pid \d+: .*CPU (\d+)% window", t)
    rig = re.search(r"workers (\d+)% \(of one core\)", t)
    mach = re.search(r"nice \(others\) (\d+)%, idle (\d+)%; load ([\d.]+)", t)
    dl = re.search(r"delivered\s+([\d.]+)% .*duplicates (\d+), gaps (\d+)", t)
    return dict(p50=float(lat[2]), p99=float(lat[3]), cpu=int(cpu[1]), rig=int(rig[1]),
                others=int(mach[1]), idle=int(mach[2]), load=float(mach[3]),
                delivered=dl[1], dup=int(dl[2]), gaps=int(dl[3]))

def others(r):
    """Share of the 2 cores neither ours nor idle: 100 - idle - (server + rig workers) / 2. The
    tool's own "nice (others)" counts only niced processes, and other tenants' builds run at
    nice 0 (they show up in "user")."""
    return max(0, round(100 - r["idle"] - (r["cpu"] + r["rig"]) / 2))

def quiet(r):
    return others(r) <= 10

rows = []
for build in ("before", "after", "final"):
    pairs = sorted({int(re.search(r"-(\d+)\.txt$", f)[1])
                    for f in glob.glob(f"{D}/{build}-herald-*.txt")})
    for pair in pairs:
        try:
            h = read(f"{D}/{build}-herald-{pair}.txt")
            p = read(f"{D}/{build}-pusher-{pair}.txt")
        except (FileNotFoundError, TypeError):
            continue
        rows.append((build, pair, h, p))

print("| build | pair | Herald p50 / p99 | Pusher p50 / p99 | Pusher vs Herald p50 / p99 | server CPU H / P | rig CPU H / P | machine idle H / P | others' CPU H / P | load H / P |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for build, pair, h, p in rows:
    d50 = (p["p50"] / h["p50"] - 1) * 100
    d99 = (p["p99"] / h["p99"] - 1) * 100
    print(f"| {build} | {pair} | {h['p50']:.2f} / {h['p99']:.2f} ms | {p['p50']:.2f} / {p['p99']:.2f} ms "
          f"| {d50:+.1f}% / {d99:+.1f}% | {h['cpu']}% / {p['cpu']}% | {h['rig']}% / {p['rig']}% "
          f"| {h['idle']}% / {p['idle']}% | {others(h)}% / {others(p)}% | {h['load']} / {p['load']} |")
for build in ("before", "after", "final"):
    r = [(h, p) for b, _, h, p in rows if b == build]
    if not r:
        continue
    import statistics as st
    d50 = [(p["p50"] / h["p50"] - 1) * 100 for h, p in r]
    d99 = [(p["p99"] / h["p99"] - 1) * 100 for h, p in r]
    print(f"\n{build}: {len(r)} pairs, Pusher vs Herald p50 mean {st.mean(d50):+.1f}% median {st.median(d50):+.1f}%, "
          f"p99 mean {st.mean(d99):+.1f}% median {st.median(d99):+.1f}%; "
          f"sum of Pusher p50 / sum of Herald p50 {sum(p['p50'] for _, p in r) / sum(h['p50'] for h, _ in r) * 100 - 100:+.1f}%, "
          f"p99 {sum(p['p99'] for _, p in r) / sum(h['p99'] for h, _ in r) * 100 - 100:+.1f}%")
    q = [(h, p) for h, p in r if quiet(h) and quiet(p)]
    if q:
        q50 = [(p["p50"] / h["p50"] - 1) * 100 for h, p in q]
        q99 = [(p["p99"] / h["p99"] - 1) * 100 for h, p in q]
        print(f"  quiet pairs (others' CPU <= 10% in both runs): {len(q)}, p50 " + ", ".join(f"{x:+.1f}%" for x in q50)
              + " (mean " + f"{st.mean(q50):+.1f}%), p99 " + ", ".join(f"{x:+.1f}%" for x in q99) + f" (mean {st.mean(q99):+.1f}%)")
    else:
        print("  quiet pairs (others' CPU <= 10% in both runs): none")
    bad = [(h, p) for h, p in r if h["dup"] or h["gaps"] or p["dup"] or p["gaps"] or h["delivered"] != "100.0000" or p["delivered"] != "100.0000"]
    print(f"  runs with losses, duplicates or gaps: {len(bad)}")

print()
print("| idle, 5,000 connections | Herald RSS / connection | Pusher RSS / connection | Pusher vs Herald | machine busy (not idle) H / P |")
print("| --- | --- | --- | --- | --- |")
for f in sorted(glob.glob(f"{D}/idle-*-herald*.txt")):
    pf = f.replace("-herald", "-pusher")
    if not os.path.exists(pf):
        continue
    def idle(path):
        t = open(path).read()
        kb = float(re.search(r"server RSS / connection\s+([\d.]+) KB", t)[1])
        m = re.search(r"idle (\d+)%; load ([\d.]+)", t)
        return kb, 100 - int(m[1])
    (hk, ho), (pk, po) = idle(f), idle(pf)
    name = os.path.basename(f).replace("idle-", "").replace("-herald", "").replace(".txt", "")
    print(f"| {name} | {hk:.2f} KB | {pk:.2f} KB | {(pk / hk - 1) * 100:+.1f}% | {ho}% / {po}% |")
