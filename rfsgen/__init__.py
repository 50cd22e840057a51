"""rfsgen: random features for compositional kernels.

The library behind the ``rfsgen`` command.  Typical use::

    import rfsgen
    skel = rfsgen.load_skeleton("cifar-deep")          # a shipped skeleton, or a path
    K = rfsgen.kernel(skel, X)                      # exact kernel, float64 (m, m)
    fs = rfsgen.sample(skel, 10_000, seed=1)        # FeatureSet with D = 10^4 columns
    rfsgen.save_features(fs, "features.h5")
    Z = rfsgen.transform(fs, X, layout="dense")     # float32 (m, D); Z @ Z.T ~ K

Names are imported on first use (PEP 562), so ``import rfsgen`` and the command
line start fast and only load numpy, scipy, h5py or numba when a command needs them.
"""

__version__ = "0.1.0"


def _hold_signals_for_the_cli() -> None:
    """Started as the command line (``python -m rfsgen`` or the ``rfsgen`` script), hold
    SIGINT/SIGTERM/SIGHUP from this first line until rfsgen's handlers are installed
    (:func:`rfsgen._signals.install` unblocks them), so that one sent while rfsgen is
    imported is reported like any other.  Imported as a library: nothing."""
    import os
    import signal
    import sys

    argv = list(getattr(sys, "orig_argv", []))
    as_module = any(a == "-m" and argv[i + 1:i + 2] == ["rfsgen"] for i, a in enumerate(argv))
    as_script = os.path.basename(sys.argv[0] if sys.argv else "") in ("rfsgen", "rfsgen.exe")
    if (as_module or as_script) and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP")
                                                  if hasattr(signal, n)})


_hold_signals_for_the_cli()


def _keep_the_c_librarys_transcendentals() -> None:
    """Tell numba, before anything imports it, not to hand loops with exp, log or pow to
    Intel's SVML.  Where numba finds ``libsvml`` (conda's ``icc_rt``) and its llvmlite was
    built for it, LLVM vectorises such loops with SVML's functions, whose last bits differ
    from the C library's: the same rows would give other bytes on that install.  The
    setting is numba's, for the whole process and the processes it starts (an explicit
    ``NUMBA_DISABLE_INTEL_SVML=0`` included).

    Imported after numba with SVML in use, rfsgen can no longer change this: it warns, and
    keeps the code compiled in such a process out of the on-disk cache that other processes
    load (numba's cache does not tell SVML code apart: a later process would load it, with
    its bits, or fail on its missing SVML symbols) by giving numba a cache directory of its
    own for the process, unless one was set (``NUMBA_CACHE_DIR``)."""
    import os
    import sys

    numba = sys.modules.get("numba")
    if numba is None:
        os.environ["NUMBA_DISABLE_INTEL_SVML"] = "1"
        return
    config = getattr(numba, "config", None)
    if not getattr(config, "USING_SVML", False):
        return
    import tempfile
    import warnings

    from .errors import RfsgenWarning

    where = "numba's cache directory (NUMBA_CACHE_DIR) is then shared with processes without SVML"
    if not getattr(config, "CACHE_DIR", ""):
        config.CACHE_DIR = os.path.join(tempfile.gettempdir(), f"rfsgen-numba-svml-{getattr(os, 'getuid', int)()}")
        where = f"this process caches compiled code in {config.CACHE_DIR}"
    warnings.warn(RfsgenWarning(
        f"numba was imported before rfsgen with Intel SVML in use, so compiled loops with exp, log or pow may give "
        f"other last bits than on other machines ({where}): import rfsgen first, or set NUMBA_DISABLE_INTEL_SVML=1"),
        stacklevel=3)


_keep_the_c_librarys_transcendentals()

_EXPORTS = {
    "Activation": "activations", "make_activation": "activations",
    "Base": "bases", "make_base": "bases",
    "DataError": "errors", "FeatureFileError": "errors", "InputError": "errors", "LimitError": "errors", "OutputError": "errors",
    "OutputExistsError": "errors", "RfsgenError": "errors", "SamplerError": "errors", "SkeletonError": "errors",
    "UsageError": "errors", "RfsgenWarning": "errors", "VarianceWarning": "errors",
    "cooccurrence": "cooccurrence",
    "FeatureSet": "features", "describe": "features", "load_features": ("features", "load"),
    "save_features": ("features", "save"),
    "open_input": "inputs",
    "kernel": "kernel",
    "sample": "sampler",
    "select": "select",
    "Skeleton": "skeleton", "load_skeleton": "skeleton", "parse_skeleton": "skeleton",
    "shipped_skeletons": "skeleton",
    "Transformer": "transform", "transform": "transform", "transform_file": "transform",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    spec = _EXPORTS.get(name)
    if spec is None:
        raise AttributeError(f"module 'rfsgen' has no attribute {name!r}")
    module, attr = spec if isinstance(spec, tuple) else (spec, name)
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)


class _Package(type(__import__("sys"))):
    """``rfsgen.kernel``, ``rfsgen.transform`` and ``rfsgen.select`` name functions and also submodules.
    Importing a submodule makes the import system set the package attribute to the
    module; keep the public function instead (the module stays in ``sys.modules``)."""

    def __setattr__(self, name, value):
        if name in ("kernel", "transform", "select") and isinstance(value, type(__import__("sys"))):
            return
        super().__setattr__(name, value)


__import__("sys").modules[__name__].__class__ = _Package
