"""Plots: what a schedule sends in every step, and completion time against size.

matplotlib is imported lazily with the non-interactive Agg backend, so
importing this module costs nothing and plotting works without a display.
"""

from __future__ import annotations

import numpy as np

from .cost import Cost
from .ir import Schedule

__all__ = ["plot_schedule", "plot_compare", "crossovers"]


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
    """Sizes where the faster of ``a`` and ``b`` changes (interpolated in log space)."""
    ta, tb = np.asarray(times[a]), np.asarray(times[b])
    d = np.sign(ta - tb)
    out = []
    for i in np.flatnonzero(d[1:] * d[:-1] < 0):
        la, lb = np.log(sizes[i]), np.log(sizes[i + 1])
        fa, fb = np.log(ta[i]) - np.log(tb[i]), np.log(ta[i + 1]) - np.log(tb[i + 1])
        out.append(float(np.exp(la + (lb - la) * fa / (fa - fb))))
    return out


def plot_compare(sizes, costs: dict[str, list[Cost]], path: str, title: str = "") -> None:
    """Completion time against size for several algorithms (log-log), crossovers of the fastest
    Trivance against the fastest Swing marked."""
    plt = _pyplot()
    sizes = np.asarray(sizes, dtype=float)
    fig, ax = plt.subplots(figsize=(8, 5))
    times = {a: np.array([c.time_s for c in cs]) for a, cs in costs.items()}
    for a, t in times.items():
        ax.loglog(sizes, t, marker="o", markersize=3, label=a)
    tri = [a for a in times if a.startswith("trivance")]
    sw = [a for a in times if a.startswith("swing")]
    if tri and sw:
        times["_trivance"] = np.min([times[a] for a in tri], axis=0)
        times["_swing"] = np.min([times[a] for a in sw], axis=0)
        for x in crossovers(sizes, times, "_trivance", "_swing"):
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
