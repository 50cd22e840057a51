"""The exact kernel: the compositional recurrence (:mod:`rfsgen.recurrence`, re-exported here)
and ``rfsgen kernel``, which asks a column kind (:mod:`rfsgen.kinds`) for its kernel."""

from __future__ import annotations

import numpy as np

from . import budget
# The recurrence lives below the column kinds (rfsgen.recurrence); its names still import from here.
from .recurrence import DEFAULT_MEMORY, _block, _Plan, _rows, check_memory, kernel, prepare_inputs  # noqa: F401
from .kinds import named


def kernel_files(skeleton_path, input, input2, output, *, rows=None, overwrite=False, progress=None, eof=None,
                 params=None):
    """Read inputs, evaluate the exact kernel and write it as ``.npy`` (atomically).

    ``output`` may be ``'-'`` for standard output.  Used by ``rfsgen kernel``.
    ``eof``: a dict (``domain_from``, ``margin``) asking for the kernel EOF converges to
    instead (:func:`rfsgen.eof.kernel`), through its column kind (:mod:`rfsgen.kinds`).  ``params``: values for the skeleton's declared
    parameters (names to numbers or their text).
    """
    import io

    from .inputs import check_width, open_input, resolve_rows

    from .atomic import atomic_path, write_stdout
    from .skeleton import load_skeleton

    skel = load_skeleton(skeleton_path, params=params)
    arrays = []
    names = []
    origin = None
    for spec in (input, input2):
        if spec is None:
            continue
        with open_input(spec) as src:
            if not skel.bound:
                skel = skel.bind(src.width)
                origin = f"the first input '{src.name}'"  # INPUT2 must match the width INPUT bound
            check_width(src, skel.width, skel.path, skel.shape, origin=origin)
            start, stop = resolve_rows(rows, src.n_rows, src.name)
            if stop is not None:  # (a stream's rows are counted as they come)
                budget.check(8.0 * (stop - start) * skel.width, f"reading rows {start}:{stop} of '{src.name}' "
                             f"({stop - start} x {skel.width} values) for the kernel",
                             "use fewer rows (--rows START:STOP)")
            arrays.append(src.read(start, stop))
            names.append(src.name)
    y = arrays[1] if len(arrays) > 1 else None
    if progress is not None and hasattr(progress, "phase"):
        progress.phase("kernel", arrays[0].shape[0])
    kind = named("eof" if eof is not None else "rfs")  # the kind whose kernel: EOF's limit, or the recurrence
    k = kind.kernel(skel, arrays[0], y, options=eof, progress=progress, x_source=names[0], y_source=names[-1],
                    copies=1)  # + np.save's buffer
    if output == "-":
        buf = io.BytesIO()
        np.save(buf, k)
        write_stdout(buf.getbuffer())  # checked; BrokenPipeError (| head) is the CLI's to handle
        return k
    with atomic_path(output, overwrite, inputs=[skeleton_path, input, input2]) as tmp:
        buf = io.BytesIO()
        np.save(buf, k)  # then one write, whose OSError carries errno (ENOSPC, EFBIG)
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
    return k
