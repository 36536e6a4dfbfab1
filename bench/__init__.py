"""Benchmarks. Each writes its figures, and the command that measured them, to docs/results/."""
