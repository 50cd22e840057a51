"""``rfsgen sample``."""

from __future__ import annotations

import click

from . import main, translate_errors, _Progress
from ._budget import max_memory_option


@main.command("sample")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.option("-n", "--columns", type=int, required=True, help="Number of output columns D (unique features).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random generator.")
@click.option("--scheme", type=click.Choice(["rfs", "strat", "rr", "orf"]), default="rfs", show_default=True,
              help="rfs: the compositional scheme; strat: rfs with stratified degrees, child picks and "
                   "sphere codes (unbiased, lower error); rr / orf: Rahimi-Recht / orthogonal random features "
                   "wherever a node is a Gaussian on normalized sphere inputs (exp over sphere nodes).")
@click.option("-o", "--output", required=True, help="Feature file to write (.h5).")
@click.option("--width", type=int, help="Bind a 'width: auto' skeleton to rows of this many values.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
def sample_cmd(skeleton, columns, seed, scheme, output, width, overwrite, quiet):
    """Sample D deduplicated random features for SKELETON into a feature file.

    Draws features by the paper's RFSS recursion until the D-th distinct column
    appears; identical columns are merged with weight count/q.  The same
    skeleton, seed and D give a byte-identical file.

    \b
    Example:
      rfsgen sample skeletons/cifar-deep.yaml -n 10000 --seed 1 -o feats.h5
    """
    from ..sampler import sample_file

    with _Progress(columns, "col", quiet, "sample") as bar:
        fs = sample_file(skeleton, columns, seed, output, scheme=scheme, width=width, overwrite=overwrite,
                         progress=bar)
    if not quiet:
        click.echo(f"wrote {fs.columns} columns from {fs.draws} draws (dedup ratio {fs.draws / fs.columns:.2f}) to {output}", err=True)
