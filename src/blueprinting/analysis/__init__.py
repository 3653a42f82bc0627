"""Iteration, memory and FLOPs analysis composed from the typed program and PortablePlanIR."""
