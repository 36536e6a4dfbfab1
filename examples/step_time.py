"""Time DDP training steps three ways: the "inagg" process group, gloo with inagg's comm hook, plain gloo.

Run on CPU processes with torchrun, one way per run::

    torchrun --nproc-per-node 2 examples/step_time.py --way backend --width 500
    torchrun --nproc-per-node 2 examples/step_time.py --way hook --width 500
    torchrun --nproc-per-node 2 examples/step_time.py --way gloo --width 500

The model is ``Linear(width, width)``, tanh, ``Linear(width, 1)``: about
``width**2`` parameters (500: 0.25 M, 5000: 25 M). Each step is forward,
backward (DDP's all-reduce included) and an SGD step; after one step of
warm-up rank 0 prints one JSON line with the median and every step time.
``bench/scaleout.py`` runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from inagg.host.torch import exit_process


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--way", choices=("backend", "hook", "gloo"), required=True)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--steps", type=int, default=5, help="timed steps, after one of warm-up (default 5)")
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args(argv)
    if args.way == "backend":
        import inagg.host.torch_backend  # noqa: F401  (registers "inagg")
    dist.init_process_group("inagg" if args.way == "backend" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.Tanh(), nn.Linear(args.width, 1))
    ddp = DDP(model)
    state = None
    if args.way == "hook":
        from inagg.host.torch import allreduce_hook, group_from_process_group

        state = group_from_process_group()
        ddp.register_comm_hook(state, allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    times = []
    for _ in range(args.steps + 1):
        x = torch.randn(args.batch, args.width, generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"way": args.way, "world_size": dist.get_world_size(),
                          "parameters": sum(q.numel() for q in model.parameters()),
                          "median_s": statistics.median(times[1:]), "steps_s": times[1:]}), flush=True)
    if state is not None:
        state.close()
    del ddp, opt
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main())
