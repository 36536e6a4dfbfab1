"""Bit-exact numpy golden models: the single source of truth for every other part.

- :mod:`inagg.models.protocol` -- wire constants, opcodes, ImmDt bits, counters
- :mod:`inagg.models.icrc` -- the RoCEv2 invariant CRC
- :mod:`inagg.models.wire` -- header layouts: build and parse frames
- :mod:`inagg.models.quant` -- FP32 <-> INT32 quantization with a power-of-two scale
- :mod:`inagg.models.arith` -- INT32 lane sums with FP32 promotion on overflow
- :mod:`inagg.models.cuckoo` -- the two-way cuckoo table of the exception path
- :mod:`inagg.models.job` -- the job description shared by model, RTL, P4 and hosts
- :mod:`inagg.models.switch` -- the Mode II switch as a behavioural model
- :mod:`inagg.models.terminated` -- EPIC's Mode I: the model switch as every host's RC endpoint
- :mod:`inagg.models.backend` -- the switch interface every backend implements, and their registry

Nothing here imports another part of inagg.
"""
