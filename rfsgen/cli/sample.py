"""``rfsgen sample``."""

from __future__ import annotations

import click

from . import main, translate_errors, _Progress
from ..errors import UsageError
from ._budget import max_memory_option, threads_option
from ._params import set_option


@main.command("sample")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.option("-n", "--columns", type=int, help="Number of output columns D (unique features); required "
              "except for --scheme eof --level N.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random generator.")
@click.option("--scheme", type=click.Choice(["rfs", "strat", "exact", "rr", "orf", "eof"]), default="rfs", show_default=True,
              help="rfs: the compositional scheme; strat: rfs with stratified degrees, child picks and "
                   "sphere codes (unbiased, lower error); exact: strat with the features of degree 0 and 1 "
                   "enumerated with their exact probabilities as float column weights (half of -n at most; "
                   "docs/exact-degrees.md); rr / orf: Rahimi-Recht / orthogonal random features "
                   "wherever a node is a Gaussian on normalized sphere inputs (exp over sphere nodes); without such a node, "
                   "orf draws every gaussian input node's frequencies orthogonally; orf ends only on "
                   "whole (cos, sin) pairs, so it gives -n or -n + 1 columns (an odd -n gives -n + 1 unless a column repeats); eof: entropic optimal features of a skeleton whose kernel is one "
                   "laplace (pinned on the box's faces) or brownian node (sparse, deterministic).")
@click.option("--level", type=int, help="eof: take the whole sparse grid of this level (instead of -n).")
@click.option("--domain-from", "domain_from", metavar="ROWS",
              help="eof: the node's box is each column's min..max over these training rows, widened by --margin.")
@click.option("--margin", type=float, help="eof: with --domain-from, the widening on each side as a fraction of "
              "the column's range (default 0.05).")
@click.option("-o", "--output", required=True, help="Feature file to write (.h5).")
@click.option("--width", type=int, help="Bind a 'width: auto' skeleton to rows of this many values.")
@set_option
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
@threads_option
def sample_cmd(skeleton, columns, seed, scheme, level, domain_from, margin, output, width, params, overwrite, quiet):
    """Sample D deduplicated random features for SKELETON into a feature file.

    SKELETON is a YAML file or a shipped skeleton's name (see 'rfsgen skeletons').

    Draws features by the paper's RFSS recursion until the D-th distinct column
    appears; identical columns are merged with weight count/q.  The same
    skeleton, seed and D give a byte-identical file.

    \b
    Example:
      rfsgen sample cifar-deep -n 10000 --seed 1 -o feats.h5
      rfsgen sample tabular-auto --width 64 -n 4096 --set scale=0.3 -o tab.h5
      rfsgen sample laplace.yaml --scheme eof --level 3 --domain-from train.npy -o eof.h5
    """
    from ..kinds import for_scheme, taking
    from ..sampler import sample_file

    kind = for_scheme(scheme)
    options = {k: v for k, v in (("level", level), ("domain_from", domain_from), ("margin", margin)) if v is not None}
    foreign = [k for k in options if k not in kind.options]  # another kind's options
    if foreign:
        raise UsageError(f"--{foreign[0].replace('_', '-')} is for --scheme {taking(foreign[0]).schemes[0]}")
    if columns is None and kind.needs_columns:
        raise UsageError("missing option -n / --columns (the number of features D)")
    with _Progress(columns, "col", quiet, "sample") as bar:
        fs = sample_file(skeleton, columns, seed, output, scheme=scheme, width=width, overwrite=overwrite,
                         progress=bar, params=params, **options)
    if not quiet:
        click.echo(f"wrote {fs.columns} columns from {fs.draws} draws (dedup ratio {fs.draws / fs.columns:.2f}) to {output}", err=True)
