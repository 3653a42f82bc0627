"""Iteration analysis: FLOPs conventions, memory per GPU, iteration time."""
