"""Blueprinting: plan Megatron-style parallel strategies for transformers before running them."""

__version__ = "0.1.0"
