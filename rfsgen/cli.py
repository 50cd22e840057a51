"""The ``rfsgen`` command line: thin wrappers over the library.

Each command parses options, makes one library call and translates
:class:`~rfsgen.errors.RfsgenError` into a one-line message on stderr with exit
code 2 (usage) or 1 (runtime).
"""

from __future__ import annotations

import functools
import json
import sys

import click

from . import __version__
from .errors import RfsgenError


def _fail(message: str, code: int):
    click.echo(f"rfsgen: error: {message}", err=True)
    sys.exit(code)


def _stdout_closed():
    """The reader of stdout went away (``| head``): stop quietly, as a program killed by
    SIGPIPE would (exit 141), without Python's complaint when it flushes at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(141)


def translate_errors(fn):
    """Map library errors, interruptions and closed pipes to one-line messages and exit codes:
    usage errors 2, runtime errors 1, Ctrl-C 130, SIGTERM 143, SIGHUP 129, closed stdout 141."""
    from ._signals import Terminated

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RfsgenError as e:
            _fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted; no output was written", 130)
        except Terminated as t:
            _fail(f"terminated by {t.name}; no output was written", t.exit_code)
        except BrokenPipeError:
            _stdout_closed()

    return wrapper


class _Progress:
    """A tqdm bar on stderr, silent when stderr is not a terminal or with --quiet.

    The library reports work with ``progress(n)`` and may announce a total or a new
    phase (e.g. sampling, then writing the file) with ``progress.phase(name, total)``.
    """

    def __init__(self, total, unit, quiet, desc):
        self.bar = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc=desc, file=sys.stderr, leave=False)

    def __call__(self, n):
        if self.bar is not None:
            self.bar.update(n)

    def phase(self, name, total):
        if self.bar is not None:
            self.bar.reset(total=total)
            self.bar.set_description(name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def _emit_json(obj):
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=float))


class _Group(click.Group):
    """Click's usage errors (unknown options, bad values) as one line, exit code 2."""

    def main(self, args=None, prog_name=None, **kwargs):
        from .errors import one_line

        kwargs.pop("standalone_mode", None)
        try:
            return super().main(args, prog_name, standalone_mode=False, **kwargs)
        except click.UsageError as e:
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            _fail(one_line(e.format_message()) + where, 2)
        except click.Abort:
            _fail("interrupted; no output was written", 130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rfsgen")
def main():
    """Random features for compositional kernels.

    \b
    Describe a kernel as a YAML computation skeleton, then:
      rfsgen skeleton skeletons/cifar-deep.yaml           # validate and describe
      rfsgen kernel skeletons/cifar-deep.yaml rows.npy -o K.npy
      rfsgen sample skeletons/cifar-deep.yaml -n 10000 --seed 1 -o feats.h5
      rfsgen transform feats.h5 rows.npy -o out.h5
    """


@main.command("skeleton")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable description.")
@click.option("--width", type=int, help="Bind a 'width: auto' skeleton to rows of this many values.")
@translate_errors
def skeleton_cmd(skeleton, as_json, width):
    """Validate SKELETON and describe the kernel it defines.

    Prints node counts per layer, fan-in, depth, input width, the complexity
    C(S) (expected factors per feature) and each layer's activation or base.

    \b
    Example:
      rfsgen skeleton skeletons/cifar-deep.yaml
    """
    from .skeleton import load_skeleton

    skel = load_skeleton(skeleton)
    info = (skel.bind(width) if width is not None else skel).describe()
    if as_json:
        _emit_json(info)
        return
    if info["width"] == "auto":
        click.echo(f"skeleton   {info['path']}")
        click.echo("input      width auto: the structure is built for the data's width (at fit, kernel, or")
        click.echo("           sample --width N); pass --width N to see it for N columns")
        return
    shape = f" (shape {info['shape']})" if info["shape"] else ""
    click.echo(f"skeleton   {info['path']}")
    click.echo(f"input      width {info['width']}{shape}")
    click.echo(f"nodes      {info['nodes']} ({info['input_nodes']} input, {info['internal_nodes']} internal)")
    click.echo(f"depth      {info['depth']}")
    click.echo(f"output     {info['output']}")
    click.echo(f"C(S)       {info['complexity']:.6g} expected factors per feature")
    if info["unused_input_nodes"]:
        click.echo(f"unused     {info['unused_input_nodes']} input nodes feed nothing and were pruned")
    click.echo("")
    click.echo(f"{'layer':<12} {'kind':<7} {'shape':<10} {'nodes':>6} {'fan-in':>9}  what")
    for layer in info["layers"]:
        shape = "x".join(map(str, layer["shape"])) or "1"
        if "base" in layer:
            fan = "-"
            what = f"{layer['base']}, {layer['columns_per_node']} columns/node, C = {layer['norm_bound']:.4g}"
        else:
            lo, hi = layer["fan_in"]
            fan = str(lo) if lo == hi else f"{lo}-{hi}"
            what = f"{layer['activation']}, sigma'(1) = {layer['derivative_at_one']:.4g}"
            if layer["truncation"]:
                what += f", series truncated (dropped mass {layer['truncation']:.2g})"
        click.echo(f"{layer['name']:<12} {layer['kind']:<7} {shape:<10} {layer['nodes']:>6} {fan:>9}  {what}")


@main.command("kernel")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.argument("input2", metavar="[INPUT2]", required=False)
@click.option("-o", "--output", required=True, help="Output .npy file for the kernel matrix ('-' for stdout).")
@click.option("--rows", help="Use only rows START:STOP of INPUT (and of INPUT2).")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
def kernel_cmd(skeleton, input, input2, output, rows, overwrite, quiet):
    """Evaluate the exact kernel of SKELETON between rows of INPUT and INPUT2.

    Writes the float64 matrix K[i, j] = k(INPUT[i], INPUT2[j]) as .npy
    (INPUT2 defaults to INPUT).  INPUT may be .npy, .npz[:key], .h5[:/path],
    .csv/.tsv or '-' for standard input.

    \b
    Example:
      rfsgen kernel skeletons/shallow-gaussian.yaml rows.npy -o K.npy
    """
    from .kernel import kernel_files

    with _Progress(None, "rows", quiet, "kernel") as bar:
        kernel_files(skeleton, input, input2, output, rows=rows, overwrite=overwrite, progress=bar)


@main.command("sample")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.option("-n", "--columns", type=int, required=True, help="Number of output columns D (unique features).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random generator.")
@click.option("--scheme", type=click.Choice(["rfs", "rr", "orf"]), default="rfs", show_default=True,
              help="rfs: the compositional scheme; rr / orf: Rahimi-Recht / orthogonal random features "
                   "wherever a node is a Gaussian on normalized sphere inputs (exp over sphere nodes).")
@click.option("-o", "--output", required=True, help="Feature file to write (.h5).")
@click.option("--width", type=int, help="Bind a 'width: auto' skeleton to rows of this many values.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
def sample_cmd(skeleton, columns, seed, scheme, output, width, overwrite, quiet):
    """Sample D deduplicated random features for SKELETON into a feature file.

    Draws features by the paper's RFSS recursion until the D-th distinct column
    appears; identical columns are merged with weight count/q.  The same
    skeleton, seed and D give a byte-identical file.

    \b
    Example:
      rfsgen sample skeletons/cifar-deep.yaml -n 10000 --seed 1 -o feats.h5
    """
    from .sampler import sample_file

    with _Progress(columns, "col", quiet, "sample") as bar:
        fs = sample_file(skeleton, columns, seed, output, scheme=scheme, width=width, overwrite=overwrite,
                         progress=bar)
    if not quiet:
        click.echo(f"wrote {fs.columns} columns from {fs.draws} draws (dedup ratio {fs.draws / fs.columns:.2f}) to {output}", err=True)


@main.command("inspect")
@click.argument("features", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output with stable keys.")
@translate_errors
def inspect_cmd(features, as_json):
    """Summarise a feature file: columns, draws, dedup ratio, terms, node usage.

    \b
    Example:
      rfsgen inspect feats.h5 --json
    """
    from .features import describe, load

    info = describe(load(features), features)
    if as_json:
        _emit_json(info)
        return
    rows = [
        ("file", f"{info['path']} ({info['file_bytes']} bytes, {info['bytes_per_column']:.2f} bytes/column)"),
        ("skeleton", info["skeleton"]),
        ("sampler", f"scheme {info['scheme']}, seed {info['seed']}, rfsgen {info['tool_version']}"),
        ("columns", f"{info['columns']} ({info['kinds']['real']} real, {info['kinds']['cos']} cos, {info['kinds']['sin']} sin)"),
        ("features", f"{info['features']} distinct term sets"),
        ("draws", f"{info['draws']} (dedup ratio q/D = {info['dedup_ratio']:.3f})"),
        ("constant", f"weight {info['constant_weight']:.6f}"),
        ("terms", f"mean {info['mean_terms']:.3f} per column, max {info['max_terms']}"),
        ("factors", f"mean {info['mean_factors_per_draw']:.4f} per draw before combining; C(S) = {info['complexity']:.4g}"),
        ("out degree", " ".join(f"{i}:{c}" for i, c in enumerate(info["output_degree_histogram"] or []) if c)),
        ("input nodes", f"{info['input_nodes_used']} of {info['input_nodes']} used; most used: "
         + ", ".join(f"{t['node']} ({t['terms']})" for t in info["top_input_nodes"])),
        ("command", info["command"]),
    ]
    for k, v in rows:
        click.echo(f"{k:<12} {v}")


@main.command("transform")
@click.argument("features", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.option("-o", "--output", required=True, help="Output HDF5 file.")
@click.option("--layout", type=click.Choice(["csr", "dense"]), default="csr", show_default=True,
              help="csr: group X in the anndata/scipy CSR encoding; dense: 2-D dataset X.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@click.option("--compression", type=click.Choice(["none", "gzip", "lzf"]), default="none", show_default=True,
              help="HDF5 compression (these features compress poorly; off by default).")
@click.option("--chunk-rows", type=int, default=None, help="Rows per chunk (default: about 64 MiB of work).")
@click.option("--rows", help="Only rows START:STOP of INPUT (for sharded batch jobs).")
@click.option("--shard", metavar="K/N", help="Only the K-th (from 0) of N nearly equal contiguous row ranges, "
              "e.g. --shard ${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
def transform_cmd(features, input, output, layout, dtype, compression, chunk_rows, rows, shard, overwrite, quiet):
    """Stream rows of INPUT through FEATURES into an HDF5 file.

    INPUT may be .npy (memory-mapped), .npz[:key], .h5[:/path], .csv/.tsv or
    '-' for standard input.  Memory is bounded by the chunk; the output is
    identical whatever --chunk-rows is.

    \b
    Example:
      rfsgen transform feats.h5 rows.npy -o out.h5 --rows 0:50000
      rfsgen transform feats.h5 rows.npy -o part-3.h5 --shard 3/8
      cat rows.csv | rfsgen transform feats.h5 - -o out.h5 --layout dense
    """
    from .transform import transform_file

    with _Progress(None, "rows", quiet, "transform") as bar:
        info = transform_file(features, input, output, layout=layout, dtype=dtype, compression=compression,
                              chunk_rows=chunk_rows, rows=rows, shard=shard, overwrite=overwrite, progress=bar)
    if not quiet:
        click.echo(f"wrote {info['rows']} rows x {info['columns']} columns ({info['nnz']} stored values) to {output}", err=True)


@main.command("approx")
@click.argument("skeleton", type=click.Path(dir_okay=False))
@click.argument("input", metavar="INPUT")
@click.option("-n", "--columns", "budgets", required=True, help="Budgets D: 256,1024,4096 or 2^8..2^15.")
@click.option("--trials", type=int, default=10, show_default=True, help="Random row subsets (and feature maps).")
@click.option("--subset", type=int, default=128, show_default=True,
              help="Rows drawn at random per trial (the kernel matrices are SUBSET x SUBSET).")
@click.option("--rows", help="Draw only from rows START:STOP of INPUT.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--scheme", "schemes", multiple=True, type=click.Choice(["rfs", "rr", "orf"]),
              help="Schemes to compare (repeatable; default rfs).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
@click.option("--plot", "plot_path", help="Write a Figure-3-style PNG (needs matplotlib).")
@click.option("--overwrite", is_flag=True, help="Replace the --plot file if it exists.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@translate_errors
def approx_cmd(skeleton, input, budgets, trials, subset, rows, seed, schemes, as_json, plot_path, overwrite, quiet):
    """How well random features approximate SKELETON's kernel on rows of INPUT.

    For each trial, draws --subset rows at random, samples a fresh feature map
    per budget and scheme, and compares Psi Psi^T with the exact kernel over all
    entries: mean absolute error, RMS error, max absolute error, correlation
    (mean and standard deviation over trials), and the draws q per map.

    \b
    Example:
      rfsgen approx skeletons/shallow-gaussian.yaml rows.npy -n 2^8..2^12 \\
          --scheme rfs --scheme rr --trials 5 --subset 64 --plot fig3.png
    """
    from pathlib import Path

    from .approx import approx, check_plotting, format_table, parse_budgets, plot
    from .errors import OutputExistsError
    from .io import check_width, open_input, resolve_rows
    from .skeleton import load_skeleton

    skel = load_skeleton(skeleton)
    d = parse_budgets(budgets)
    if plot_path:  # fail before the computing, not after it
        check_plotting()
        if Path(plot_path).exists() and not overwrite:
            raise OutputExistsError(f"{plot_path}: already exists; pass --overwrite to replace it")
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
        plot(records, plot_path, title=skel.path)
    if as_json:
        _emit_json(records)
    else:
        click.echo(format_table(records))


if __name__ == "__main__":  # pragma: no cover
    main()
