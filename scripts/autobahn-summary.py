#!/usr/bin/env python3
"""Summarise an Autobahn|Testsuite fuzzingclient run (its index.json): counts per category and
behaviour, then every case that was not OK with the close code Herald sent and the suite's reason.

    python3 scripts/autobahn-summary.py target/autobahn/index.json [--markdown]
"""
import collections
import json
import os
import sys

CATEGORIES = {
    "1": "framing (text/binary echo)",
    "2": "pings and pongs",
    "3": "reserved bits",
    "4": "opcodes",
    "5": "fragmentation",
    "6": "UTF-8 handling",
    "7": "close handling",
    "9": "limits / performance (large messages)",
    "10": "miscellaneous (auto-fragmentation)",
    "12": "permessage-deflate (echo)",
    "13": "permessage-deflate (negotiation parameters)",
}
ORDER = ["OK", "NON-STRICT", "INFORMATIONAL", "UNIMPLEMENTED", "FAILED"]


def case_key(case):
    return [int(p) for p in case.split(".")]


def main():
    path = sys.argv[1]
    markdown = "--markdown" in sys.argv
    index = json.load(open(path))
    outdir = os.path.dirname(path)
    for agent, cases in index.items():
        counts = collections.defaultdict(collections.Counter)
        for case, r in cases.items():
            counts[case.split(".")[0]][r["behavior"]] += 1
        print(f"agent {agent}: {len(cases)} cases")
        if markdown:
            print("| category | cases | " + " | ".join(ORDER) + " |")
            print("| --- | --- |" + " --- |" * len(ORDER))
        for cat in sorted(counts, key=int):
            c = counts[cat]
            name = CATEGORIES.get(cat, "?")
            if markdown:
                cells = " | ".join(str(c.get(b, 0)) for b in ORDER)
                print(f"| {cat} {name} | {sum(c.values())} | {cells} |")
            else:
                cells = ", ".join(f"{b} {c[b]}" for b in ORDER if c.get(b))
                print(f"  {cat:>3} {name:<45} {sum(c.values()):>4}: {cells}")
        total = collections.Counter(r["behavior"] for r in cases.values())
        print("  total: " + ", ".join(f"{b} {total[b]}" for b in ORDER if total.get(b)))
        tally = collections.Counter(
            (r["behavior"], r["behaviorClose"], r.get("remoteCloseCode"))
            for r in cases.values()
            if not (r["behavior"] == "OK" and r["behaviorClose"] == "OK")
        )
        print("  not OK, by (behaviour, close behaviour, the server's close code):")
        for (b, bc, code), n in sorted(tally.items(), key=lambda kv: -kv[1]):
            print(f"    {n:>4}  {b} / {bc}, close {code}")
        print()
        print("cases not OK (behaviour / close behaviour, the server's close code, the suite's reason):")
        for case in sorted(cases, key=case_key):
            r = cases[case]
            if r["behavior"] == "OK" and r["behaviorClose"] == "OK":
                continue
            reason = ""
            report = os.path.join(outdir, r.get("reportfile") or "")
            if r.get("reportfile") and os.path.exists(report):
                detail = json.load(open(report))
                reason = detail.get("result", "")
                if r["behaviorClose"] != "OK":
                    reason += " / " + detail.get("resultClose", "")
            print(f"  {case}: {r['behavior']} / {r['behaviorClose']}, close {r.get('remoteCloseCode')}: {reason}")


if __name__ == "__main__":
    main()
