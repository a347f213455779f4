"""Do a step's kernels overlap on the device? Their summed durations against their union.

    python experiments/kernel_overlap.py OUTDIR [model_input ...]

Traces a few steps of each network (eagerly, as the trace job does, TF32 on and off)
under ``torch.profiler`` and prints, per network, mode and TF32: the kernels per step,
the streams they ran on, their summed durations (what ``opcost.kineto`` takes as GPU
time), the union of their intervals (the time the device was busy), and the kernels that
started before the one before them on the device had ended. Writes OUTDIR/overlap.json
and each profiler trace (OUTDIR/{model_input}.{mode}.{tf32|notf32}.trace.json.gz).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import torch

from opcost import harness, kineto, tracing
from opcost.names import ModelInput
from opcost.networks import build_model


def overlap(trace: dict) -> dict:
    """The middle step's kernels: count, streams, summed and busy time, overlaps."""
    p = kineto.parse(trace)
    device = p.device_events()
    out = []
    for mark in p.named(kineto.STEP):
        evs = sorted(
            (ev for t, ev in device if mark.start_us <= t <= mark.end_us),
            key=lambda ev: ev.start_us,
        )
        overlapping = [
            b.name[:80] for a, b in zip(evs, evs[1:], strict=False) if b.start_us < a.end_us
        ]
        out.append(
            {
                "kernels": len(evs),
                "streams": sorted({str(ev.args.get("stream")) for ev in evs}),
                "sum_us": sum(ev.dur_us for ev in evs),
                "union_us": kineto.busy_us((ev.start_us, ev.end_us) for ev in evs),
                "overlapping": len(overlapping),
                "overlapping_names": sorted(set(overlapping))[:5],
            }
        )
    return out[len(out) // 2]


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or ["regnet_x_400mf_8x3x224x224", "resnet18_8x3x224x224"]
    results = []
    for name in names:
        mi = ModelInput.from_name(name)
        for tf32 in (True, False):
            for mode in ("inference", "training"):
                opts = harness.HarnessOptions(mode=mode, device="cuda", tf32=tf32)
                harness.configure_numerics(opts)
                net = build_model(mi.model)
                workload = harness.prepare_network(net, mi.shape, opts)
                with workload.context():
                    for _ in range(3):
                        workload.step()
                torch.cuda.synchronize()
                trace = tracing._profile(workload, torch.device("cuda"), None)
                row = {"model_input": name, "tf32": tf32, "mode": mode, **overlap(trace)}
                tag = f"{name}.{mode}.{'tf32' if tf32 else 'notf32'}"
                with gzip.open(out_dir / f"{tag}.trace.json.gz", "wt") as f:
                    json.dump(trace, f)
                results.append(row)
                print(
                    f"{name:32s} tf32={tf32!s:5s} {mode:9s} kernels {row['kernels']:4d} "
                    f"streams {','.join(row['streams']):10s} sum {row['sum_us']:9.1f} us "
                    f"union {row['union_us']:9.1f} us ({row['union_us'] / row['sum_us']:.3f}) "
                    f"overlapping {row['overlapping']} {row['overlapping_names'][:2]}",
                    flush=True,
                )
                del workload, net
                torch.cuda.empty_cache()
    (out_dir / "overlap.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
