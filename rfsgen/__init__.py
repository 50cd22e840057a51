"""rfsgen: random features for compositional kernels.

The library behind the ``rfsgen`` command.  Typical use::

    import rfsgen
    skel = rfsgen.load_skeleton("skeletons/cifar-deep.yaml")
    K = rfsgen.kernel(skel, X)                      # exact kernel, float64 (m, m)
"""

__version__ = "0.1.0"

from .activations import Activation, make_activation  # noqa: E402
from .bases import Base, make_base  # noqa: E402
from .errors import (  # noqa: E402
    DataError,
    FeatureFileError,
    InputError,
    OutputError,
    OutputExistsError,
    RfsgenError,
    SamplerError,
    SkeletonError,
    UsageError,
)
from .io import open_input  # noqa: E402
from .kernel import kernel  # noqa: E402
from .skeleton import Skeleton, load_skeleton, parse_skeleton  # noqa: E402

__all__ = [
    "Activation", "Base", "DataError", "FeatureFileError", "InputError", "OutputError",
    "OutputExistsError", "RfsgenError", "SamplerError", "Skeleton", "SkeletonError", "UsageError",
    "kernel", "load_skeleton", "make_activation", "make_base", "open_input", "parse_skeleton",
]
