"""Which maps let cuDNN run a dense 3x3 convolution faster than its direct FLOP count?

    python experiments/conv_maps.py [--channels 128 256 512] [--maps 14 15 27 28 29 55 56 57]

Each dense 3x3 stride-1 convolution of ``C`` to ``C`` channels (padding 1, batch 64) on
each square map, in inference, measured the op space's way
(:func:`opcost.opspace_measure.measure_one`) with TF32 off and on, on this host's GPU.
Prints its GPU kernel time and the rate of its direct FLOP count (TFLOPS): above the
FP32 units' peak (67 TFLOPS on an H100) with TF32 off, cuDNN ran a fast algorithm
(Winograd, FFT) that does fewer multiplications. The networks' convolutions, on even maps
of 14-56, run so (docs/results.md, "Ops held out of training"); the op space samples mostly others.
"""

import argparse

import torch

from opcost import harness
from opcost import opspace_measure as om
from opcost import spec as specs

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--channels", type=int, nargs="+", default=[128, 256, 512])
parser.add_argument("--maps", type=int, nargs="+", default=[14, 15, 27, 28, 29, 55, 56, 57])
parser.add_argument("--batch", type=int, default=64)
args = parser.parse_args()

print(f"{torch.cuda.get_device_name()}; dense 3x3 stride 1, batch {args.batch}, inference")
print("channels  map  tf32  kernel_ms  tflops_direct")
for c in args.channels:
    for hw in args.maps:
        with torch.device("meta"):
            conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
            x = torch.empty(args.batch, c, hw, hw)
            out = conv(x)
        spec = specs.make_spec(
            "module",
            specs.qualified_name(type(conv)),
            (x,),
            {},
            out,
            attrs=specs.module_attrs(conv),
        )
        flops = 2.0 * args.batch * c * c * 9 * hw * hw
        for tf32 in (False, True):
            opts = harness.HarnessOptions(mode="inference", device="cuda", tf32=tf32)
            harness.configure_numerics(opts)
            row = om.measure_one(spec, opts)
            t = row.get("gpu_time_s")
            rate = f"{flops / t / 1e12:13.1f}" if t else "          n/a"
            ms = f"{1e3 * t:9.3f}" if t else "      n/a"
            print(f"{c:8d} {hw:4d} {str(tf32):>5} {ms}  {rate}", flush=True)
