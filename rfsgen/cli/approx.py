"""``rfsgen approx``."""

from __future__ import annotations

import click

from . import echo, main, translate_errors, _Progress, _emit_json
from ._budget import max_memory_option, threads_option
from ._params import set_option


@main.command("approx")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.option("-n", "--columns", "budgets", required=True, multiple=True,
              help="Budgets D: 256,1024,4096 or 2^8..2^15; repeatable (-n 1024 -n 4096: one row each).")
@click.option("--trials", type=int, default=10, show_default=True, help="Random row subsets (and feature maps).")
@click.option("--subset", type=int, default=128, show_default=True,
              help="Rows drawn at random per trial (the kernel matrices are SUBSET x SUBSET).")
@click.option("--rows", help="Draw only from rows START:STOP of INPUT.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--scheme", "schemes", multiple=True, type=click.Choice(["rfs", "strat", "exact", "rr", "orf", "eof"]),
              help="Schemes to compare (repeatable; default rfs).  eof is compared with the kernel it "
                   "converges to, on the node's stated domain or the input rows' box (5% margin).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
@click.option("--plot", "plot_path", help="Write a Figure-3-style PNG (needs matplotlib).")
@click.option("--overwrite", is_flag=True, help="Replace the --plot file if it exists.")
@set_option
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
@max_memory_option
@threads_option
def approx_cmd(skeleton, input, budgets, trials, subset, rows, seed, schemes, as_json, plot_path, params, overwrite,
               quiet):
    """How well random features approximate SKELETON's kernel on rows of INPUT.

    For each trial, draws --subset rows at random, samples a fresh feature map
    per budget and scheme, and compares Psi Psi^T with the exact kernel over all
    entries: mean absolute error, RMS error, max absolute error, correlation
    (mean and standard deviation over trials), and the draws q per map.
    SKELETON is a YAML file or a shipped skeleton's name (see 'rfsgen skeletons').

    \b
    Example:
      rfsgen approx shallow-gaussian rows.npy -n 2^8..2^12 \\
          --scheme rfs --scheme rr --trials 5 --subset 64 --plot fig3.png
    """
    from contextlib import ExitStack

    from ..approx import approx, check_plotting, format_table, parse_budgets, plot, plot_format
    from ..atomic import atomic_path
    from ..inputs import check_width, open_input, resolve_rows
    from ..skeleton import load_skeleton

    skel = load_skeleton(skeleton, params=params)
    d = parse_budgets(budgets)  # every -n given, in order (a sweep), never only the last
    with ExitStack() as stack:
        tmp = fmt = None
        if plot_path:  # every check of the output before the computing, not after it
            check_plotting()
            # One of the inputs, exists without --overwrite, a directory, no such directory:
            # refused here; the figure is written to a temporary file moved into place.
            tmp = stack.enter_context(atomic_path(plot_path, overwrite, inputs=[skeleton, input]))
            fmt = plot_format(plot_path)
        with open_input(input) as src:
            if not skel.bound:
                skel = skel.bind(src.width)
            check_width(src, skel.width, skel.path, skel.shape)
            start, stop = resolve_rows(rows, src.n_rows, src.name)
            x = src.read(start, stop)
        schemes = schemes or ("rfs",)
        with _Progress(trials * len(d) * len(schemes), "map", quiet, "approx") as bar:
            records = approx(skel, x, d, trials=trials, rows=subset, seed=seed, schemes=schemes, progress=bar)
        if plot_path:
            plot(records, tmp, title=skel.path, format=fmt)
    if as_json:
        _emit_json(records)
    else:
        echo(format_table(records))
