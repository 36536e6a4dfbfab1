"""What every benchmark does with its figures: write them to docs/results/ and show them."""

from __future__ import annotations

from pathlib import Path


def publish(path: Path, lines: list[str]) -> None:
    """Write ``lines`` as the markdown file ``path`` (its folder made if missing) and print them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    print("\n".join(lines))
