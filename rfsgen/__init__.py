"""rfsgen: random features for compositional kernels.

The library behind the ``rfsgen`` command.  Typical use::

    import rfsgen
    skel = rfsgen.load_skeleton("skeletons/cifar-deep.yaml")
    K = rfsgen.kernel(skel, X)                      # exact kernel, float64 (m, m)
    fs = rfsgen.sample(skel, 10_000, seed=1)        # FeatureSet with D = 10^4 columns
    rfsgen.save_features(fs, "features.h5")
    Z = rfsgen.transform(fs, X, layout="dense")     # float32 (m, D); Z @ Z.T ~ K
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
from .features import FeatureSet, describe  # noqa: E402
from .features import load as load_features  # noqa: E402
from .features import save as save_features  # noqa: E402
from .io import open_input  # noqa: E402
from .kernel import kernel  # noqa: E402
from .sampler import sample  # noqa: E402
from .skeleton import Skeleton, load_skeleton, parse_skeleton  # noqa: E402
from .transform import Transformer, transform, transform_file  # noqa: E402

__all__ = [
    "Activation", "Base", "DataError", "FeatureFileError", "InputError", "OutputError",
    "OutputExistsError", "RfsgenError", "SamplerError", "Skeleton", "SkeletonError", "UsageError",
    "FeatureSet", "Transformer", "describe", "kernel", "load_features", "load_skeleton", "make_activation",
    "make_base", "open_input", "parse_skeleton", "sample", "save_features", "transform", "transform_file",
]
