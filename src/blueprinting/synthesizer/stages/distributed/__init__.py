"""DistributedTaskIR: one local tensor-parallel block as tasks (see ir.py, passes.py)."""
