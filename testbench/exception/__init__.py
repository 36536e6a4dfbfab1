"""Reference, stimulus and drivers of the exception engine (:mod:`inagg.hdl.exception`).

:mod:`.reference` answers each request as the model switch's exception path
does and gives the state the engine must end in; :mod:`.stimulus` builds
seeded request streams and keys with chosen positions; :mod:`.drive` runs a
stream through the engine in the Amaranth simulator, the cocotb tests in
``tests/cocotb/exception/`` through the Verilated Verilog; both read the
engine's state back through :mod:`.state`.
"""
