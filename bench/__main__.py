"""Run the benchmarks: ``python -m bench [NAME ...]`` (all of them without a name).

A benchmark is a script ``bench/NAME.py`` or a package ``bench/NAME/`` with a
``__main__.py``; each runs in its own process, so one that needs a tool the
machine lacks fails alone and is reported at the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def discover() -> dict[str, list[str]]:
    """Benchmark name -> the command that runs it."""
    found = {}
    for p in sorted(HERE.iterdir()):
        if p.suffix == ".py" and not p.name.startswith("_"):
            found[p.stem] = [sys.executable, str(p)]
        elif p.is_dir() and (p / "__main__.py").exists():
            found[p.name] = [sys.executable, "-m", f"bench.{p.name}"]
    return found


def main(argv: list[str]) -> int:
    benches = discover()
    names = argv or list(benches)
    unknown = [n for n in names if n not in benches]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(benches)}", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(benches[name], cwd=HERE.parent).returncode
        print(f"== {name}: {'ok' if rc == 0 else f'FAILED ({rc})'} in {time.perf_counter() - t0:.1f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
