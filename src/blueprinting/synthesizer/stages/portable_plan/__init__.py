"""PortablePlanIR: costed, target-neutral critical paths of the local block and pipeline chunks."""
