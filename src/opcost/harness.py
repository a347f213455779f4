"""The measurement harness: time one operation (or a whole network) in one mode.

Builds the workload (:func:`prepare_op`, :func:`prepare_network`: a block of instances with
random weights, inference or training with a chain of calls per backward pass) and times
it (:func:`measure`: warm-up, then timed blocks until ``min_run_time_s``, reading the
energy counter at the edges of the timed region)::

    opts = HarnessOptions(mode="training", device="cuda")
    timing = measure(prepare_op(spec, opts), opts, read_mj)

The algorithm (thesis 3.2) and why each step is as it is: docs/method.md, "Measuring".
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from opcost import spec as specs
from opcost.errors import OpcostError

#: L2 size assumed for the block size where the device does not report one (CPU), bytes.
DEFAULT_CACHE_BYTES = 32 * 2**20
#: Timed blocks per measurement the loop aims for (more blocks, a better sigma).
TARGET_BLOCKS = 20
MIN_WARMUP_ITERATIONS = 3
#: Calls per backward pass in training (see the module docstring).
TRAINING_CHAIN_CALLS = 16
#: Parameters a training block may hold to give each call of a chain its own instance.
CHAIN_PARAM_BYTES = 2**30
#: How far every parameter of a network moves, against its gradient's sign, before the
#: network is measured in training (see the module docstring).
LEAVE_INIT_STEP = 1e-3
#: Inputs a training chain may hold (one set per call). A chain matters for short,
#: launch-bound calls, whose inputs are small; an op with large inputs runs long enough
#: for the engine's start not to count, and gets a shorter chain (at least 1).
CHAIN_INPUT_BYTES = 2**30


class OpCannotRun(OpcostError, RuntimeError):
    """The operation cannot run here (out of memory, unsupported): recorded as failed."""


@dataclass(frozen=True)
class HarnessOptions:
    """How to measure. Units in the names; ``block_size`` 0 means automatic."""

    mode: str = "inference"
    device: str = "cpu"
    dtype: str = "float32"
    tf32: bool = True
    cudnn_benchmark: bool = False
    min_run_time_s: float = 1.0
    warmup_s: float = 0.2
    block_size: int = 0
    max_block_size: int = 64


@dataclass(frozen=True)
class Timing:
    """Raw result of one measurement: the blocks' durations and the timed window."""

    block_size: int
    warmup_iterations: int
    number_per_run: int
    block_times_s: tuple[float, ...]
    timed_start_unix_s: float
    timed_end_unix_s: float
    energy_counter_start_mj: int | None = None
    energy_counter_end_mj: int | None = None
    peak_memory_bytes: int | None = None
    backward: bool = False
    inplace_substituted: bool = False
    calls_per_backward: int = 1

    @property
    def iterations(self) -> int:
        return len(self.block_times_s) * self.number_per_run

    @property
    def total_time_s(self) -> float:
        return math.fsum(self.block_times_s)

    @property
    def sigma_total_time_s(self) -> float:
        """sigma of t_tot: N times the sample std of the per-iteration time over blocks."""
        if len(self.block_times_s) < 2:
            return 0.0
        per_iter = [b / self.number_per_run for b in self.block_times_s]
        return self.iterations * statistics.stdev(per_iter)


@dataclass
class Workload:
    """One iteration of the measured work, cycling through a block of instances."""

    step: Callable[[], None]
    block_size: int
    backward: bool
    inplace_substituted: bool
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    keep: list[Any] = field(default_factory=list)  # objects that must outlive the loop
    calls_per_step: int = 1  # op calls per step(): a training chain's length
    #: Training only: ``step()`` is ``backward_pass(forward_pass())``, so a trace can
    #: split a step's host and GPU time between the two passes (opcost.tracing).
    forward_pass: Callable[[], Any] | None = None
    backward_pass: Callable[[Any], None] | None = None


