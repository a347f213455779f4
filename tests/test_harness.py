"""The measurement harness and the profiling job, on the CPU.

What a job does when an op runs out of memory, cannot run, or the job is killed is tested
in tests/test_faults.py.
"""

import gc
import json

import pytest
import torch

from opcost import harness, profile
from opcost.config import GpuConfig
from opcost.extract import extract_model_input
from opcost.names import ModelInput, parse_setting
from opcost.record_schema import GPU_ONLY_FIELDS, RECORD_FIELDS

CONV_SPEC = {
    "kind": "module",
    "type": "torch.nn.modules.conv.Conv2d",
    "attrs": {
        "in_channels": 8,
        "out_channels": 8,
        "kernel_size": [3, 3],
        "stride": [1, 1],
        "padding": [1, 1],
        "dilation": [1, 1],
        "groups": 1,
        "bias": True,
        "padding_mode": "zeros",
    },
    "args": [{"__tensor__": 0}],
    "kwargs": {},
    "inputs": [{"shape": [2, 8, 16, 16], "dtype": "float32", "param": False}],
    "outputs": [{"shape": [2, 8, 16, 16], "dtype": "float32"}],
}
RELU_INPLACE_SPEC = {
    "kind": "module",
    "type": "torch.nn.modules.activation.ReLU",
    "attrs": {"inplace": True},
    "args": [{"__tensor__": 0}],
    "kwargs": {},
    "inputs": [{"shape": [2, 8], "dtype": "float32", "param": False}],
    "outputs": [{"shape": [2, 8], "dtype": "float32"}],
}
ADD_SPEC = {
    "kind": "function",
    "type": "torch.Tensor.add_",
    "args": [{"__tensor__": 0}, {"__tensor__": 1}],
    "kwargs": {},
    "inputs": [
        {"shape": [2, 8], "dtype": "float32", "param": False},
        {"shape": [2, 8], "dtype": "float32", "param": False},
    ],
    "outputs": [{"shape": [2, 8], "dtype": "float32"}],
}
FAST = {"min_run_time_s": 0.05, "warmup_s": 0.01}
CPU = GpuConfig("cpu", "cpu", True, "float32", (parse_setting("default"),), None, None)


def opts(mode, **kw):
    return harness.HarnessOptions(mode=mode, device="cpu", **{**FAST, **kw})


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_measure_runs_at_least_the_minimum_time(mode):
    o = opts(mode)
    t = harness.measure(harness.prepare_op(CONV_SPEC, o), o)
    assert t.total_time_s >= o.min_run_time_s
    assert t.iterations == len(t.block_times_s) * t.number_per_run > 0
    assert t.timed_end_unix_s - t.timed_start_unix_s >= t.total_time_s * 0.99
    assert t.warmup_iterations >= harness.MIN_WARMUP_ITERATIONS
    assert t.backward is (mode == "training")


def test_training_runs_backward_and_keeps_parameter_gradients():
    o = opts("training", block_size=3)
    w = harness.prepare_op(CONV_SPEC, o)
    rebuilt, input_sets = w.keep
    t = harness.measure(w, o)
    for r in rebuilt:
        assert r.module.training
        assert r.module.weight.grad is not None
        assert r.module.weight.grad.abs().sum() > 0
    # Input gradients are reset every iteration, not accumulated.
    assert all(s[0].grad is None for s in input_sets)
    assert t.backward


def test_training_chains_calls_into_one_backward_pass():
    # A parameter-free op: one instance, a chain of TRAINING_CHAIN_CALLS calls, each on
    # an input of its own; one backward pass (one engine run) per chain.
    o = opts("training")
    w = harness.prepare_op(RELU_INPLACE_SPEC, o)
    rebuilt, input_sets = w.keep
    chain = harness.TRAINING_CHAIN_CALLS
    assert len(rebuilt) == 1
    assert len(input_sets) == chain
    assert len({id(s[0]) for s in input_sets}) == chain
    backward_runs, forward_calls = [0], [0]
    rebuilt[0].module.register_forward_hook(
        lambda *a: forward_calls.__setitem__(0, forward_calls[0] + 1)
    )
    # A hook on the output's gradient function would run once per call; count engine
    # runs by a tensor hook on the first input of every chain position instead.
    for s in input_sets:
        s[0].register_hook(lambda g: backward_runs.__setitem__(0, backward_runs[0] + 1))
    t = harness.measure(w, o)
    assert t.calls_per_backward == chain
    assert t.number_per_run % chain == 0
    assert forward_calls[0] == t.iterations + t.warmup_iterations
    # Every call's input got its gradient, and every chain ran one backward pass.
    assert backward_runs[0] == forward_calls[0]
    assert all(s[0].grad is None for s in input_sets)


