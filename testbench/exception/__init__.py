"""Reference, stimulus and testbenches of the exception engine (:mod:`inagg.hdl.exception`).

:mod:`.reference` answers each request as the model switch's exception path
does and gives the state the engine must end in; :mod:`.stimulus` builds
seeded request streams and keys with chosen positions; :mod:`.drive` runs a
stream through the engine in the Amaranth simulator, :mod:`.engine_tb`
through the Verilated Verilog under cocotb (built and run by :mod:`.sim`);
both read the engine's state back through :mod:`.state`.
"""
