"""Byte sizes on the command line: one grammar for every ``inagg`` command that takes one.

A size is a number, whole or decimal, and an optional unit, in any case and
with optional spaces: ``B``; ``kB``, ``MB``, ``GB`` (or ``k``, ``M``, ``G``)
for powers of 1000; ``KiB``, ``MiB``, ``GiB`` for powers of 1024. A
fraction of a byte is dropped: ``1.5KiB`` is 1536 bytes, ``2.5`` is 2.
"""

from __future__ import annotations

import argparse
import re
from fractions import Fraction

__all__ = ["SIZE_GRAMMAR", "parse_size", "size_arg"]

SIZE_GRAMMAR = ("a size is a number of bytes with an optional unit: B; kB, MB, GB (powers of 1000); KiB, MiB, GiB "
                "(powers of 1024); any case, e.g. 4096, 64KiB, 1.5MB")

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """The bytes ``text`` names in the grammar of :data:`SIZE_GRAMMAR`; ``ValueError`` otherwise."""
    m = _SIZE.fullmatch(str(text))
    if not m or m[2].lower() not in _UNITS:
        raise ValueError(f"bad size {text!r}: size must be a number of bytes with an optional unit (B; kB, MB, GB; "
                         f"KiB, MiB, GiB)")
    return int(Fraction(m[1]) * _UNITS[m[2].lower()])


def size_arg(text: str) -> int:
    """:func:`parse_size` as an argparse ``type``."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
