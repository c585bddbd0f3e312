"""Paired comparison of two variants in a container_restore_variants.py run: per model and cache
(cold, and warm where the run has "-warm" variants), the median of B's first token less A's in the
same round, how often B was sooner, and each variant's median milestones (s from the create call)
with CRIU's phase (RESTORE_ISSUED to RESTORE_DONE).

    python experiments/variants_paired.py RUN.jsonl A B
"""
import json
import statistics as st
import sys
from collections import defaultdict

MILESTONES = ("ENTRY_READY", "RESTORE_ISSUED", "WARM_START", "RESTORE_DONE", "SERVER_UP", "WEIGHTS_LOADED",
              "FIRST_TOKEN")


def main(path: str, a: str, b: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    by = defaultdict(dict)
    for r in rows:
        by[(r["size"], r["rep"])][r["variant"]] = r
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    for suffix in ("", "-warm"):
        for size in sizes:
            pairs = [v for (s, _), v in sorted(by.items()) if s == size and a + suffix in v and b + suffix in v]
            if not pairs:
                continue
            d = [v[b + suffix]["first_token_s"] - v[a + suffix]["first_token_s"] for v in pairs]
            print(f"{size} {'warm' if suffix else 'cold'}: {b} - {a} paired median {st.median(d):+.3f} s, "
                  f"{b} sooner in {sum(x < 0 for x in d)} of {len(d)}")
            for name in (a + suffix, b + suffix):
                ev = [r["events"] for r in rows if r["size"] == size and r["variant"] == name]
                med = {k: round(st.median([e[k] for e in ev if k in e]), 3) for k in MILESTONES}
                criu = round(st.median([e["RESTORE_DONE"] - e["RESTORE_ISSUED"] for e in ev]), 3)
                print(f"    {name}: {med} criu {criu}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
