"""The hardware model: accelerators, nodes, networks, efficiency models and primitive costs.

Modules: :mod:`.efficiency` (efficiency sum type), :mod:`.collectives` (collective cost on a
link), :mod:`.system` (``SystemSpec``, rank placement, compute / memory / collective times),
:mod:`.presets` (``SYSTEM_PRESETS``), :mod:`.system_mapping` (``[system]`` sections and files),
:mod:`.calculon` (building a system from a Calculon system JSON).
"""
