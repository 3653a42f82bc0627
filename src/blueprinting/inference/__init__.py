"""Inference analysis: prefill, decode, the ForwardOnly pipeline, KV cache, memory, search."""
