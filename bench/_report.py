"""What every benchmark does with its figures: write them to docs/results/ and show them."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def publish(path: Path, lines: list[str]) -> None:
    """Write ``lines`` as the markdown file ``path`` (its folder made if missing) and print them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    print("\n".join(lines))


def head_commit() -> str:
    """The short hash of the checkout's HEAD the figures are measured at ("unknown" outside a git checkout)."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "unknown"
