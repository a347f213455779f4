"""Which aten ops' kernels a Swin training step spends its GPU time in.

    python experiments/window_attention_kernels.py [--model swin_t] [--batch 8] [--out F]

Profiles one training step (forward, backward, after three warm-up steps) of a torchvision
network with ``torch.profiler`` and prints, per aten op (the backward's included), its
calls and the GPU time of the kernels it launched, largest first; with ``--out``
writes the table as CSV. The op models predict a network from the calls extraction
records; this shows the kernels of the calls it does not (an in-place ``__setitem__``
returns nothing) and of the backward passes the op space never ran.
"""

import argparse

import torch
import torchvision
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default="swin_t")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--mode", choices=["training", "inference"], default="training")
parser.add_argument("--out")
args = parser.parse_args()

net = torchvision.models.get_model(args.model).cuda()
x = torch.randn(args.batch, 3, 224, 224, device="cuda")
training = args.mode == "training"
net.train(training)


def step():
    with torch.set_grad_enabled(training):
        out = net(x)
        if training:
            out.sum().backward()


for _ in range(3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    step()
    torch.cuda.synchronize()
rows = []
for e in prof.key_averages():
    gpu_us = getattr(e, "self_device_time_total", 0.0)
    # The ops that launched kernels (the kernels themselves are listed too: not twice).
    if gpu_us > 0 and e.device_type == DeviceType.CPU:
        rows.append((e.key, e.count, gpu_us))
rows.sort(key=lambda r: -r[2])
total = sum(r[2] for r in rows)
print(f"{args.model} batch {args.batch} {args.mode}: {total:.0f} us of kernels")
print(f"{'op':60s} {'calls':>6s} {'gpu_us':>9s} {'share':>6s}")
for key, count, us in rows[:40]:
    print(f"{key[:60]:60s} {count:6d} {us:9.1f} {us / total:6.3f}")
if args.out:
    with open(args.out, "w") as f:
        f.write("op,calls,gpu_us\n")
        f.writelines(f'"{k}",{c},{u:.2f}\n' for k, c, u in rows)
