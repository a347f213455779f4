"""Does an op's GPU kernel time repeat on another host of one kind? (issue 22's target: 2 %)

    python bench/kernel_repeat.py A.tar.gz B.tar.gz

Each archive holds trace JSONs (`results/raw/{gpu}/{setting}/{mode}/traces/...`, as the
committed `traces*.tar.gz`). Prints, for the ops and networks traced in both, the median
and 90th percentile of |gpu_time_s(B) / gpu_time_s(A) - 1|, and the same for host time
and wall time, with the two hosts' CPUs and probe times.
"""

from __future__ import annotations

import json
import statistics
import sys
import tarfile


def records(path: str) -> dict[str, dict]:
    out = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile() and "/traces/" in m.name and m.name.endswith(".json"):
                r = json.load(tar.extractfile(m))
                if r.get("status") == "ok":
                    key = (
                        m.name.split("/traces/")[0].split("/", 3)[-1]
                        + "/"
                        + m.name.split("/traces/")[1]
                    )
                    out[key] = r
    return out


def main() -> None:
    a, b = records(sys.argv[1]), records(sys.argv[2])
    both = sorted(set(a) & set(b))
    print(
        f"{len(both)} traces in both; A: {next(iter(a.values()))['host_cpu']}, "
        f"B: {next(iter(b.values()))['host_cpu']}"
    )
    for key in ("gpu_time_s", "host_time_s", "wall_time_s", "host_probe_s"):
        miss = sorted(
            abs(b[k][key] / a[k][key] - 1) for k in both if a[k].get(key) and b[k].get(key)
        )
        if miss:
            print(
                f"{key:13s} median |B/A - 1| {statistics.median(miss):6.1%}, "
                f"90th percentile {miss[int(0.9 * len(miss))]:6.1%} (n={len(miss)})"
            )


if __name__ == "__main__":
    main()
