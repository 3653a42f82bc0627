"""Validation of Blueprinting's figures: published measured runs, the Calculon oracle and
regression digests (issue #5).

``published`` loads the measured-run fixture, ``comparison`` scores a predictor against it,
``calculon`` reads and translates the Calculon oracle, ``measured_memory`` loads measured GPU
memory of Megatron runs and scores the memory model on it (issue 19), ``layer_terms`` splits
Korthikanti Table 4 into the planner's terms (what the A100 GEMM fraction absorbs, issue 15),
``digests`` keeps reports stable; ``fields`` holds the typed field readers their loaders share.
"""
