"""The decoder-only transformer dialect: semantic block, TP work algebra, derivation."""
