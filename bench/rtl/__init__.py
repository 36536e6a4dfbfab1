"""RTL benchmarks: throughput, latency and simulation speed of the Verilated switch (``python -m bench rtl``)."""
