"""Trace the Hopper studies' networks with CUDA graphs, as the pipeline's trace jobs do.

    python experiments/graph_networks.py --gpu h100 --out DIR [--budget-s 480]
                                         [--models NAME ...] [--batches 8 64]
                                         [--cudnn-benchmark]

Runs :func:`opcost.tracing.trace_job` (the job of rule ``trace_network``) for every
model-input set of ``config/hopper.yaml`` and ``config/hopper-large.yaml`` (or, with
``--models``, for these torchvision networks at ``--batches`` x 3 x 224 x 224), inference
and training, on GPU configuration ``--gpu`` of those configs (the GPU of this host),
into ``DIR/{gpu}/default/{mode}/traces/networks/{model_input}.json``: the eager figures
(host, GPU kernel and wall time, the breakdown) and the CUDA-graph ones (``graph_*``),
all from one run on one host. With ``--cudnn-benchmark``, cuDNN times its convolution
algorithms (``torch.backends.cudnn.benchmark``), as configuration ``{gpu}-cudnnbench``
(``DIR/{gpu}-cudnnbench/...``). Prints a line per job; stops starting jobs after
``--budget-s`` seconds. ``bench/graph_replay.py`` compares the result with the replay.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from opcost import tracing
from opcost.config import GpuConfig
from opcost.names import ModelInput, parse_setting
from opcost.profile import profile_defaults

REPO = Path(__file__).resolve().parents[1]
STUDIES = ("config/hopper.yaml", "config/hopper-large.yaml")


def model_inputs(
    models: list[str] | None = None, batches: tuple[int, ...] = ()
) -> list[ModelInput]:
    if models:
        return [ModelInput(m, (b, 3, 224, 224)) for m in models for b in batches]
    out = []
    for study in STUDIES:
        for entry in yaml.safe_load((REPO / study).read_text())["models"]:
            out += [ModelInput(entry["model"], tuple(shape)) for shape in entry["inputs"]]
    return out


def gpu_config(name: str, cudnn_benchmark: bool = False) -> GpuConfig:
    g = yaml.safe_load((REPO / STUDIES[0]).read_text())["gpus"][name]
    return GpuConfig(
        f"{name}-cudnnbench" if cudnn_benchmark else name,
        g["device"],
        g["tf32"],
        g["dtype"],
        (parse_setting("default"),),
        None,
        None,
        cudnn_benchmark=cudnn_benchmark,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--models", nargs="*", help="torchvision networks instead of the studies'")
    parser.add_argument("--batches", nargs="*", type=int, default=[8, 64])
    parser.add_argument("--cudnn-benchmark", action="store_true")
    args = parser.parse_args()
    gpu = gpu_config(args.gpu, args.cudnn_benchmark)
    start = time.time()
    for mi in model_inputs(args.models, tuple(args.batches)):
        for mode in ("inference", "training"):
            if time.time() - start > args.budget_s:
                print(f"budget spent: {mi.name} {mode} and later not traced", flush=True)
                return
            path = args.out / gpu.name / "default" / mode / "traces" / "networks"
            path.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            r = tracing.trace_job(
                kind="network",
                gpu=gpu,
                setting=gpu.settings[0],
                mode=mode,
                profile_config=dict(profile_defaults()),
                json_path=path / f"{mi.name}.json",
                model_input=mi,
            )
            keys = ("wall_time_s", "gpu_time_s", "graph_time_s", "graph_gpu_time_s")
            figures = " ".join(
                f"{k}={r[k] * 1e3:.3f}ms" for k in keys if isinstance(r.get(k), float)
            )
            extra = {k: r.get(k) for k in ("graph_n_kernels", "graph_launch_gap_s")}
            print(
                f"{mi.name} {mode} {r['status']} {r.get('graph_status')} {figures} "
                f"{json.dumps(extra)} {r.get('graph_failure_reason') or ''} "
                f"({time.time() - t0:.1f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
