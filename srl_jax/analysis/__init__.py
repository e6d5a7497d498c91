"""Analysis of finished runs: load run directories into pandas, summarize, compare, plot.

A run directory holds everything needed to judge a run after the fact
(`config.yaml`, `metrics.jsonl`, `status.json`), but each question (did it
learn, how fast, did seed 2 do as well as seed 1, does doubling the actors
help) otherwise means hand-written parsing. This package turns one or many run
directories into a single DataFrame (one row per metrics row, with the run's
flattened config as `config.<dotted.key>` columns), and answers the usual
questions with small pure functions over it: `summarize` one run, `compare`
runs grouped by a config key, and `plot_curves` with a mean and a confidence
band over seeds.

It needs pandas and matplotlib (`pip install srl-jax[analysis]`) and never
imports JAX, so it runs anywhere the run directory can be read.
"""

from srl_jax.analysis.plots import plot_curves, plot_population
from srl_jax.analysis.runs import (
    CONFIG_PREFIX,
    RETURN,
    compare,
    curves,
    flatten_config,
    load_lineage,
    load_population,
    load_run,
    load_runs,
    summarize,
    summary_table,
)

__all__ = [
    "CONFIG_PREFIX",
    "RETURN",
    "compare",
    "curves",
    "flatten_config",
    "load_lineage",
    "load_population",
    "load_run",
    "load_runs",
    "plot_curves",
    "plot_population",
    "summarize",
    "summary_table",
]
