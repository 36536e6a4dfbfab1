"""The model check of the UC protocol on a tree of model switches: states, transitions and time per scope.

Writes docs/results/tree.md. Run: ``.venv/bin/python bench/tree.py``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np

from inagg.host.tree_checker import TreeScope, check_tree

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "tree.md"

SCOPES = [
    TreeScope("2x1", chunks=2, window=2, faults=1),
    TreeScope("2x2", chunks=1, window=1, faults=0),
    TreeScope("2x2", chunks=1, window=1, faults=1),
    TreeScope("2x2", chunks=2, window=1, faults=1),
]


def report() -> str:
    """Run every scope; the page of docs/results/tree.md."""
    load = os.getloadavg()
    rows = []
    for scope in SCOPES:
        r = check_tree(scope)
        rows.append(f"| {scope.spec} | {scope.chunks} | {scope.window} | {scope.faults} | {r.states:,} | "
                    f"{r.transitions:,} | {r.final_states} | {r.max_depth} | {r.seconds:.1f} |")
        print(rows[-1], flush=True)
    lines = [
        "# Model check of the UC tree (`host/tree_checker.py`)",
        "",
        "Every interleaving of real ranks (`Worker`) and real model switches (`ModelSwitch`) on a tree,",
        "UC AllReduce, at most one lost frame per timeout round and `faults` per run, any frame in flight on",
        "any hop delivered next (`docs/protocol.md` section 10). Every scope below ends with every rank",
        "holding the exact sum of every chunk and every run terminating (the state graph is acyclic).",
        "",
        f"Measured with `.venv/bin/python bench/tree.py` on {platform.machine()}, Python",
        f"{platform.python_version()}, numpy {np.__version__}, one core of a machine shared with other jobs",
        f"(load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the start).",
        "",
        "| tree | chunks per rank | window | losses | states | transitions | final states | depth | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "`2x1` is a root over two switches of one rank each, `2x2` a root over two switches of two ranks",
        "each (depth 2; EPIC's depth-3 scope, which counts the ranks as a level).",
        "`tests/host/test_tree_checker.py` runs the two small scopes in CI and a switch that does not",
        "resend its partial, which the checker refutes with a trace.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    OUT.write_text(text := report())
    print(text, end="")


if __name__ == "__main__":
    main()
