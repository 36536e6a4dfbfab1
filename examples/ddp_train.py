"""Train a small model with DistributedDataParallel, its gradients all-reduced through inagg.

Run on CPU processes with torchrun::

    torchrun --nproc-per-node 4 examples/ddp_train.py                  # through a switch rank 0 starts
    INAGG_SWITCH=HOST:PORT torchrun ... examples/ddp_train.py          # through `inagg switch serve`
    torchrun --nproc-per-node 4 examples/ddp_train.py --backend both   # inagg, then gloo, compared

Every rank trains the same MLP on its own shard of a synthetic regression
task. With ``--backend both`` the run is made twice from the same seed,
once with the inagg hook and once with gloo's all-reduce, and checks two
things (``docs/scaleout.md``, "Accuracy"):

1. the first step's averaged gradients through inagg are within the
   quantization bound of the exact average (computed in float64 from every
   rank's local gradient), element by element;
2. the losses of every step agree with gloo's within ``--rtol``.

Rank 0 prints a summary (``--json``: one JSON object) and every rank exits
1 when a check fails.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from inagg.host.torch import allreduce_hook, exit_process, group_from_process_group
from inagg.models import quant

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Half a unit in the last place, relative, of the cast from the float32 average.
CAST_HALF_ULP = {torch.bfloat16: 2.0**-8}


def make_model(args) -> nn.Module:
    torch.manual_seed(args.seed)
    return nn.Sequential(nn.Linear(args.inputs, args.hidden), nn.Tanh(), nn.Linear(args.hidden, args.hidden),
                         nn.Tanh(), nn.Linear(args.hidden, 1)).to(DTYPES[args.dtype])


def shard(args, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batches: inputs and the targets of a fixed random teacher."""
    g = torch.Generator().manual_seed(1000 + args.seed)
    teacher = torch.randn(args.inputs, generator=g)
    g = torch.Generator().manual_seed(args.seed * 7919 + rank)
    out = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.inputs, generator=g)
        y = torch.sin(x @ teacher / math.sqrt(args.inputs)).unsqueeze(1)
        out.append((x.to(DTYPES[args.dtype]), y.to(DTYPES[args.dtype])))
    return out


def _wchar() -> int:
    """Bytes this process passed to write-like system calls: gloo's TCP traffic (Linux)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def gradient_check(model: nn.Module, ddp: DDP, batch, world: int) -> dict:
    """Compare the averaged gradients DDP left in ``ddp`` with the exact average, against the bound.

    The bound per element (``docs/scaleout.md``): the quantization grid of the
    agreed exponent, ``2**-(e+1)`` on the average, plus the roundings of the
    float32 sum, of the division by the world size and of the final cast to
    the gradient's dtype.
    """
    x, y = batch
    nn.functional.mse_loss(model(x), y).backward()
    local = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).to(torch.float64)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    stack = torch.stack(gathered)
    exact = stack.mean(0).numpy()
    abs_sum = stack.abs().sum(0).numpy()
    amax = float(stack.abs().max())
    # The agreement round bounds amax by the next power of two: docs/protocol.md section 2.1.
    e = quant.choose_exponent(2.0 ** (math.floor(math.log2(amax)) + 1), world) if amax else 0
    got = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()]).to(torch.float64).numpy()
    dtype = next(model.parameters()).dtype
    grid = quant.error_bound(e, world) / world
    # The dequantized sum rounds to float32, then the division does, then the cast to the gradient's dtype.
    mean_abs = abs_sum / world + grid
    bound = grid + 2.0**-24 * mean_abs + world * 2.0**-53 * abs_sum / world + 2.0**-24 * (np.abs(exact) + 2 * grid)
    if dtype != torch.float32:
        bound = bound + CAST_HALF_ULP[dtype] * (np.abs(exact) + 3 * grid)
    err = np.abs(got - exact)
    return {"exponent": e, "max_error": float(err.max()), "worst_error_to_bound": float((err / bound).max()),
            "ok": bool((err <= bound).all())}


def train(args, backend: str, rank: int, world: int) -> dict:
    model = make_model(args)
    reference = copy.deepcopy(model)
    ddp = DDP(model)
    state = None
    if backend == "inagg":
        state = group_from_process_group(switch=args.switch, window=args.window, fallback=args.fallback)
        ddp.register_comm_hook(state, allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    losses, times, check = [], [], None
    wchar0 = _wchar()
    for step, (x, y) in enumerate(shard(args, rank)):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        times.append(time.perf_counter() - t0)
        if step == 0 and backend == "inagg" and state.group is not None:
            check = gradient_check(reference, ddp, (x, y), world)
        opt.step()
        mean = loss.detach().to(torch.float64)
        dist.all_reduce(mean)
        losses.append(float(mean) / world)
    out = {"losses": losses, "step_time_s": float(np.median(times)), "gradient_check": check,
           "parameters": sum(p.numel() for p in model.parameters())}
    if state is not None and state.group is not None:
        w = state.group.worker
        # First transmissions: what the protocol needs; retransmissions are counted apart.
        out["bytes_sent_per_step"] = (w.stats["sent"] - w.stats["resent"]) * w.template.frame_len / args.steps
        out["retransmissions"] = w.stats["resent"]
        out["fallback"] = None
        state.close()
    else:
        # Includes the barriers' and loss reductions' few bytes per step.
        out["bytes_sent_per_step"] = (_wchar() - wchar0) / args.steps
        if state is not None:
            out["fallback"] = state.fallback_reason
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("inagg", "gloo", "both"), default="inagg")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--inputs", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=16, help="chunks each rank keeps outstanding (default 16)")
    p.add_argument("--switch", help="HOST:PORT of `inagg switch serve` (default: INAGG_SWITCH, else embedded)")
    p.add_argument("--fallback", action="store_true", help="use gloo when the switch cannot take the job")
    p.add_argument("--rtol", type=float, default=1e-4, help="loss agreement with gloo (default 1e-4)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        backends = ("inagg", "gloo") if args.backend == "both" else (args.backend,)
        runs = {b: train(args, b, rank, world) for b in backends}
    finally:
        dist.destroy_process_group()
    summary = {"world_size": world, "steps": args.steps, "dtype": args.dtype, "runs": runs, "ok": True}
    if "inagg" in runs and runs["inagg"]["gradient_check"] is not None:
        summary["ok"] &= runs["inagg"]["gradient_check"]["ok"]
    if len(runs) == 2:
        a, b = np.array(runs["inagg"]["losses"]), np.array(runs["gloo"]["losses"])
        rel = float(np.max(np.abs(a - b) / np.abs(b)))
        summary["max_loss_rel_diff"] = rel
        summary["ok"] &= rel <= args.rtol
    if rank == 0:
        if args.json:
            print(json.dumps(summary))
        else:
            for name, r in runs.items():
                if r.get("fallback"):
                    print(f"{name}: fell back to the process group's all-reduce: {r['fallback']}")
                print(f"{name:5}: loss {r['losses'][0]:.6f} -> {r['losses'][-1]:.6f}, step {r['step_time_s'] * 1e3:.1f} "
                      f"ms, {r.get('bytes_sent_per_step', 0) / 1e3:.1f} kB sent per step")
            if "max_loss_rel_diff" in summary:
                print(f"losses agree within {summary['max_loss_rel_diff']:.2e} (rtol {args.rtol})")
            print("PASS" if summary["ok"] else "FAIL")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    exit_process(main())
