"""Header fields of :mod:`inagg.models.frame` as Amaranth values: read them from a byte vector, build headers.

A byte vector here holds frame byte ``k`` in bits ``8k .. 8k+7`` (the beat
order of :mod:`inagg.hdl.axis`); header fields are big-endian on the wire
and may start and end inside a byte (the BTH flags). The offsets come from
the frame description, so the gateware cannot disagree with the models on
where a field lies.
"""

from __future__ import annotations

from amaranth import Cat, Const, Value

from inagg.models.frame import Header, Layout
from inagg.hdl.axis import be_bytes, be_get

__all__ = ["field", "header_value", "header_bytes"]


def field(vec: Value, layout: Layout, path: str) -> Value:
    """Field ``"header.field"`` of a frame of ``layout`` whose first bytes are in ``vec``."""
    off, bits = layout.bit_span(path)
    lo, hi = off // 8, (off + bits + 7) // 8
    shift = 8 * hi - off - bits
    return be_get(vec, lo, hi - lo)[shift:shift + bits]


def _fit(value: Value | int, bits: int) -> Value:
    if isinstance(value, int):
        return Const(int(value), bits)
    v = Value.cast(value)
    return v[:bits] if len(v) >= bits else Cat(v, Const(0, bits - len(v)))


def _check_names(header: Header, values: dict) -> None:
    unknown = set(values) - {f.name for f in header.fields}
    if unknown:
        raise ValueError(f"header {header.name} has no field {sorted(unknown)[0]!r}")


def header_value(header: Header, values: dict[str, Value | int]) -> Value:
    """``header`` as one big-endian value (its first field in the top bits); a field not in ``values`` takes its
    fixed value, and a value is cut or zero-extended to its field's width."""
    _check_names(header, values)
    parts = []
    for f in header.fields:
        v = values.get(f.name, f.value)
        if v is None:
            raise ValueError(f"field {header.name}.{f.name} has no fixed value: give it")
        parts.append(_fit(v, f.bits))
    return Cat(*reversed(parts))


def header_bytes(layout: Layout, values: dict[str, Value | int]) -> Value:
    """The headers of ``layout`` as a byte vector (frame byte 0 in the low bits), from ``"header.field"`` values."""
    per_header: dict[str, dict[str, Value | int]] = {h.name: {} for h in layout.headers}
    for path, v in values.items():
        name, _, fname = path.partition(".")
        if name not in per_header:
            raise ValueError(f"a frame of opcode {layout.opcode.name} has no {name!r} header")
        per_header[name][fname] = v
    for h in layout.headers:
        _check_names(h, per_header[h.name])
    out = []
    for h in layout.headers:
        out += be_bytes(header_value(h, per_header[h.name]), h.size)
    return Cat(*out)
