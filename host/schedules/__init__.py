"""GPU-side collective schedules: an IR, generators, an executor and a cost model."""