def test_training_chain_gives_each_call_its_own_instance():
    # A module with parameters: the block has at least a chain's instances, and each
    # instance's weight gradient is its own calls' sum, never two calls of one chain.
    o = opts("training", max_block_size=64)
    w = harness.prepare_op(CONV_SPEC, o)
    rebuilt = w.keep[0]
    assert len(rebuilt) >= harness.TRAINING_CHAIN_CALLS
    per_instance = [0] * len(rebuilt)
    for i, r in enumerate(rebuilt):
        r.module.register_forward_hook(
            lambda *a, i=i: per_instance.__setitem__(i, per_instance[i] + 1)
        )
    t = harness.measure(w, o)
    chain = t.calls_per_backward
    assert chain == harness.TRAINING_CHAIN_CALLS
    assert sum(per_instance) == t.iterations + t.warmup_iterations
    # Cycling chain by chain through the block: counts differ by at most one.
    assert max(per_instance) - min(per_instance) <= 1


def test_training_chain_holds_no_more_inputs_than_allowed(monkeypatch):
    # RELU_INPLACE_SPEC's input: 2 x 8 float32 = 64 bytes; room for 4 of them.
    monkeypatch.setattr(harness, "CHAIN_INPUT_BYTES", 4 * 64 + 10)
    o = opts("training")
    w = harness.prepare_op(RELU_INPLACE_SPEC, o)
    assert len(w.keep[1]) == 4
    assert harness.measure(w, o).calls_per_backward == 4
    # An input larger than the whole allowance still gets a chain of one.
    monkeypatch.setattr(harness, "CHAIN_INPUT_BYTES", 10)
    assert harness.measure(harness.prepare_op(RELU_INPLACE_SPEC, o), o).calls_per_backward == 1


def test_training_chain_is_no_longer_than_the_block():
    o = opts("training", block_size=3)
    t = harness.measure(harness.prepare_op(CONV_SPEC, o), o)
    assert t.calls_per_backward == 3
    assert t.number_per_run % 3 == 0


def test_inference_runs_in_eval_mode_without_gradients():
    o = opts("inference", block_size=2)
    w = harness.prepare_op(CONV_SPEC, o)
    harness.measure(w, o)
    for r in w.keep[0]:
        assert not r.module.training
        assert r.module.weight.grad is None


#: LayerNorm over the last dimension of a permuted tensor, as in convnext's blocks: a
#: (2, 6, 6, 8) view of a contiguous (2, 8, 6, 6) tensor.
PERMUTED_NORM_SPEC = {
    "kind": "module",
    "type": "torch.nn.modules.normalization.LayerNorm",
    "attrs": {"normalized_shape": [8], "eps": 1e-6, "elementwise_affine": True, "bias": True},
    "args": [{"__tensor__": 0}],
    "kwargs": {},
    "inputs": [
        {"shape": [2, 6, 6, 8], "dtype": "float32", "param": False, "stride": [288, 6, 1, 36]}
    ],
    "outputs": [{"shape": [2, 6, 6, 8], "dtype": "float32"}],
}


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_inputs_have_the_recorded_strides(mode):
    o = opts(mode)
    w = harness.prepare_op(PERMUTED_NORM_SPEC, o)
    _, input_sets = w.keep
    for inputs in input_sets:
        (x,) = inputs
        assert (list(x.shape), list(x.stride())) == ([2, 6, 6, 8], [288, 6, 1, 36])
        assert x.is_leaf
        assert x.requires_grad == (mode == "training")
    grads = []
    if mode == "training":
        input_sets[0][0].register_hook(lambda g: grads.append(g.shape))
    t = harness.measure(w, o)
    assert t.iterations > 0
    # Training: the backward pass reaches the strided input.
    assert t.backward == bool(grads) == (mode == "training")


def test_self_attention_is_measured_on_pytorchs_self_attention_path():
    """vit_b_16's attention spec (query, key and value one tensor): in inference the
    measured calls run PyTorch's fused self-attention, as the network does."""
    from torch.profiler import profile as torch_profile

    table = extract_model_input(ModelInput("vit_b_16", (1, 3, 224, 224)))
    (spec,) = [json.loads(s) for s in table["spec"] if "MultiheadAttention" in s]
    o = opts("inference")
    w = harness.prepare_op(spec, o)
    with torch_profile() as prof:
        harness.measure(w, o)
    names = {e.name for e in prof.events()}
    assert "aten::_native_multi_head_attention" in names


