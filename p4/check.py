"""Compile-check the P4 programs with whatever P4 compiler is installed: ``make p4-check``.

    .venv/bin/python p4/check.py

Each check names its tool; a missing tool is reported as skipped with the
reason, never as a pass. Tools are taken from the environment first, then
from PATH:

- ``p4test v1model``: ``P4TEST`` or ``p4test``; front and mid end, both lane counts.
- ``p4test tna``: the same p4test with ``-D__TARGET_TOFINO__=1`` (and ``=2``)
  and ``-I $TOFINO_P4INCLUDE``.
- ``p4c-bm2-ss v1model``: ``P4C_BM2_SS`` or ``p4c-bm2-ss``; BMv2 JSON and
  P4Info, both lane counts.
- ``p4c-barefoot tna`` and ``t2na``: ``P4C_BAREFOOT`` or ``p4c-barefoot``; the
  Tofino back end (PHV allocation, stages) for Tofino 1 and Tofino 2, then
  its assembler on the result: ``BFAS``, ``bfas`` on PATH or beside
  ``p4c-barefoot``. The compiler alone does not check every limit of the
  chip (the stage count, the parser's TCAM): only an assembled program fits.

``TOFINO_P4INCLUDE`` is the folder holding ``tna.p4`` (in p4c's tree:
``backends/tofino/bf-p4c/p4include``). Each tool's ``--version`` is printed
first, so a log says what was checked with what. A failed check shows its
first error line. Exit status 1 when a check that ran failed.
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
TOOLS = (("P4TEST", "p4test"), ("P4C_BM2_SS", "p4c-bm2-ss"), ("P4C_BAREFOOT", "p4c-barefoot"))
V1MODEL = HERE / "v1model" / "inagg.p4"
TNA = HERE / "tna" / "inagg.p4"
# p4c-barefoot 9.13.4 (p4c 34b86e9) stops on the Tofino 2 build with an internal error after PHV
# allocation (docs/results/p4.md); the Tofino 1 build of the same source compiles.
T2NA_KNOWN = "ixbar_realign.cpp"


@dataclass(frozen=True)
class Check:
    """One compile check: the command to run, or why it cannot run here (``argv`` None).

    ``{out}`` in ``argv`` stands for a fresh temporary folder for the tool's output.
    ``known`` is a text in the output of a failure of the tool itself that the
    check is expected to hit (so a tool that stops failing is noticed too).
    ``then`` is a second command, run in the same folder once ``argv`` passed.
    """

    name: str
    argv: tuple[str, ...] | None
    skip: str = ""
    known: str = ""
    then: tuple[str, ...] = ()


@dataclass(frozen=True)
class Result:
    check: Check
    ok: bool
    detail: str  # the command that passed (with its warning count), or the first error line
    output: str = ""  # all the tool printed


def _tool(var: str, name: str) -> str | None:
    return os.environ.get(var) or shutil.which(name)


def _bfas(p4c_barefoot: str) -> str | None:
    """The Tofino assembler: ``BFAS``, ``bfas`` on PATH, or the one a p4c build puts beside ``p4c-barefoot``."""
    beside = Path(p4c_barefoot).with_name("bfas")
    return _tool("BFAS", "bfas") or (str(beside) if beside.is_file() else None)


def version(tool: str) -> str:
    """The first version line of ``tool --version`` (p4c's tools print "Version 1.2.5.x (SHA: ...)")."""
    p = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
    lines = (p.stdout + p.stderr).strip().splitlines()
    return next((ln.strip() for ln in lines if "ersion" in ln), lines[0].strip() if lines else "no version")


def checks(lanes: tuple[int, ...] = (64, 256)) -> list[Check]:
    """Every check, with the tools found in the environment; those without their tool carry the reason.

    ``lanes`` are the v1model builds to check (the test suite takes 64 only:
    the 256-lane build takes half a minute per tool, and the BMv2 vector run
    compiles it anyway).
    """
    out: list[Check] = []
    p4test = _tool("P4TEST", "p4test")
    tofino_inc = os.environ.get("TOFINO_P4INCLUDE")
    if p4test:
        out += [Check(f"p4test v1model lanes={n}", (p4test, f"-DINAGG_LANES={n}", str(V1MODEL))) for n in lanes]
    else:
        out.append(Check("p4test v1model", None, "p4test not found (set P4TEST or put it on PATH)"))
    if p4test and tofino_inc and (Path(tofino_inc) / "tna.p4").is_file():
        out += [Check(f"p4test tna tofino{gen}", (p4test, f"-D__TARGET_TOFINO__={gen}", "-I", tofino_inc, str(TNA)))
                for gen in (1, 2)]
    else:
        out.append(Check("p4test tna", None, "p4test not found" if not p4test
                         else "TOFINO_P4INCLUDE does not name a folder with tna.p4"))
    bm2 = _tool("P4C_BM2_SS", "p4c-bm2-ss")
    if bm2:
        out += [Check(f"p4c-bm2-ss v1model lanes={n}",
                      (bm2, f"-DINAGG_LANES={n}", "-o", "{out}/inagg.json",
                       "--p4runtime-files", "{out}/inagg.p4info.txtpb", str(V1MODEL))) for n in lanes]
    else:
        out.append(Check("p4c-bm2-ss v1model", None, "p4c-bm2-ss not found (set P4C_BM2_SS or put it on PATH)"))
    bf = _tool("P4C_BAREFOOT", "p4c-barefoot")
    if bf:
        bfas = _bfas(bf)
        then = (bfas, "{out}/pipe/inagg.bfa", "-o", "{out}/bin") if bfas else ()
        out += [Check(f"p4c-barefoot {arch}" + (" + bfas" if then else ""),
                      (bf, "--target", target, "--arch", arch, "-o", "{out}", str(TNA)), known=known, then=then)
                for target, arch, known in (("tofino", "tna", ""), ("tofino2", "t2na", T2NA_KNOWN))]
    else:
        out.append(Check("p4c-barefoot tna", None, "p4c-barefoot not found (set P4C_BAREFOOT or put it on PATH)"))
    return out


def run(check: Check) -> Result:
    """Run ``check`` (which must have its tool)."""
    if check.argv is None:
        raise ValueError(f"{check.name} cannot run here: {check.skip}")
    with tempfile.TemporaryDirectory() as tmp:
        def step(cmd: tuple[str, ...], timeout: int, cwd: str | None = None) -> tuple[int, list[str]]:
            p = subprocess.run([a.replace("{out}", tmp) for a in cmd], capture_output=True, text=True,
                               timeout=timeout, cwd=cwd)
            return p.returncode, (p.stdout + p.stderr).strip().splitlines()

        # The Tofino back end takes minutes where table placement searches long.
        returncode, lines = step(check.argv, 3600)
        if returncode == 0 and check.then:
            (Path(tmp) / "bin" / "logs").mkdir(parents=True)
            returncode, assembled = step(check.then, 600, cwd=tmp)
            # Warnings count from both tools; a failure is the assembler's alone.
            lines = lines + assembled if returncode == 0 else assembled
    if returncode == 0:
        warnings = sum("warning:" in ln for ln in lines)
        done = " ".join(check.argv) + (" && " + " ".join(check.then) if check.then else "")
        return Result(check, True, done + (f"  ({warnings} warnings)" if warnings else ""))
    lines = lines or [f"exit status {returncode}, no output"]
    return Result(check, False, next((ln for ln in lines if "error" in ln.lower()), lines[-1]), "\n".join(lines))


def main() -> int:
    for var, name in TOOLS:
        tool = _tool(var, name)
        print(f"{name:12} {tool + ': ' + version(tool) if tool else 'not found'}")
        if name == "p4c-barefoot" and tool:  # bfas has no --version: it is the build's own
            print(f"{'bfas':12} {_bfas(tool) or 'not found: the Tofino checks stop at the compiler'}")
    passed = failed = skipped = 0
    for c in checks():
        if c.argv is None:
            skipped += 1
            print(f"{'skipped':8} {c.name:28} {c.skip}")
            continue
        r = run(c)
        if c.known and not r.ok and c.known in r.output:
            skipped += 1  # the tool's own known failure, not the program's
            print(f"{'known':8} {c.name:28} the tool fails in {c.known}: {r.detail}", flush=True)
            continue
        passed += r.ok
        failed += not r.ok
        print(f"{'ok' if r.ok else 'FAILED':8} {c.name:28} {r.detail}", flush=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
