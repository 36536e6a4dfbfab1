"""Plots: what a schedule sends in every step, and completion time against size.

matplotlib is imported lazily with the non-interactive Agg backend, so
importing this module costs nothing and plotting works without a display.
"""

from __future__ import annotations

import numpy as np

from inagg.host.schedules.cost import Cost
from inagg.host.schedules.ir import Schedule

__all__ = ["plot_schedule", "plot_compare", "crossovers", "trivance_vs_swing"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_schedule(schedule: Schedule, path: str, size_bytes: float = 1.0) -> None:
    """Heat map: bytes each rank sends in each step (rows: ranks, columns: steps)."""
    plt = _pyplot()
    steps = schedule.comm_steps
    x = schedule.is_transfer
    col = np.searchsorted(steps, schedule.step[x])
    grid = np.zeros((schedule.nnodes, len(steps)))
    np.add.at(grid, (schedule.src[x], col), schedule.count[x] * (size_bytes / max(schedule.size_chunks, 1)))
    fig, ax = plt.subplots(figsize=(max(4, min(14, len(steps) * 0.4 + 2)), max(3, min(10, schedule.nnodes * 0.12 + 2))))
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("step")
    ax.set_ylabel("node (ranks, then switches)")
    ax.set_title(f"{schedule.name} {schedule.collective.value}, {schedule.nranks} ranks: bytes sent per step")
    fig.colorbar(im, ax=ax, label="bytes" if size_bytes != 1.0 else "chunks x size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def crossovers(sizes, times: dict[str, np.ndarray], a: str, b: str) -> list[float]:
    """Sizes where the faster of ``a`` and ``b`` changes (interpolated in log space).

    Sizes where both take the same time count only if the faster one differs on their two
    sides; the crossover is then the middle (in log size) of those tied sizes.
    """
    x = np.log(np.asarray(sizes, dtype=float))
    f = np.log(np.asarray(times[a], dtype=float)) - np.log(np.asarray(times[b], dtype=float))
    nz = np.flatnonzero(f)
    i, j = nz[:-1], nz[1:]
    flip = np.sign(f[i]) != np.sign(f[j])
    i, j = i[flip], j[flip]
    between = x[i] + (x[j] - x[i]) * f[i] / (f[i] - f[j])
    tied = (x[np.minimum(i + 1, len(x) - 1)] + x[j - 1]) / 2
    return np.exp(np.where(j > i + 1, tied, between)).tolist()


def trivance_vs_swing(sizes, times: dict[str, np.ndarray]) -> dict | None:
    """Where the faster Trivance variant beats the faster Swing variant, and their crossovers.

    ``times`` maps algorithm names to completion times over ``sizes``; ``None`` unless both
    families are there. ``trivance_faster`` lists the sizes where Trivance is strictly faster.
    """
    tri = [t for a, t in times.items() if a.startswith("trivance")]
    sw = [t for a, t in times.items() if a.startswith("swing")]
    if not tri or not sw:
        return None
    best = {"trivance": np.min(tri, axis=0), "swing": np.min(sw, axis=0)}
    faster = best["trivance"] < best["swing"]
    return {"trivance_faster": [int(x) for x, w in zip(sizes, faster) if w],
            "crossovers": crossovers(sizes, best, "trivance", "swing")}


def plot_compare(sizes, costs: dict[str, list[Cost]], path: str, title: str = "") -> None:
    """Completion time against size for several algorithms (log-log). Where the faster Trivance
    beats the faster Swing is shaded, and their crossovers are marked."""
    plt = _pyplot()
    sizes = np.asarray(sizes, dtype=float)
    fig, ax = plt.subplots(figsize=(8, 5))
    times = {a: np.array([c.time_s for c in cs]) for a, cs in costs.items()}
    for a, t in times.items():
        ax.loglog(sizes, t, marker="o", markersize=3, label=a)
    ts = trivance_vs_swing(sizes, times)
    if ts is not None:
        # a win is shaded up to the crossovers around it, or midway (in log size) to the next size
        edges = np.sqrt(sizes[1:] * sizes[:-1])
        for x in ts["crossovers"]:
            edges[np.searchsorted(sizes, x) - 1] = x
        lo = np.concatenate([[sizes[0]], edges])
        hi = np.concatenate([edges, [sizes[-1]]])
        won = np.isin(sizes, ts["trivance_faster"])
        for k, i in enumerate(np.flatnonzero(won)):
            ax.axvspan(lo[i], hi[i], color="tab:green", alpha=0.12, linewidth=0,
                       label="fastest Trivance beats fastest Swing" if k == 0 else None)
        for x in ts["crossovers"]:
            ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(f"Trivance/Swing\ncrossover {x / 1024:.0f} KiB", (x, ax.get_ylim()[0]), fontsize=7,
                        rotation=90, va="bottom", ha="right")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("completion time (s)")
    ax.set_title(title or "completion time against size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
