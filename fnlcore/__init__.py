"""fnlcore: the library behind FNL-Repro.

Everything the Snakemake workflow does is implemented here and importable
without Snakemake: datasets, partitions, label noise, (later) the FL engine,
methods and tables.
"""

__version__ = "0.1.0"
