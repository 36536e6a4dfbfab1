"""Compile-check the P4 programs with whatever P4 compiler is installed: ``make p4-check``.

    .venv/bin/python p4/check.py

Each check names its tool; a missing tool is reported as skipped with the
reason, never as a pass. Tools are taken from the environment first, then
from PATH:

=================  ==========================  ====================================
check              tool (variable)             runs
=================  ==========================  ====================================
p4test v1model     ``P4TEST``, ``p4test``      front and mid end, both lane counts
p4test tna         same, + ``TOFINO_P4INCLUDE`` ``-D__TARGET_TOFINO__=1``, Tofino 1 and 2
bmv2 v1model       ``P4C_BM2_SS``, ``p4c-bm2-ss``  BMv2 JSON and P4Info
tofino tna         ``P4C_BAREFOOT``, ``p4c-barefoot``  the Tofino back end (PHV, stages)
=================  ==========================  ====================================

``TOFINO_P4INCLUDE`` is the folder holding ``tna.p4`` (in p4c's tree:
``backends/tofino/bf-p4c/p4include``). Exit status 1 when a check that ran failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
V1MODEL = HERE / "v1model" / "inagg.p4"
TNA = HERE / "tna" / "inagg.p4"


@dataclass
class Result:
    name: str
    ran: bool
    ok: bool
    detail: str


def _tool(var: str, name: str) -> str | None:
    return os.environ.get(var) or shutil.which(name)


def _run(name: str, argv: list[str]) -> Result:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    text = (p.stdout + p.stderr).strip()
    return Result(name, True, p.returncode == 0, text.splitlines()[-1] if p.returncode and text else " ".join(argv))


def checks() -> list[Result]:
    """Run every check whose tool is there; the others come back as skipped with the reason."""
    out: list[Result] = []
    p4test = _tool("P4TEST", "p4test")
    tofino_inc = os.environ.get("TOFINO_P4INCLUDE")
    if p4test:
        for lanes in (64, 256):
            out.append(_run(f"p4test v1model lanes={lanes}", [p4test, f"-DINAGG_LANES={lanes}", str(V1MODEL)]))
    else:
        out.append(Result("p4test v1model", False, False, "p4test not found (set P4TEST or put it on PATH)"))
    if p4test and tofino_inc and (Path(tofino_inc) / "tna.p4").is_file():
        for gen in (1, 2):
            out.append(_run(f"p4test tna tofino{gen}",
                            [p4test, f"-D__TARGET_TOFINO__={gen}", "-I", tofino_inc, str(TNA)]))
    else:
        why = "p4test not found" if not p4test else "TOFINO_P4INCLUDE does not name a folder with tna.p4"
        out.append(Result("p4test tna", False, False, why))
    bm2 = _tool("P4C_BM2_SS", "p4c-bm2-ss")
    if bm2:
        with tempfile.TemporaryDirectory() as tmp:
            out.append(_run("p4c-bm2-ss v1model", [bm2, "-o", f"{tmp}/inagg.json",
                                                   "--p4runtime-files", f"{tmp}/inagg.p4info.txt", str(V1MODEL)]))
    else:
        out.append(Result("p4c-bm2-ss v1model", False, False, "p4c-bm2-ss not found (set P4C_BM2_SS or put it on PATH)"))
    bf = _tool("P4C_BAREFOOT", "p4c-barefoot")
    if bf:
        with tempfile.TemporaryDirectory() as tmp:
            out.append(_run("p4c-barefoot tna", [bf, "--target", "tofino", "--arch", "tna", "-o", tmp, str(TNA)]))
    else:
        out.append(Result("p4c-barefoot tna", False, False, "p4c-barefoot not found (set P4C_BAREFOOT or put it on PATH)"))
    return out


def main() -> int:
    results = checks()
    for r in results:
        status = ("ok" if r.ok else "FAILED") if r.ran else "skipped"
        print(f"{status:8} {r.name:28} {r.detail}")
    ran = [r for r in results if r.ran]
    print(f"{sum(r.ok for r in ran)} passed, {sum(not r.ok for r in ran)} failed, "
          f"{len(results) - len(ran)} skipped")
    return 1 if any(not r.ok for r in ran) else 0


if __name__ == "__main__":
    sys.exit(main())
