"""Derivation of parallel block plans from typed strategies (dialects) through staged IRs."""
