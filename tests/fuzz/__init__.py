"""rfsgen's fuzz suite: generated hostile cases run through the real command line.

``python tests/fuzz/run.py --help`` runs it; ``tests/test_fuzz.py`` runs a bounded budget and
replays ``tests/fuzz/regressions/``.  A case is a JSON-able dict (see :mod:`tests.fuzz.harness`):
the files to create (literal, generated from parameters, or copied from a fixture), the damage
to do to them, the command line, what a correct result is, and an optional signal.
"""
