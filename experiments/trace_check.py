"""Trace a few networks and their isolated ops on this GPU; compare replays with wall time.

    python experiments/trace_check.py OUTDIR [model_input ...]

Writes OUTDIR/records.json (every trace record) and a few raw profiler traces, and
prints, per network and mode: the wall time per step, the plain sum of its isolated ops'
wall times, the replay from isolated ops, and the replay from its own traced breakdown.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from opcost import harness, host_probe, replay, tracing
from opcost.extract import extract_model_input
from opcost.names import ModelInput
from opcost.networks import build_model


def own_replay(rec):
    rows = rec["breakdown"]
    fwd_scale = rec["forward_host_time_s"] / rec["traced_forward_host_time_s"]
    bwd_traced = rec["traced_host_time_s"] - rec["traced_forward_host_time_s"]
    bwd_scale = (
        (rec["host_time_s"] - rec["forward_host_time_s"]) / bwd_traced if bwd_traced > 0 else 1
    )
    host = [r["host_s"] * (fwd_scale if r["phase"] == "forward" else bwd_scale) for r in rows]
    return replay.replay(
        host,
        [r["gpu_s"] for r in rows],
        [r["n_kernels"] for r in rows],
        kernel_gap_s=rec["launch_gap_s"] or 0,
        sync_s=rec["sync_s"],
        repeats=rec["wall_number_per_run"],
    )


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or [
        "resnet18_8x3x224x224",
        "vit_b_16_8x3x224x224",
        "squeezenet1_1_1x3x224x224",
        "convnext_tiny_8x3x224x224",
    ]
    facts = host_probe.host_facts("cuda")
    print(facts, flush=True)
    records = {"facts": facts, "networks": {}, "ops": {}}
    for name in names:
        mi = ModelInput.from_name(name)
        table = extract_model_input(mi)
        seq = sorted((int(p), r.op_id) for r in table.itertuples() for p in r.positions.split(","))
        spec_of = dict(zip(table.op_id, table.spec, strict=False))
        for mode in ("inference", "training"):
            opts = harness.HarnessOptions(mode=mode, device="cuda")
            t0 = time.time()
            net = build_model(mi.model)
            wl = harness.prepare_network(net, mi.shape, opts)
            ann = tracing.learn_calls(wl, net)
            keep = out / f"{name}.{mode}.trace.json.gz" if mi.model == "squeezenet1_1" else None
            rec = tracing.trace_workload(wl, opts, ann, keep_trace=keep)
            rec.update(facts)
            del wl, net
            torch.cuda.empty_cache()
            ops = {}
            for oid in dict.fromkeys(o for _, o in seq):
                key = f"{oid}.{mode}"
                if key not in records["ops"]:
                    w = harness.prepare_op(json.loads(spec_of[oid]), opts)
                    keep_op = (
                        out / f"op_{oid}.{mode}.trace.json.gz" if len(records["ops"]) < 2 else None
                    )
                    records["ops"][key] = tracing.trace_workload(w, opts, keep_trace=keep_op)
                    del w
                ops[oid] = records["ops"][key]
            torch.cuda.empty_cache()
            order = [o for _, o in seq]
            if mode == "inference":
                host = [ops[o]["host_time_s"] for o in order]
                gpu = [ops[o]["gpu_time_s"] for o in order]
                nk = [ops[o]["n_kernels"] for o in order]
            else:
                host = [ops[o]["forward_host_time_s"] for o in order] + [
                    ops[o]["host_time_s"] - ops[o]["forward_host_time_s"] for o in reversed(order)
                ]
                gpu = [ops[o]["forward_gpu_time_s"] for o in order] + [
                    ops[o]["gpu_time_s"] - ops[o]["forward_gpu_time_s"] for o in reversed(order)
                ]
                nk = [ops[o]["forward_n_kernels"] for o in order] + [
                    ops[o]["n_kernels"] - ops[o]["forward_n_kernels"] for o in reversed(order)
                ]
            gaps = sorted(r["launch_gap_s"] for r in records["ops"].values() if r["launch_gap_s"])
            iso = replay.replay(
                host,
                gpu,
                nk,
                kernel_gap_s=gaps[len(gaps) // 2] if gaps else 0,
                sync_s=facts["sync_s"],
                repeats=rec["wall_number_per_run"],
            )
            own = own_replay(rec)
            plain = sum(ops[o]["wall_time_s"] for o in order)
            calls_traced = sum(
                1 for r in rec["breakdown"] if r["call"] is not None and r["phase"] == "forward"
            )
            matched = sum(
                1
                for r in rec["breakdown"]
                if r["phase"] == "forward"
                and r["call"] is not None
                and r["call"] < len(order)
                and r["op_id"] == order[r["call"]]
            )
            wall = rec["wall_time_s"]
            print(
                f"{name} {mode}: wall {wall * 1e3:.3f} ms host {rec['host_time_s'] * 1e3:.3f} "
                f"gpu {rec['gpu_time_s'] * 1e3:.3f} | plain {plain / wall - 1:+.1%} "
                f"iso {iso.time_s / wall - 1:+.1%} ({iso.bound}) "
                f"own {own.time_s / wall - 1:+.1%} ({own.bound}) | calls {calls_traced}/"
                f"{len(order)} matched {matched} gap {rec['launch_gap_s']} "
                f"[{time.time() - t0:.0f}s]",
                flush=True,
            )
            records["networks"][f"{name}.{mode}"] = rec
    (out / "records.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
