"""Stimulus, reference results and cocotb testbenches of the FP32 units (:mod:`inagg.hdl.fp32`).

:mod:`.cases` builds the operand sets (the edge-case lists and seeded random
mixes), their expected results from :mod:`inagg.models.arith` and the
expected ``o_valid`` of a pipeline; the Amaranth-simulator tests and the
cocotb testbenches (:mod:`.adder_tb`, :mod:`.int_tb`, driven through
:mod:`.pipe` and built and run by :mod:`.sim`) all check against it.
"""
