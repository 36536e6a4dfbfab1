"""Run under torchrun: every collective of the "inagg" process group against a gloo group of the same ranks.

Prints one JSON line per rank: {"rank", "results": {name: problem or "ok"}, "fallbacks"}.
"""

import json
import math

import torch
import torch.distributed as dist

import inagg.host.torch_backend as tb
from inagg.host.torch import exit_process

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Relative bound of the quantized float32 sum at these sizes (docs/scaleout.md), and of the cast to the dtype.
RTOL = {torch.float32: 2.0**-20, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def data(dtype: torch.dtype, rank: int, n: int = 1000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    if dtype == torch.int32:
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
    return (torch.randn(n, generator=g) * 3).to(dtype)


def close(got: torch.Tensor, want: torch.Tensor, scale: float) -> str | None:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype} {tuple(got.shape)} != {want.dtype} {tuple(want.shape)}"
    if got.dtype == torch.int32 or got.dtype == torch.uint8:
        return None if torch.equal(got, want) else "not equal"
    # An absolute bound from the largest summed magnitude: the quantization grid and the cast.
    err = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    bound = scale * RTOL[got.dtype] + 1e-30
    return None if err <= bound else f"error {err:g} > {bound:g}"


def main() -> int:
    dist.init_process_group("inagg")
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    res = {}

    def check(name, fn):
        try:
            res[name] = fn() or "ok"
        except Exception as e:  # reported, so every rank prints
            res[name] = f"{type(e).__name__}: {e}"

    for dtype in FLOATS + (torch.int32,):
        for op in ("SUM", "AVG"):
            def ar(dtype=dtype, op=op):
                x = data(dtype, rank)
                a, b = x.clone(), x.clone()
                if op == "AVG":
                    dist.all_reduce(a, op=dist.ReduceOp.AVG)
                    dist.all_reduce(b, group=gloo)
                    b = torch.div(b, size, rounding_mode="trunc") if dtype == torch.int32 else (b.float() / size).to(dtype)
                else:
                    dist.all_reduce(a)
                    dist.all_reduce(b, group=gloo)
                amax = sum(float(data(dtype, r).abs().max()) for r in range(size))
                return close(a, b, amax / (size if op == "AVG" else 1))
            check(f"all_reduce {op} {dtype}", ar)

    for dtype in (torch.float32, torch.bfloat16):
        def nonfinite(dtype=dtype):
            x = data(dtype, rank, 64)
            # +inf alone, +inf with -inf (NaN), NaN, +inf everywhere, -inf alone, on the ranks that have them.
            special = {0: [(0, math.inf), (1, -math.inf), (3, math.inf)], 1: [(1, math.inf), (3, math.inf), (4, -math.inf)]}
            special[size - 1] = special.get(size - 1, []) + [(2, math.nan), (3, math.inf)]
            for i, v in special.get(rank, []):
                x[i] = v
            a, b = x.clone(), x.clone()
            dist.all_reduce(a)
            dist.all_reduce(b, group=gloo)
            odd = ~b.isfinite()
            if not torch.equal(odd, ~a.isfinite()) or not torch.equal(a.isnan(), b.isnan()):
                return f"non-finite positions differ: {a[:6].tolist()} vs gloo {b[:6].tolist()}"
            if not torch.equal(a[odd & ~a.isnan()], b[odd & ~b.isnan()]):
                return f"infinities differ: {a[:6].tolist()} vs gloo {b[:6].tolist()}"
            return close(a[~odd], b[~odd], 5.0 * size * 3)
        check(f"all_reduce non-finite {dtype}", nonfinite)

    def reduce():
        a, b = data(torch.float32, rank), data(torch.float32, rank)
        w = dist.reduce(a, dst=size - 1, async_op=True)
        dist.reduce(b, dst=size - 1, group=gloo)
        w.wait()
        return close(a, b, 3 * 5 * size) if rank == size - 1 else None
    check("reduce", reduce)

    def reduce_scatter():
        parts = [data(torch.float32, rank, 300, seed=k) for k in range(size)]
        a, b = torch.empty(300), torch.empty(300)
        dist.reduce_scatter(a, [p.clone() for p in parts])
        dist.reduce_scatter(b, [p.clone() for p in parts], group=gloo)
        return close(a, b, 3 * 5 * size)
    check("reduce_scatter", reduce_scatter)

    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.uint8):
        def bcast(dtype=dtype):
            x = data(torch.float32, rank, 77).mul(10).to(dtype)
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src=1)
            dist.broadcast(b, src=1, group=gloo)
            return None if torch.equal(a, b) else "not equal"
        check(f"broadcast {dtype}", bcast)

        def gather(dtype=dtype):
            x = data(torch.float32, rank, 33).mul(10).to(dtype)
            a = [torch.empty_like(x) for _ in range(size)]
            b = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(a, x)
            dist.all_gather(b, x, group=gloo)
            return None if all(torch.equal(p, q) for p, q in zip(a, b)) else "not equal"
        check(f"all_gather {dtype}", gather)

    check("barrier", lambda: dist.barrier())

    def fallback():
        x = data(torch.float32, rank)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=dist.ReduceOp.MAX)
        dist.all_reduce(b, op=dist.ReduceOp.MAX, group=gloo)
        return None if torch.equal(a, b) else "not equal"
    check("all_reduce MAX (gloo)", fallback)
    check("all_reduce MAX again (gloo)", fallback)

    def objects():
        got = [None] * size
        dist.all_gather_object(got, {"rank": rank, "pi": math.pi})
        return None if got == [{"rank": r, "pi": math.pi} for r in range(size)] else repr(got)
    check("all_gather_object", objects)

    print(json.dumps({"rank": rank, "results": res, "fallbacks": tb.fallback_counts()}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_process(main())
