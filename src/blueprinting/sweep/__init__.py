"""Co-design sweeps (issue 16): one full strategy search per cell of models x systems x GPU
counts x global batches x sequence lengths, run as Ray tasks, rows kept under an output folder so
that a killed sweep resumes where it stopped.

``definition.py`` (the grid and its validation), ``cell.py`` (one cell: the search and its row),
``store.py`` (Parquet/CSV journal and resume), ``engine.py`` (Ray), ``runner.py`` (the whole run),
``plot.py`` (the figures).
"""