def test_block_cycles_through_distinct_instances():
    o = opts("inference", block_size=4)
    w = harness.prepare_op(CONV_SPEC, o)
    rebuilt = w.keep[0]
    calls = [0] * len(rebuilt)
    for i, r in enumerate(rebuilt):
        r.module.register_forward_hook(lambda *a, i=i: calls.__setitem__(i, calls[i] + 1))
    t = harness.measure(w, o)
    assert len({id(r.module) for r in rebuilt}) == 4
    assert not torch.equal(rebuilt[0].module.weight, rebuilt[1].module.weight)
    # Cycling: every instance ran, and no instance ran more than once more than another.
    assert min(calls) > 0
    assert max(calls) - min(calls) <= 1
    assert sum(calls) == t.iterations + t.warmup_iterations


def test_auto_block_size_exceeds_the_cache():
    # 1 MiB of parameters, 32 MiB cache: 33 instances hold more than the cache.
    assert harness.auto_block_size(2**20, 32 * 2**20, 64) == 33
    assert harness.auto_block_size(2**20, 32 * 2**20, 16) == 16
    assert harness.auto_block_size(0, 32 * 2**20, 64) == 1  # no weights: one instance


#: DenseNet's and Inception's ``F.relu(x, inplace=True)``: in place by its keyword.
F_RELU_INPLACE_SPEC = {
    **RELU_INPLACE_SPEC,
    "kind": "function",
    "type": "torch.nn.functional.relu",
    "attrs": {},
    "kwargs": {"inplace": True},
}


def test_inplace_ops_train_out_of_place():
    for spec in (RELU_INPLACE_SPEC, ADD_SPEC, F_RELU_INPLACE_SPEC):
        o = opts("training")
        t = harness.measure(harness.prepare_op(spec, o), o)
        assert t.inplace_substituted
        assert t.backward


def test_network_workload_both_modes():
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    for mode in ("inference", "training"):
        o = opts(mode)
        t = harness.measure(harness.prepare_network(net, (8, 16), o), o)
        assert t.iterations > 0
    assert net[0].weight.grad is not None


def _small_vit():
    from torchvision.models.vision_transformer import VisionTransformer

    # vit_b_16's architecture and initialisation (a head of zeros), at a size a CPU runs.
    torch.manual_seed(0)
    return VisionTransformer(
        image_size=32, patch_size=16, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32
    )


def _first_layer_gradient(net, workload):
    workload.step()
    return net.conv_proj.weight.grad


def test_a_network_at_initialisation_stops_its_own_backward_pass():
    # Why the harness steps off the initialisation: with the head of zeros, nothing
    # behind it gets a gradient, so a backward pass multiplies zeros.
    net = _small_vit()
    x = torch.randn(2, 3, 32, 32, requires_grad=True)
    net(x).backward(torch.randn(2, 1000))
    assert torch.count_nonzero(net.conv_proj.weight.grad) == 0
    assert torch.count_nonzero(x.grad) == 0


def test_a_network_in_training_is_measured_off_its_initialisation():
    net = _small_vit()
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    workload = harness.prepare_network(net, (2, 3, 32, 32), opts("training"))
    grad = _first_layer_gradient(net, workload)
    # Every weight of the first layer now gets a gradient ...
    assert torch.count_nonzero(grad) == grad.numel()
    # ... because the head left zero, by one step of LEAVE_INIT_STEP against the sign of
    # its gradient; no parameter moved further.
    head = net.heads.head.weight.detach()
    assert torch.count_nonzero(head) > 0.9 * head.numel()
    moved = head[head != 0].abs()
    assert torch.allclose(moved, torch.full_like(moved, harness.LEAVE_INIT_STEP))
    for name, p in net.named_parameters():
        moved = (p.detach() - before[name]).abs().max().item()
        assert moved <= harness.LEAVE_INIT_STEP * (1 + 1e-6), name


def test_a_network_in_inference_keeps_its_initialisation():
    net = _small_vit()
    harness.prepare_network(net, (2, 3, 32, 32), opts("inference"))
    assert torch.count_nonzero(net.heads.head.weight) == 0


def _job(tmp_path, spec=CONV_SPEC, mode="inference", **kw):
    return profile.profile_job(
        kind="op",
        gpu=CPU,
        setting=parse_setting("default"),
        mode=mode,
        profile_config=FAST,
        csv_path=tmp_path / "op.csv",
        json_path=tmp_path / "op.json",
        spec=spec,
        op_id="0123456789abcdef",
        **kw,
    )


#: The record's fields (docs/formats.md is generated from the same declaration).
DOCUMENTED_KEYS = set(RECORD_FIELDS) - set(GPU_ONLY_FIELDS)


