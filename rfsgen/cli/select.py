"""``rfsgen select``."""

from __future__ import annotations

import click

from . import main, translate_errors, _Progress
from ._budget import max_memory_option, threads_option


@main.command("select")
@click.argument("features", type=click.Path(dir_okay=False))
@click.argument("rows", metavar="ROWS")
@click.argument("labels", required=False, metavar="[LABELS]")
@click.option("-n", "--columns", type=int, required=True, help="Number of columns D to keep.")
@click.option("--method", type=click.Choice(["eerf", "lkrf", "corr", "eerf-norm", "greedy"]), default="eerf", show_default=True,
              help="eerf: top D by alignment with the labels (Shahrampour et al. 2018); lkrf: learned weights "
                   "under a chi-square bound --rho, top D by weight (Sinha and Duchi 2016); corr: top D by the "
                   "share of each feature's variance the labels explain (for standardised linear models); "
                   "eerf-norm: eerf's score over the feature's mean square; greedy: forward selection, each "
                   "step the column that best explains the labels' residual after the columns already kept "
                   "(accounts for redundant columns; the best measured before standardised linear models; needs "
                   "the pool's N0 x N0 Gram matrix in memory).")
@click.option("--rho", type=float, help="lkrf: the divergence bound (default: N0/D - 1).")
@click.option("--task", type=click.Choice(["auto", "classification", "regression"]), default="auto",
              show_default=True, help="auto: classification unless the labels are non-integer numbers.")
@click.option("--label-column", type=int, help="Take the labels from this column of ROWS (0-based; negative counts "
              "from the end) instead of LABELS; the other columns are the features' input.")
@click.option("--pool-factor", type=int, default=10, show_default=True,
              help="When FEATURES is a skeleton: sample a pool of this many times D columns from it first.")
@click.option("--seed", type=int, default=0, show_default=True, help="When FEATURES is a skeleton: the pool's seed.")
@click.option("--scheme", type=click.Choice(["rfs", "strat", "rr", "orf", "eof"]), default="rfs", show_default=True,
              help="When FEATURES is a skeleton: the pool's sampling scheme.")
@click.option("--chunk-rows", type=int, default=None, help="Rows per chunk (default: about 64 MiB of work); the "
              "result does not depend on it.")
@click.option("-o", "--output", required=True, help="Feature file to write (.h5).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
@threads_option
def select_cmd(features, rows, labels, columns, method, rho, task, label_column, pool_factor, seed, scheme,
               chunk_rows, output, overwrite, quiet):
    """Keep the D columns of the pool FEATURES that align best with the labels.

    FEATURES is a feature file (the pool, e.g. 10 x D columns from 'rfsgen
    sample') or a skeleton (a pool of --pool-factor x D columns is sampled
    first).  ROWS are training rows (any input 'rfsgen transform' reads,
    streamed); LABELS one label per row: .npy, .csv/.txt (one per line, class
    names allowed) or .h5[:/dataset], or use --label-column.  The output is an
    ordinary feature file: transform, merge and Dask use it unchanged.

    \b
    Example:
      rfsgen sample cifar-deep -n 40960 -o pool.h5
      rfsgen select pool.h5 train.npy labels.npy -n 4096 --method eerf -o eerf.h5
      rfsgen select pool.h5 train.npy labels.csv -n 4096 --method lkrf --rho 9 -o lkrf.h5
      rfsgen select mnist-conv train.npy labels.npy -n 1024 --method corr -o corr.h5
      rfsgen select mnist-conv train.npy labels.npy -n 1024 --method greedy -o greedy.h5
      rfsgen select pool.h5 table.csv -n 512 --label-column -1 --task regression -o reg.h5
    """
    import sys

    from ..errors import UsageError
    from ..select import select_file

    if chunk_rows is not None and chunk_rows < 1:
        raise UsageError(f"--chunk-rows must be at least 1, got {chunk_rows}")
    with _Progress(None, "rows", quiet, "select") as bar:
        fs = select_file(features, rows, labels, output, columns, method=method, rho=rho, task=task, seed=seed,
                         pool_factor=pool_factor, scheme=scheme, label_column=label_column, chunk_rows=chunk_rows,
                         overwrite=overwrite, progress=bar, command="rfsgen " + " ".join(sys.argv[1:]))
    if not quiet:
        sel = fs.stats["selection"]
        click.echo(f"kept {fs.columns} of {sel['pool_columns']} columns ({method}, {sel['task']}, {sel['rows']} rows) "
                   f"in {output}", err=True)
