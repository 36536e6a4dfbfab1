"""Train a small model with ``dist.init_process_group("inagg")``, and the same model on gloo beside it.

Run on CPU processes with torchrun::

    torchrun --nproc-per-node 4 examples/pg_train.py                   # through a switch rank 0 starts
    INAGG_SWITCH=HOST:PORT torchrun ... examples/pg_train.py           # through `inagg switch serve`
    torchrun --nproc-per-node 2 examples/pg_train.py --amp --inf-steps 2,5

The default process group is inagg's: DDP syncs the model, all-reduces its
buckets and the losses through it. A gloo group of the same ranks
(``dist.new_group(backend="gloo")``) trains a copy of the model from the
same seed on the same data. After the last step every parameter of the two
copies must agree within the bound of ``docs/scaleout.md`` ("Training
through the backend"): ``2 * lr * sum over steps of n * G * (n * 2**-32 +
2**-22)``, ``G`` the step's largest gradient magnitude over the ranks and
``n`` the world size (the quantization grid and the float32 roundings of
both runs' averaged gradients, to first order, doubled for their drift).

``--amp`` trains with ``torch.amp.GradScaler`` and makes rank 1's loss
infinite at the steps of ``--inf-steps``: the scaler must skip exactly the
same steps in both runs (every rank sees the non-finite gradient gloo's sum
gives).

Rank 0 prints a JSON summary; every rank exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import inagg.host.torch_backend as inagg_backend
from inagg.host.torch import exit_process


def make_model(args) -> nn.Module:
    torch.manual_seed(args.seed)
    return nn.Sequential(nn.Linear(args.inputs, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))


def batches(args, rank: int):
    g = torch.Generator().manual_seed(args.seed * 7919 + rank)
    teacher = torch.randn(args.inputs, generator=torch.Generator().manual_seed(1000 + args.seed))
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.inputs, generator=g)
        yield x, torch.sin(x @ teacher / math.sqrt(args.inputs)).unsqueeze(1)


class Run:
    """One copy of the model, its optimizer and (``--amp``) its scaler, on one process group."""

    def __init__(self, args, group):
        self.ddp = DDP(make_model(args), process_group=group)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=args.lr)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if args.amp else None
        self.skipped: list[int] = []

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor, poison: bool) -> float:
        self.opt.zero_grad()
        loss = nn.functional.mse_loss(self.ddp(x), y)
        if poison:
            loss = loss * math.inf
        if self.scaler is None:
            loss.backward()
            self.opt.step()
            return self._grad_max()
        self.scaler.scale(loss).backward()
        scale = self.scaler.get_scale()
        self.scaler.step(self.opt)  # unscales the gradients in place
        self.scaler.update()
        if self.scaler.get_scale() < scale:
            self.skipped.append(step)
        return self._grad_max()

    def _grad_max(self) -> float:
        finite = [p.grad[p.grad.isfinite()].abs().max() for p in self.ddp.parameters() if p.grad.isfinite().any()]
        return float(max(finite)) if finite else 0.0


def train(args, rank: int, world: int, gloo) -> dict:
    """Both runs; the summary. The models are freed on return: a DDP model of a destroyed gloo group hangs
    in its destructor."""
    inf_steps = {int(s) for s in args.inf_steps.split(",") if s}
    runs = {"inagg": Run(args, None), "gloo": Run(args, gloo)}
    bound = 0.0
    for step, (x, y) in enumerate(batches(args, rank)):
        poison = args.amp and step in inf_steps and rank == 1
        local = {name: run.step(step, x, y, poison) for name, run in runs.items()}
        g = torch.tensor([max(local.values())], dtype=torch.float64)
        dist.all_reduce(g, op=dist.ReduceOp.MAX, group=gloo)
        bound += 2 * args.lr * world * float(g) * (world * 2.0**-32 + 2.0**-22)
    with torch.no_grad():
        worst = max(float((a - b).abs().max()) for a, b in zip(runs["inagg"].ddp.parameters(),
                                                               runs["gloo"].ddp.parameters()))
        finite = all(bool(q.isfinite().all()) for q in runs["inagg"].ddp.parameters())
    summary = {"world_size": world, "steps": args.steps, "max_param_diff": worst, "bound": bound,
               "skipped": {name: run.skipped for name, run in runs.items()},
               "fallbacks": inagg_backend.fallback_counts(), "finite": finite}
    summary["ok"] = (worst <= bound and finite
                     and runs["inagg"].skipped == runs["gloo"].skipped == (sorted(inf_steps) if args.amp else []))
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--inputs", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", action="store_true", help="train with torch.amp.GradScaler")
    p.add_argument("--inf-steps", default="", help="steps (comma-separated) at which rank 1's loss is infinite")
    args = p.parse_args(argv)
    dist.init_process_group("inagg")
    rank, world = dist.get_rank(), dist.get_world_size()
    summary = train(args, rank, world, dist.new_group(backend="gloo"))
    if rank == 0:
        print(json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    exit_process(main())
