"""How fast does the evaluate stage turn raw measurements into a dataset?

Generates a synthetic study of raw JSON + nvidia-smi CSV pairs in a temporary folder, laid
out as the profile stage writes them (``{setting}/{mode}/{ops,networks}/{name}.{json,csv}``),
with realistic sizes: a timed window of 1-2 s polled every 20 ms, half a second of lead-in
and a little lead-out, so 80-130 lines per log; 2 % of the measurements failed. Then times
:func:`opcost.evaluate.evaluate_gpu` on it and prints measurements per second.

Usage: ``python bench/evaluate_speed.py [--n 1000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opcost.evaluate import evaluate_gpu

HEADER = (
    "timestamp, power.draw [W], power.draw.instant [W], clocks.current.sm [MHz], "
    "clocks.current.memory [MHz], temperature.gpu, utilization.gpu [%], power.limit [W]"
)
POLL_S = 0.02
UTC_OFFSET_S = 3600
SPEC = {
    "kind": "module",
    "type": "torch.nn.modules.conv.Conv2d",
    "attrs": {"in_channels": 64, "out_channels": 64, "kernel_size": [3, 3], "stride": [1, 1]},
    "args": [{"__tensor__": 0}],
    "kwargs": {},
    "inputs": [{"shape": [32, 64, 56, 56], "dtype": "float32"}],
    "outputs": [{"shape": [32, 64, 56, 56], "dtype": "float32"}],
}


def write_measurement(folder: Path, name: str, kind: str, setting: str, mode: str, rng) -> None:
    start = 1795340491.0 + rng.uniform(0, 1e5)
    window_s = rng.uniform(1.0, 2.0)
    failed = rng.random() < 0.02
    iterations = rng.randint(100, 5000)
    record = {
        "schema_version": 1,
        "status": "failed" if failed else "ok",
        "failure_reason": "CUDA out of memory: synthetic" if failed else None,
        "kind": kind,
        "op_id": name if kind == "op" else None,
        "model_input": name if kind == "network" else None,
        "spec": {**SPEC, "attrs": {**SPEC["attrs"], "out_channels": rng.randint(1, 512)}}
        if kind == "op"
        else None,
        "mode": mode,
        "gpu": "h100",
        "setting": setting,
        "device": "cuda",
        "dtype": "float32",
        "tf32": True,
        "utc_offset_s": UTC_OFFSET_S,
        "power_available": True,
        "power_fields": ["timestamp", "power.draw", "power.draw.instant"],
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "host": "node01",
    }
    if not failed:
        record.update(
            block_size=4,
            warmup_iterations=50,
            number_per_run=iterations // 10,
            block_times_s=[window_s / 10] * 10,
            iterations=iterations,
            total_time_s=window_s * 0.98,
            sigma_total_time_s=window_s * 0.01,
            timed_start_unix_s=start,
            timed_end_unix_s=start + window_s,
            energy_counter_start_mj=10**9,
            energy_counter_end_mj=10**9 + int(400_000 * window_s),
        )
    (folder / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")

    local = datetime.fromtimestamp(start - 0.5, UTC).replace(tzinfo=None)
    local += timedelta(seconds=UTC_OFFSET_S)
    n_lines = int((window_s + 0.6) / POLL_S)
    level_w = rng.uniform(150, 690)
    lines = [HEADER]
    reading = 90.0
    for i in range(n_lines):
        t = local + timedelta(seconds=POLL_S * i)
        if i % 5 == 0:  # H100: a new instant reading about every 100 ms
            reading = 90.0 if i < 25 else level_w + rng.gauss(0, 5)
        stamp = t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"
        lines.append(f"{stamp}, 300.00, {reading:.2f}, 1980, 2619, 55, 100, 700.00")
    (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")


def make_study(raw: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    combos = [(s, m) for s in ("default", "sm1410") for m in ("inference", "training")]
    for k in range(n):
        setting, mode = combos[k % len(combos)]
        kind = "network" if k % 25 == 0 else "op"
        folder = raw / setting / mode / ("networks" if kind == "network" else "ops")
        folder.mkdir(parents=True, exist_ok=True)
        name = f"net{k}_32x3x224x224" if kind == "network" else f"{k:016x}"
        write_measurement(folder, name, kind, setting, mode, rng)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="measurements to generate")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the best is shown")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "results" / "raw" / "h100"
        make_study(raw, args.n)
        times, cpu_times = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            dataset, failures = evaluate_gpu(raw, "h100")
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
    best, best_cpu = min(times), min(cpu_times)
    # CPU time as well: on a shared machine the wall time says more about the neighbours.
    print(
        f"{args.n} measurements ({len(dataset)} ok, {len(failures)} failed) in {best:.2f} s "
        f"wall, {best_cpu:.2f} s CPU (best of {args.repeat}): {args.n / best:.0f} "
        f"measurements/s wall, {args.n / best_cpu:.0f} per CPU second"
    )


if __name__ == "__main__":
    main()