def auto_block_size(param_bytes: int, cache_bytes: int, max_block_size: int) -> int:
    """Instances needed for the block's parameters to exceed the cache."""
    if param_bytes <= 0:
        return 1
    return max(1, min(max_block_size, cache_bytes // param_bytes + 1))


def cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or DEFAULT_CACHE_BYTES
    return DEFAULT_CACHE_BYTES


def configure_numerics(opts: HarnessOptions) -> None:
    """TF32 for float32 matmul and cuDNN convolutions, and whether cuDNN times its
    convolution algorithms (``cudnn_benchmark``), as the GPU configuration says. PyTorch
    keeps the algorithm chosen for a shape for the process's life, whatever the setting
    it was chosen under: one process measures one setting."""
    torch.backends.cuda.matmul.allow_tf32 = opts.tf32
    torch.backends.cudnn.allow_tf32 = opts.tf32
    torch.backends.cudnn.benchmark = opts.cudnn_benchmark


def _forward_step(
    calls: list[Callable[[list[torch.Tensor]], Any]], inputs: list[torch.Tensor]
) -> Callable[[], None]:
    """One call per step on ``inputs``, cycling through ``calls``."""
    counter = [0]
    n = len(calls)

    def step() -> None:
        i = counter[0]
        counter[0] = i + 1 if i + 1 < n else 0
        calls[i](inputs)

    return step


Phases = tuple[Callable[[], Any], Callable[[Any], None]] | None


def _make_step(
    calls: list[Callable[[list[torch.Tensor]], Any]],
    input_sets: list[list[torch.Tensor]],
    training: bool,
) -> tuple[Callable[[], None], bool, int, Phases]:
    """The per-step function, whether it runs backward, how many calls a step makes, and
    (training with a backward pass) the step's forward and backward pass apart.

    Inference: one call per step, cycling through ``calls`` on ``input_sets[0]``.
    Training: a chain of ``len(input_sets)`` calls, call k on ``input_sets[k]``, then one
    backward pass over their outputs (or no backward, if no output needs a gradient: a
    chain of one call then).
    """
    if not training:
        return _forward_step(calls, input_sets[0]), False, 1, None
    # One call to learn which outputs carry a gradient, and to shape the random gradients.
    outs = [t for t in specs.tensors_in(calls[0](input_sets[0])) if t.requires_grad]
    for t in input_sets[0]:
        t.grad = None
    if not outs:
        return _forward_step(calls, input_sets[0]), False, 1, None
    counter = [0]
    n = len(calls)
    chain = len(input_sets)
    grads = [torch.randn_like(t) for t in outs] * chain
    leaves = [t for inputs in input_sets for t in inputs if t.requires_grad]

    def forward_pass() -> list[torch.Tensor]:
        i = counter[0]
        out = []
        for k, inputs in enumerate(input_sets):
            out += [t for t in specs.tensors_in(calls[(i + k) % n](inputs)) if t.requires_grad]
        counter[0] = (i + chain) % n
        return out

    def backward_pass(out: list[torch.Tensor]) -> None:
        torch.autograd.backward(out, grads)
        for t in leaves:
            t.grad = None

    def step_train() -> None:
        backward_pass(forward_pass())

    return step_train, True, chain, (forward_pass, backward_pass)


def prepare_op(spec: dict[str, Any], opts: HarnessOptions) -> Workload:
    """A workload for one operation rebuilt from its spec."""
    device = torch.device(opts.device)
    dtype = specs.dtype_from_name(opts.dtype)
    training = opts.mode == "training"
    inplace_sub = training and specs.is_inplace(spec)
    try:
        first = specs.rebuild(spec, inplace_ok=not training, device=device)
    except specs.SpecError as e:
        raise OpCannotRun(f"cannot rebuild {spec['type']}: {e}") from e
    rebuilt = [first]
    chain = 1
    if training:
        input_bytes = sum(
            math.prod(i["shape"]) * specs.dtype_from_name(i["dtype"]).itemsize
            for i in spec["inputs"]
        )
        chain = max(1, min(TRAINING_CHAIN_CALLS, CHAIN_INPUT_BYTES // max(input_bytes, 1)))
    if first.module is not None:
        first.module.to(device=device, dtype=dtype)
        param_bytes = sum(p.numel() * p.element_size() for p in first.module.parameters())
        size = opts.block_size or auto_block_size(
            param_bytes, cache_bytes(device), opts.max_block_size
        )
        if training and param_bytes and not opts.block_size:
            # An instance of its own per call of a chain (a parameter used twice in one
            # backward pass would add a gradient sum a network does not have), as far
            # as CHAIN_PARAM_BYTES allows; the chain is no longer than the block.
            size = max(size, min(chain, max(1, CHAIN_PARAM_BYTES // param_bytes)))
        if param_bytes:
            chain = min(chain, size)
        for _ in range(size - 1):
            other = specs.rebuild(spec, inplace_ok=not training, device=device)
            other.module.to(device=device, dtype=dtype)
            rebuilt.append(other)
        for r in rebuilt:
            r.module.train(training)
    # Parameters used by functional ops (ViT's pos_embedding) are inputs here.
    input_sets = [
        specs.random_inputs(spec, device, dtype, requires_grad=training) for _ in range(chain)
    ]
    context = contextlib.nullcontext if training else torch.inference_mode
    with context():
        step, backward, calls_per_step, phases = _make_step(rebuilt, input_sets, training)
    return Workload(
        step,
        len(rebuilt),
        backward,
        inplace_sub,
        context,
        keep=[rebuilt, input_sets],
        calls_per_step=calls_per_step,
        forward_pass=phases[0] if phases else None,
        backward_pass=phases[1] if phases else None,
    )


def prepare_network(
    net: torch.nn.Module,
    shape: tuple[int, ...],
    opts: HarnessOptions,
    *,
    leave_init: bool = True,
) -> Workload:
    """A workload for a whole network, measured as one large operation (block of one).

    ``leave_init=False`` measures training at the network's initial values (item 5 of the
    module docstring says why the pipeline does not; ``experiments/init_power.py`` compares).
    """
    device = torch.device(opts.device)
    dtype = specs.dtype_from_name(opts.dtype)
    training = opts.mode == "training"
    net = net.to(device=device, dtype=dtype).train(training)
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=training)
    context = contextlib.nullcontext if training else torch.inference_mode
    with context():
        # A whole network is one call: one forward and backward pass per step.
        step, backward, _, phases = _make_step([lambda inputs: net(*inputs)], [[x]], training)
    if backward and leave_init:
        leave_initialisation(net, step)
    return Workload(
        step,
        1,
        backward,
        False,
        context,
        keep=[net, x],
        forward_pass=phases[0] if phases else None,
        backward_pass=phases[1] if phases else None,
    )


#: Steps run on a side stream before a CUDA graph is captured (PyTorch's advice: let
#: lazily initialised state, e.g. cuDNN's algorithm choice, settle outside the capture).
GRAPH_WARMUP_STEPS = 3


class GraphCaptureFailed(OpCannotRun):
    """The workload's step cannot be captured in a CUDA graph (an op that synchronises,
    allocates outside the graph's pool, or is not capturable)."""


def graphed(workload: Workload, device: torch.device, repeats: int = 1) -> Workload:
    """``workload`` with ``repeats`` of its steps captured once in a CUDA graph: a step is
    then one ``graph.replay()`` of ``repeats`` times the calls, its kernels launched by the
    driver without the host issuing each op (what ``torch.compile(mode="reduce-overhead")``
    builds on). A training step captures its forward and backward pass; parameters'
    gradients accumulate in place, as in eager steps. Raises :class:`GraphCaptureFailed`
    with the reason."""
    if device.type != "cuda":
        raise GraphCaptureFailed(f"CUDA graphs need a CUDA device, not {device.type}")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream(device)
    try:
        with workload.context(), _no_cyclic_gc():
            _sync(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(GRAPH_WARMUP_STEPS):
                    workload.step()
            torch.cuda.current_stream(device).wait_stream(side)
            _sync(device)
            with torch.cuda.graph(graph):
                for _ in range(repeats):
                    workload.step()
            _sync(device)
    except (RuntimeError, torch.cuda.CudaError) as e:
        _sync_quietly(device)
        raise GraphCaptureFailed(f"cannot capture a CUDA graph: {e}".splitlines()[0]) from e
    return Workload(
        graph.replay,
        workload.block_size,
        workload.backward,
        workload.inplace_substituted,
        workload.context,
        keep=[graph, workload],
        calls_per_step=workload.calls_per_step * repeats,
    )


def _sync_quietly(device: torch.device) -> None:
    """Synchronise after a failed capture, whose error may surface here too."""
    with contextlib.suppress(RuntimeError):
        _sync(device)


def leave_initialisation(net: torch.nn.Module, step: Callable[[], None]) -> None:
    """One step of ``net`` away from its initial values (module docstring, item 5).

    ``step`` runs a forward and backward pass; then every parameter with a gradient moves
    by ``LEAVE_INIT_STEP`` against the sign of it, and the gradients are cleared.
    """
    step()
    with torch.no_grad():
        for p in net.parameters():
            if p.grad is not None:
                p.sub_(p.grad.sign(), alpha=LEAVE_INIT_STEP)
                p.grad = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    workload: Workload,
    opts: HarnessOptions,
    read_energy_mj: Callable[[], int | None] = lambda: None,
) -> Timing:
    """Warm up, then time blocks until ``min_run_time_s``; see the module docstring."""
    device = torch.device(opts.device)
    step = workload.step
    with workload.context(), _no_cyclic_gc():
        _sync(device)
        warm = 0
        start = time.perf_counter()
        while warm < MIN_WARMUP_ITERATIONS or time.perf_counter() - start < opts.warmup_s:
            step()
            warm += 1
            if warm >= MIN_WARMUP_ITERATIONS:
                _sync(device)
        _sync(device)
        per_step_s = max((time.perf_counter() - start) / warm, 1e-9)
        target_block_s = opts.min_run_time_s / TARGET_BLOCKS
        number = max(1, round(target_block_s / per_step_s))
        blocks: list[float] = []
        iterations = range(number)
        energy_start = read_energy_mj()
        t_start = time.time()
        while math.fsum(blocks) < opts.min_run_time_s:
            b0 = time.perf_counter()
            for _ in iterations:
                step()
            _sync(device)
            blocks.append(time.perf_counter() - b0)
        t_end = time.time()
        energy_end = read_energy_mj()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    calls = workload.calls_per_step
    return Timing(
        block_size=workload.block_size,
        warmup_iterations=warm * calls,
        number_per_run=number * calls,
        block_times_s=tuple(blocks),
        timed_start_unix_s=t_start,
        timed_end_unix_s=t_end,
        energy_counter_start_mj=energy_start,
        energy_counter_end_mj=energy_end,
        peak_memory_bytes=peak,
        backward=workload.backward,
        inplace_substituted=workload.inplace_substituted,
        calls_per_backward=calls if workload.backward else 0,
    )


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off for the measurement, as ``timeit`` does.

    A collection stops the measuring thread for as long as it takes to scan the heap, and
    in a Snakemake process that holds the DAG of a large study that is tens of
    milliseconds: a network's forward pass allocates enough objects to start one every few
    iterations, so on an H100 blocks of one resnet18 iteration took 2 to 74 ms (median
    2.6 ms, mean 15 ms). Reference counting still frees everything without cycles; what
    cyclic garbage a measurement makes waits until it ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
