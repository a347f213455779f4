"""Why the sum of a network's operations overestimates the network (inference, one GPU).

For each model-input set, every distinct operation (rebuilt from its extracted spec, as
the profiling jobs do) and the whole network are timed three ways, per call:

- ``eager_s``: N calls then a synchronisation, wall time / N: what the harness measures;
- ``cpu_s``: the same N calls, wall time until the last call *returns* (before the
  synchronisation): the CPU's cost of issuing the call (Python, dispatch, launch). N is
  small enough that the launch queue never fills, so the CPU never waits for the GPU;
- ``gpu_s``: the call captured once in a CUDA graph, replayed N times: the GPU's own
  time, without the CPU's launch cost.

Then per network: the sum over its op calls (times each op's count) of each, against the
network's own three. An op alone costs ``eager ~ max(cpu, gpu)``: the GPU idles while
the CPU issues the next call whenever the kernel is shorter. In the network the CPU
issues ahead while long kernels run, so short and long ops overlap: ``network eager ~
max(sum cpu, sum gpu)``, less than ``sum max(cpu, gpu)``. If so, the overestimate is
``sum eager / network eager - 1`` and the two-part estimate ``max(sum cpu, sum gpu)``
lands close to the network.

``--block-size 0`` cycles through a block of instances as the profiling jobs do
(automatic size); ``--nvsmi`` runs two nvidia-smi loggers at 20 ms during the probe, as a
profiling job does (its measurement log and the whole-job log).

Usage (on a GPU host): python experiments/sum_gap.py [--sizes 4x3x64x64 32x3x224x224]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time

import torch

from opcost import harness
from opcost.extract import extract_model_input
from opcost.names import ModelInput
from opcost.networks import build_model

N_CALLS = 64  # under the launch queue's depth (1024 kernels) for ops of a few kernels
REPEATS = 5


def _sync() -> None:
    torch.cuda.synchronize()


def time_call(step, *, graph: bool) -> dict[str, float]:
    """Median per-call times of ``step`` over REPEATS rounds of N_CALLS calls."""
    for _ in range(5):
        step()
    _sync()
    eager, cpu = [], []
    for _ in range(REPEATS):
        _sync()
        t0 = time.perf_counter()
        for _ in range(N_CALLS):
            step()
        t1 = time.perf_counter()
        _sync()
        t2 = time.perf_counter()
        cpu.append((t1 - t0) / N_CALLS)
        eager.append((t2 - t0) / N_CALLS)
    gpu_s = math.nan
    if graph:
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            for _ in range(3):
                g.replay()
            _sync()
            rounds = []
            for _ in range(REPEATS):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(N_CALLS):
                    g.replay()
                end.record()
                _sync()
                rounds.append(start.elapsed_time(end) / 1000 / N_CALLS)
            gpu_s = sorted(rounds)[len(rounds) // 2]
        except Exception as e:  # an op that cannot be captured: reported, not fatal
            print(f"  (no graph: {type(e).__name__}: {str(e)[:80]})", file=sys.stderr)
    return {
        "eager_s": sorted(eager)[len(eager) // 2],
        "cpu_s": sorted(cpu)[len(cpu) // 2],
        "gpu_s": gpu_s,
    }


def probe(model: str, shape: tuple[int, ...], block_size: int = 1) -> dict:
    mi = ModelInput(model, shape)
    ops = extract_model_input(mi)
    opts = harness.HarnessOptions(mode="inference", device="cuda", block_size=block_size)
    harness.configure_numerics(opts)
    sums = {"eager_s": 0.0, "cpu_s": 0.0, "gpu_s": 0.0, "max_cpu_gpu_s": 0.0}
    no_graph = 0
    for row in ops.itertuples():
        wl = harness.prepare_op(json.loads(row.spec), opts)
        with wl.context():
            t = time_call(wl.step, graph=True)
        if math.isnan(t["gpu_s"]):
            no_graph += 1
            t["gpu_s"] = t["eager_s"]  # an upper bound: keeps the sum comparable
        sums["eager_s"] += row.count * t["eager_s"]
        sums["cpu_s"] += row.count * t["cpu_s"]
        sums["gpu_s"] += row.count * t["gpu_s"]
        sums["max_cpu_gpu_s"] += row.count * max(t["cpu_s"], t["gpu_s"])
        del wl
    net = build_model(model)
    wl = harness.prepare_network(net, shape, opts)
    with wl.context():
        t_net = time_call(wl.step, graph=True)
    two_part_s = max(sums["cpu_s"], sums["gpu_s"])
    return {
        "model_input": mi.name,
        "block_size": block_size,
        "ops": len(ops),
        "calls": int(ops["count"].sum()),
        "no_graph": no_graph,
        "net_eager_ms": 1e3 * t_net["eager_s"],
        "net_cpu_ms": 1e3 * t_net["cpu_s"],
        "net_gpu_ms": 1e3 * t_net["gpu_s"],
        "sum_eager_ms": 1e3 * sums["eager_s"],
        "sum_cpu_ms": 1e3 * sums["cpu_s"],
        "sum_gpu_ms": 1e3 * sums["gpu_s"],
        "sum_eager_over_net_pct": 100 * (sums["eager_s"] / t_net["eager_s"] - 1),
        "two_part_over_net_pct": 100 * (two_part_s / t_net["eager_s"] - 1),
        "sum_gpu_over_net_gpu_pct": 100 * (sums["gpu_s"] / t_net["gpu_s"] - 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v3_small", "vgg11"])
    parser.add_argument("--sizes", nargs="+", default=["4x3x64x64", "32x3x224x224"])
    parser.add_argument("--block-size", type=int, default=1, help="0: automatic, as profiling")
    parser.add_argument("--nvsmi", action="store_true", help="two nvidia-smi loggers at 20 ms")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, inference, TF32 on")
    print(f"# block size {args.block_size or 'automatic'}, nvidia-smi loggers: {args.nvsmi}")
    loggers = []
    if args.nvsmi:
        query = "timestamp,power.draw,clocks.sm,utilization.gpu"
        for _ in range(2):
            cmd = ["nvidia-smi", f"--query-gpu={query}", "--format=csv", "-lms", "20"]
            loggers.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
    rows = []
    for size in args.sizes:
        shape = tuple(int(x) for x in size.split("x"))
        for model in args.models:
            row = probe(model, shape, args.block_size)
            rows.append(row)
            print(
                json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
            )
            sys.stdout.flush()
    for logger in loggers:
        logger.terminate()
        logger.wait()


if __name__ == "__main__":
    main()
