"""Paper tables as data, reproduced beside reported.

* :mod:`.spec` — :class:`TableSpec` with its :class:`RowSpec`, :class:`ColumnSpec`
  and :class:`MetricSpec` (cells are (row label, column label, metric name));
* :mod:`.reported` — :func:`load_reported` reads a long-format reported CSV,
  :func:`place_reported` puts its numbers into cells;
* :mod:`.aggregate` — :func:`aggregate_runs`: mean ± std over seeds per cell;
* :mod:`.render` — :func:`render` builds a :class:`RenderedTable` (long table,
  CSV / Markdown / HTML writers, all atomic);
* :mod:`.curves` — :func:`plot_curves`: metric over rounds per run.

Pure numpy/pandas/matplotlib: no Snakemake, no torch.
"""

from .aggregate import aggregate_runs
from .curves import curve_stats, plot_curves
from .reported import REQUIRED_COLUMNS, copy_reported, load_reported, place_reported
from .render import STATUSES, RenderedTable, render
from .spec import ColumnSpec, MetricSpec, RowSpec, TableSpec

__all__ = [
    "ColumnSpec",
    "MetricSpec",
    "REQUIRED_COLUMNS",
    "RenderedTable",
    "RowSpec",
    "STATUSES",
    "TableSpec",
    "aggregate_runs",
    "copy_reported",
    "curve_stats",
    "load_reported",
    "place_reported",
    "plot_curves",
    "render",
]
