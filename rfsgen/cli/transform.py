"""``rfsgen transform``."""

from __future__ import annotations

import os

import click

from ..errors import UsageError, install_hint
from . import main, translate_errors, _Progress
from ._budget import max_memory_option, threads_option


@main.command("transform")
@click.argument("features", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.option("-o", "--output", required=True, help="Output HDF5 file.")
@click.option("--layout", type=click.Choice(["auto", "csr", "dense"]), default="auto", show_default=True,
              help="csr: group X in the anndata/scipy CSR encoding; dense: 2-D dataset X; auto: dense when at least "
                   "half the feature file's columns are almost surely non-zero, else csr ('rfsgen inspect' says "
                   "which).")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@click.option("--compression", type=click.Choice(["none", "gzip", "lzf"]), default="none", show_default=True,
              help="HDF5 compression (these features compress poorly; off by default).")
@click.option("--chunk-rows", type=int, default=None, help="Rows per chunk (default: about 64 MiB of work).")
@click.option("--rows", help="Only rows START:STOP of INPUT (for sharded batch jobs).")
@click.option("--shard", metavar="K/N", help="Only the K-th (from 0) of N nearly equal contiguous row ranges, "
              "e.g. --shard ${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}.")
@click.option("--dask-scheduler", "--scheduler", "dask_scheduler", metavar="tcp://HOST:PORT", envvar="RFSGEN_SCHEDULER",
              help="Compute on this running Dask cluster (default: $RFSGEN_SCHEDULER; without either, here: Dask's "
                   "own DASK_SCHEDULER_ADDRESS is not used); the output is the same "
                   "file as a local run's. Dense uncompressed rows are written by the workers straight into the "
                   "output (its directory shared with them); otherwise the workers write their row ranges as shards "
                   "into a directory they share with this process (--shard-dir), which are then verified and merged "
                   "here and removed; where they cannot see it, the chunks come here and are written here. Needs "
                   "the 'dask' extra here and rfsgen on the workers.")
@click.option("--shard-dir", metavar="DIR", type=click.Path(file_okay=False),
              help="With --dask-scheduler: where the workers write their shards (a directory on a file system "
                   "every worker and this process share; default: OUTPUT's directory, where dense uncompressed "
                   "rows are written in place instead). The shards live in a hidden directory there, removed when "
                   "the run ends, whether it succeeds or fails.")
@click.option("--dask-gather", is_flag=True,
              help="With --dask-scheduler: send the computed chunks to this process and write them here (for "
                   "workers without a shared file system; at most 4 chunks are on the cluster at a time).")
@click.option("--obsm", metavar="KEY", help="For an .h5ad INPUT: write a copy of it (X, obs, var, layers, ... as they "
              "are) with the features of every row as obsm[KEY] and their provenance as uns['rfsgen'][KEY].")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True,
              help="cuda: compute the gaussian and laplace atoms (angles, cos, sin) and the products into "
                   "columns on a GPU through numba's CUDA target, the rest here on the CPU; the output is the same bytes (docs/performance.md). auto: cuda "
                   "where numba finds a GPU, else cpu (the last line says which). cuda without a GPU fails, writing "
                   "nothing. With --dask-scheduler each worker resolves it where it runs.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
@threads_option
def transform_cmd(features, input, output, layout, dtype, compression, chunk_rows, rows, shard, dask_scheduler,
                  shard_dir, dask_gather, obsm, device, overwrite, quiet):
    """Stream rows of INPUT through FEATURES into an HDF5 file.

    INPUT may be .npy (memory-mapped), .npz[:key] (a scipy.sparse.save_npz
    matrix too), .h5[:/path] (a dataset or an anndata CSR group), .h5ad[:/path]
    (its X by default, or e.g. :/layers/counts), .csv/.tsv or '-' for standard
    input.  Memory is bounded by the chunk; the output is identical whatever
    --chunk-rows is.  FEATURES comes first: the file 'rfsgen sample' wrote.

    \b
    Example:
      rfsgen transform feats.h5 rows.npy -o out.h5 --rows 0:50000
      rfsgen transform feats.h5 rows.npy -o part-3.h5 --shard 3/8
      rfsgen transform feats.h5 cells.h5ad -o cell-features.h5
      rfsgen transform feats.h5 cells.h5ad -o cells-with-features.h5ad --obsm X_rfsgen
      rfsgen transform feats.h5 sparse.npz -o out.h5
      cat rows.csv | rfsgen transform feats.h5 - -o out.h5 --layout dense
      rfsgen transform feats.h5 rows.npy -o out.h5 --dask-scheduler tcp://10.0.0.5:8786
      rfsgen transform feats.h5 rows.npy -o out.h5 --dask-scheduler tcp://10.0.0.5:8786 --shard-dir /scratch/me
    """
    options = dict(layout=layout, dtype=dtype, compression=compression, chunk_rows=chunk_rows, rows=rows,
                   shard=shard, overwrite=overwrite)
    if obsm is not None:
        options["obsm"] = obsm
    if dask_scheduler:
        try:
            from ..dask import transform_file
        except ImportError as e:
            raise UsageError(f"--dask-scheduler needs dask and distributed ({e}); install them with "
                             f"{install_hint('dask')}") from None
        options["scheduler"] = dask_scheduler
        options["shard_dir"] = shard_dir
        options["gather"] = dask_gather
        options["quiet"] = quiet  # Dask's own warnings and log lines: none with -q
        options["device"] = device  # resolved by each worker
        where = f"on the Dask cluster at {dask_scheduler}"
    else:
        if shard_dir is not None or dask_gather:
            raise UsageError(f"{'--shard-dir' if shard_dir is not None else '--dask-gather'} needs --dask-scheduler "
                             "(or RFSGEN_SCHEDULER)")
        from .._compiled import threads
        from ..transform import transform_file

        options["device"] = device
        where = f"here on {threads()} thread{'s' if threads() > 1 else ''}"
        if os.environ.get("DASK_SCHEDULER_ADDRESS", "").strip():
            where += " (DASK_SCHEDULER_ADDRESS is not used: pass --scheduler or set RFSGEN_SCHEDULER for a cluster)"

    with _Progress(None, "rows", quiet, "transform") as bar:
        info = transform_file(features, input, output, progress=bar, **options)
    if info.get("device", "cpu") != "cpu":  # which device: said even with --quiet
        click.echo(f"rfsgen: device: {info['device']}", err=True)
    if info.get("clipped"):  # EOF rows outside the feature file's box: never silent, even with --quiet
        click.echo(f"rfsgen: warning: {info['clipped']} values outside the feature file's domain were clipped to it "
                   "(recorded as the output's 'clipped_values' attribute)", err=True)
    if not quiet:
        out = f"{output} (obsm['{info['obsm']}'])" if info.get("obsm") else output
        click.echo(f"wrote {info['rows']} rows x {info['columns']} columns ({info['nnz']} stored values) to {out}, "
                   f"computed {where}", err=True)
