"""Stimulus, reference results and the cocotb driver of the FP32 units (:mod:`inagg.hdl.fp32`).

:mod:`.cases` builds the operand sets (the edge-case lists and seeded random
mixes), their expected results from :mod:`inagg.models.arith` and the
expected ``o_valid`` of a pipeline; the Amaranth-simulator tests and the
cocotb tests in ``tests/cocotb/fp32/`` (driven through :mod:`.pipe`) all
check against it.
"""