def test_job_json_has_every_documented_field(tmp_path):
    record = _job(tmp_path, mode="training")
    on_disk = json.loads((tmp_path / "op.json").read_text())
    assert on_disk == json.loads(json.dumps(record))
    assert set(on_disk) == DOCUMENTED_KEYS  # every field declared, nothing undeclared
    assert on_disk["status"] == "ok"
    assert on_disk["power_available"] is False
    assert on_disk["iterations"] == len(on_disk["block_times_s"]) * on_disk["number_per_run"]
    assert on_disk["total_time_s"] == pytest.approx(sum(on_disk["block_times_s"]))
    # A CPU measurement's CSV says why there is no power log.
    assert (tmp_path / "op.csv").read_text().startswith("# no power log")
    # Nothing temporary is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["op.csv", "op.json"]


def test_whole_network_job(tmp_path):
    record = profile.profile_job(
        kind="network",
        gpu=CPU,
        setting=parse_setting("default"),
        mode="training",
        profile_config=FAST,
        csv_path=tmp_path / "n.csv",
        json_path=tmp_path / "n.json",
        model_input=ModelInput("toymodels.nets:tiny_mlp", (8, 16)),
    )
    assert record["status"] == "ok"
    assert record["model_input"] == "toymodels.nets.tiny_mlp_8x16"
    assert record["backward"] is True


def test_every_op_of_a_network_profiles_in_both_modes(tmp_path):
    table = extract_model_input(ModelInput("resnet18", (2, 3, 32, 32)))
    for i, spec in enumerate(table["spec"]):
        for mode in ("inference", "training"):
            o = opts(mode, min_run_time_s=0.002, warmup_s=0.0, max_block_size=2)
            t = harness.measure(harness.prepare_op(json.loads(spec), o), o)
            assert t.iterations > 0, (i, mode)


def _gc_probe_workload(seen, fail_after=None):
    calls = [0]

    def step():
        seen.append(gc.isenabled())
        calls[0] += 1
        if fail_after is not None and calls[0] > fail_after:
            raise RuntimeError("step failed on purpose")

    return harness.Workload(step, 1, False, False)


def test_cyclic_gc_is_off_for_every_measured_iteration_and_back_on_after():
    # A gen-2 collection in Snakemake's process stalled blocks by tens of ms on the H100.
    assert gc.isenabled()
    seen = []
    harness.measure(_gc_probe_workload(seen), opts("inference", min_run_time_s=0.02))
    assert len(seen) > 3
    assert not any(seen)
    assert gc.isenabled()


def test_gc_is_restored_after_a_failing_step_and_left_off_if_it_was_off():
    seen = []
    with pytest.raises(RuntimeError, match="on purpose"):
        harness.measure(_gc_probe_workload(seen, fail_after=5), opts("inference"))
    assert gc.isenabled()
    gc.disable()
    try:
        harness.measure(_gc_probe_workload([]), opts("inference", min_run_time_s=0.02))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_profile_options_default_to_the_config_schema(monkeypatch):
    """A key missing from the profile section takes the schema's default, not a literal."""
    import copy

    import opcost.config

    schema = copy.deepcopy(opcost.config.load_schema())
    section = schema["properties"]["profile"]["properties"]
    section["min_run_time_s"]["default"] = 0.125
    section["max_block_size"]["default"] = 7
    monkeypatch.setattr(opcost.config, "load_schema", lambda *a, **k: schema)
    profile.profile_defaults.cache_clear()
    try:
        opts = profile.options_for(CPU, "inference", {"warmup_s": 0.5})
    finally:
        profile.profile_defaults.cache_clear()
    assert (opts.min_run_time_s, opts.max_block_size, opts.warmup_s) == (0.125, 7, 0.5)
    assert opts.block_size == section["block_size"]["default"]


def test_the_configurations_cudnn_benchmark_reaches_pytorch_and_the_record():
    """cudnn_benchmark is set as the GPU configuration says, for every measurement of it
    (configure_numerics runs before each), and recorded; TF32 stays as configured."""
    import dataclasses

    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32
    try:
        for on in (True, False):
            gpu = dataclasses.replace(CPU, cudnn_benchmark=on, tf32=not on)
            opts = profile.options_for(gpu, "training", {})
            harness.configure_numerics(opts)
            assert torch.backends.cudnn.benchmark is on
            assert torch.backends.cudnn.allow_tf32 is (not on)
            header = profile.record_header("op", gpu.name, "default", opts, 1)
            assert (header["cudnn_benchmark"], header["tf32"]) == (on, not on)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved
