"""Typed strategies, models and the laws that relate them."""

# transformer.py re-exports from flat_keys.py and laws.py, which import transformer.py; importing it
# here first makes any import order of the submodules resolve the cycle the same way.
from blueprinting.mapping import transformer as transformer
