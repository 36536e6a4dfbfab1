"""Stimulus, reference results and cocotb testbenches of the FP32 units (:mod:`inagg.hdl.fp32`).

:mod:`.cases` builds the operand sets (the edge-case lists and seeded random
mixes) and their expected results from :mod:`inagg.models.arith`; the
Amaranth-simulator tests and the cocotb testbenches (:mod:`.adder_tb`,
:mod:`.int_tb`, run by :mod:`.sim`) all check against it.
"""
