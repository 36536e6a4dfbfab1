"""Regenerate the PTF-style reference vectors in p4/tests/vectors from the P4 profile model.

    .venv/bin/python p4/tests/gen_vectors.py [FOLDER]

tests/p4/test_vectors.py regenerates them and fails when the stored files differ.
"""

import sys
from pathlib import Path

from inagg.host.p4ctl import vectors
from inagg.models.p4profile import TARGETS


def main(folder: Path) -> None:
    for target in TARGETS.values():
        for path in vectors.write(vectors.scenario(target), folder):
            print(path)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "vectors")
