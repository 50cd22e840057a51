"""scikit-learn adapter: :class:`SkeletonFeatures`, a transformer for pipelines.

Needs scikit-learn (``pip install scikit-learn``, or the extra ``sklearn`` from a clone:
``pip install -e '.[sklearn]'``); importing this module without it is one ImportError saying so; the rest
of rfsgen never imports scikit-learn.  Example::

    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.linear_model import LogisticRegression
    from rfsgen.sklearn import SkeletonFeatures

    model = make_pipeline(StandardScaler(),
                          SkeletonFeatures("tabular-auto", n_components=4096, random_state=0),
                          LogisticRegression(max_iter=1000))
    model.fit(X_train, y_train)

``fit`` binds the skeleton to the width of ``X`` (for ``input: {width: auto}``
skeletons), validates ``X`` and samples the feature set (``features_``); ``transform``
is deterministic: it equals ``rfsgen.transform(self.features_, X)`` bit for bit.
"""

from __future__ import annotations

import os

import numpy as np

from .errors import UsageError, install_hint

try:
    from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
    from sklearn.utils import check_random_state
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as _e:  # one message saying what to install, not sklearn's own traceback
    raise ImportError(f"rfsgen.sklearn needs scikit-learn (>= 1.6), which cannot be imported here ({_e}): "
                      f"{install_hint('sklearn')}") from None
from .skeleton import Skeleton, load_skeleton, parse_skeleton

#: The skeleton used when none is given: the shipped ``rbf`` skeleton, the Gaussian kernel
#: ``exp(-gamma |x - x'|^2)`` of scikit-learn's RBFSampler, with ``gamma = 1 / n_features``
#: unless ``params`` sets it (scikit-learn's SVC default, ``gamma='scale'``, on standardised
#: columns: the kernel stays away from 0 and 1 whatever the width).  It sees the rows as they
#: are (no normalisation unless ``normalize=True``): standardise the columns first
#: (StandardScaler), as for RBFSampler.
DEFAULT_SKELETON = "rbf"

_DTYPES = ("float32", "float64")


def resolve_skeleton(spec, params=None) -> Skeleton:
    """A :class:`Skeleton` from a ``Skeleton``, YAML text (a string with a newline or
    starting with ``rfsgen:``), a path, a shipped skeleton's name (``"cifar-patches"``;
    a path that exists wins), or ``None`` (the shipped :data:`DEFAULT_SKELETON`).  ``params``: values
    for the parameters the skeleton declares (a parsed ``Skeleton`` is re-parsed from its
    text with them)."""
    if spec is None:
        return load_skeleton(DEFAULT_SKELETON, params=params)
    if isinstance(spec, Skeleton):
        if not params:
            return spec
        return parse_skeleton(spec.source, spec.path, activations=dict(spec.activations),
                              params={**dict(spec.params), **params},
                              width=None if spec.auto else spec.width)
    if isinstance(spec, str) and ("\n" in spec or spec.lstrip().startswith("rfsgen:")):
        return parse_skeleton(spec, "<skeleton text>", params=params)
    if isinstance(spec, (str, os.PathLike)):
        return load_skeleton(spec, params=params)
    raise UsageError(f"skeleton must be a path, a shipped skeleton's name, YAML text or rfsgen.Skeleton, not {type(spec).__name__}")


def _seed(random_state) -> int:
    """rfsgen seeds are integers 0 .. 2**63 - 1; an int is used as it is, so
    ``random_state=1`` samples what ``rfsgen sample --seed 1`` does."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool) and 0 <= random_state < 2**63:
        return int(random_state)
    rs = check_random_state(random_state)
    return int(rs.randint(0, 2**63 - 1, dtype=np.int64))


class SkeletonFeatures(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Random features of a compositional kernel, as a scikit-learn transformer.

    Parameters
    ----------
    skeleton : str, os.PathLike, Skeleton or None
        A skeleton file, a shipped skeleton's name (``"tabular-auto"``; see
        ``rfsgen.shipped_skeletons()``), YAML text, or a parsed :class:`rfsgen.Skeleton`.
        ``input: {width: auto}`` skeletons take the width of ``X`` at fit time.
        None: the shipped ``rbf`` skeleton (RBFSampler's kernel ``exp(-gamma |x - x'|^2)``)
        with ``gamma = 1 / n_features`` unless ``params`` sets it.
    n_components : int
        Number of feature columns D.
    random_state : int, numpy RandomState or None
        Seed of the sampler (an int ``s`` samples exactly ``rfsgen sample --seed s``).
    scheme : {"rfs", "strat", "exact", "rr", "orf", "eof"}
        The sampling scheme (see ``rfsgen sample --help``).  ``eof`` (a skeleton of one
        laplace or brownian node): the node's stated ``domain:``, else the box of the
        fitted rows widened by 5% (:mod:`rfsgen.eof`).
    dtype : {"float32", "float64"}
        Output dtype; inputs of either float dtype are read as they are.
    sparse_output : bool
        Return a ``scipy.sparse.csr_matrix`` (exact zeros dropped) instead of an array.
    params : dict or None
        Values for the parameters the skeleton declares under ``params:`` (for
        ``"tabular-auto"``: ``{"scale": 0.2}``); unset ones take their defaults.  Tune
        one in a grid search as ``params__NAME`` (``{"features__params__scale": [0.1,
        0.2, 0.5]}`` for a pipeline step named ``features``) or as whole dicts
        (``{"features__params": [{"scale": 0.1}, ...]}``).
    normalize : bool
        True: scale each row to unit Euclidean length before the features (all-zero rows
        stay zero), as ``sklearn.preprocessing.normalize`` does; then ``transform(X)`` equals
        ``rfsgen.transform(self.features_, normalize(X))``.  False (the default): the rows as
        they are.
    layer : str or None
        For ``anndata.AnnData`` inputs: the layer the rows are read from (None: ``X``).
        An AnnData (backed too) may be passed wherever ``X`` is.
    select : {None, "eerf", "lkrf", "corr", "eerf-norm", "greedy"}
        None: the sampled features as they are.  Otherwise ``fit`` uses ``y``: it samples a
        pool of ``pool_factor * n_components`` columns and keeps ``n_components`` of them by
        their alignment with ``y`` (:func:`rfsgen.select`; ``greedy`` and ``corr`` suit
        standardised linear models, ``greedy`` best on mnist-conv).
    pool_factor : int
        With ``select``: the pool's size as a multiple of ``n_components``.
    device : {"cpu", "cuda", "auto"}
        Where ``transform`` computes the gaussian and laplace atoms and the products into
        columns (:func:`rfsgen.transform`'s ``device``): the same values on either.

    Attributes
    ----------
    features_ : rfsgen.FeatureSet
        The sampled features (save it with ``rfsgen.save_features``).
    skeleton_ : rfsgen.Skeleton
        The skeleton bound to ``n_features_in_`` columns.
    n_features_in_ : int
    feature_names_in_ : ndarray of str, when fitted on a DataFrame with string column names.
    """

    def __init__(self, skeleton=None, n_components=1024, random_state=None, scheme="rfs", dtype="float32",
                 sparse_output=False, params=None, layer=None, select=None, pool_factor=10, normalize=False,
                 device="cpu"):
        self.skeleton = skeleton
        self.n_components = n_components
        self.random_state = random_state
        self.scheme = scheme
        self.dtype = dtype
        self.sparse_output = sparse_output
        self.params = params
        self.layer = layer
        self.select = select
        self.pool_factor = pool_factor
        self.normalize = normalize
        self.device = device

    def set_params(self, **kwargs):
        """As scikit-learn's, and ``params__NAME=value`` sets one skeleton parameter
        (a new ``params`` dict: the one given to the constructor is not changed)."""
        ours = {k[len("params__"):]: kwargs.pop(k) for k in list(kwargs) if k.startswith("params__")}
        if "params" in kwargs:
            super().set_params(params=kwargs.pop("params"))
        if ours:
            if self.params is not None and not isinstance(self.params, dict):
                raise ValueError(f"params must be a dict or None to set params__NAME, got {type(self.params).__name__}")
            self.params = {**(self.params or {}), **ours}
        return super().set_params(**kwargs) if kwargs else self

    def _check_params(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {self.dtype!r}")
        if isinstance(self.n_components, bool) or not isinstance(self.n_components, (int, np.integer)) \
                or self.n_components < 1:
            raise ValueError(f"n_components must be a positive integer, got {self.n_components!r}")
        if self.params is not None and not isinstance(self.params, dict):
            raise ValueError(f"params must be a dict of skeleton parameter names to numbers, or None, "
                             f"got {self.params!r}")
        from .select import METHODS

        if self.select is not None and self.select not in METHODS:
            raise ValueError(f"select must be None or one of {', '.join(METHODS)}, got {self.select!r}")
        if self.select is not None and (isinstance(self.pool_factor, bool) or not isinstance(
                self.pool_factor, (int, np.integer)) or self.pool_factor < 1):
            raise ValueError(f"pool_factor must be a positive integer, got {self.pool_factor!r}")
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise ValueError(f"normalize must be True or False, got {self.normalize!r}")

    def fit(self, X, y=None):
        """Bind the skeleton to ``X``'s width and sample ``n_components`` features.

        ``X``: array-like or scipy.sparse ``(n_samples, n_features)``, finite values.
        """
        return self._fit(X, check_domain=True, y=y)

    def fit_transform(self, X, y=None, **fit_params):
        """``fit(X, y).transform(X)``, checking the rows' domain once (in the transform)."""
        return self._fit(X, check_domain=False, y=y).transform(X)

    def _fit(self, X, check_domain: bool, y=None):
        from .kinds import for_scheme
        from .sampler import sample_scheme

        self._check_params()
        X = self._normalized(validate_data(self, self._rows(X), accept_sparse=True, dtype=[np.float64, np.float32],
                                           reset=True))
        params = self.params
        if self.skeleton is None and "gamma" not in (params or {}):
            params = {**(params or {}), "gamma": 1.0 / X.shape[1]}
        skel = resolve_skeleton(self.skeleton, params)
        try:
            skel = skel.bind(X.shape[1])
        except UsageError as e:
            raise type(e)(f"X has {X.shape[1]} feature(s), which the skeleton cannot take: {e}") from None
        self.skeleton_ = skel
        if self.select is not None:
            self.features_ = self._select(skel, X, y)
            return self
        # transform checks every row anyway; a kind that clips rows to a box (EOF) counts them instead
        if check_domain and not for_scheme(self.scheme).counts_clipped:
            _check_domain(skel, X)
        self.features_ = sample_scheme(skel, int(self.n_components), _seed(self.random_state), scheme=self.scheme,
                                       rows=lambda: X)
        return self

    def _select(self, skel, X, y):
        """``n_components`` of a pool of ``pool_factor * n_components`` columns, chosen by ``y``."""
        from .select import select

        if y is None:
            raise ValueError(f"SkeletonFeatures(select={self.select!r}) needs y in fit: the columns are chosen by "
                             "their alignment with the labels")
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ValueError(f"y has shape {y.shape}; expected ({X.shape[0]},), one label per row of X")
        from .sampler import sample_scheme

        pool = sample_scheme(skel, int(self.pool_factor * self.n_components), _seed(self.random_state),
                             scheme=self.scheme, rows=lambda: X)
        return select(pool, X, y, int(self.n_components), method=self.select)

    def transform(self, X):
        """Features of ``X``: float ``(n_samples, n_components)``, dense or CSR."""
        from .transform import transform

        check_is_fitted(self, "features_")
        X = self._normalized(validate_data(self, self._rows(X), accept_sparse=True, dtype=[np.float64, np.float32],
                                           reset=False))
        return transform(self.features_, X, layout="csr" if self.sparse_output else "dense", dtype=self.dtype,
                         device=self.device)

    def _normalized(self, X):
        """``X``, or with ``normalize=True`` its rows scaled to unit length (zero rows kept)."""
        if not self.normalize:
            return X
        from sklearn.preprocessing import normalize

        return normalize(X, norm="l2", copy=True)

    def _rows(self, X):
        """``X`` itself, or for an AnnData its X or ``layers[self.layer]`` (backed: read)."""
        from .inputs import anndata_matrix, is_anndata

        if not is_anndata(X):
            if self.layer is not None:
                raise ValueError(f"layer={self.layer!r} is for AnnData inputs, not {type(X).__name__}; "
                                 "pass the rows themselves with layer=None")
            return X
        X, _ = anndata_matrix(X, self.layer)
        return X.to_memory() if hasattr(X, "to_memory") else X  # backed sparse: scikit-learn needs it in memory

    @property
    def _n_features_out(self):
        return self.features_.columns

    def get_feature_names_out(self, input_features=None):
        """``skeletonfeatures0`` .. : the names rfsgen's output files give their columns
        (:func:`rfsgen.h5ad.feature_names`), ndarray of str objects ``(n_components,)``."""
        from .h5ad import feature_names

        super().get_feature_names_out(input_features)  # scikit-learn's checks (fitted, input_features)
        return np.asarray(feature_names(0, self._n_features_out), dtype=object)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.required = self.select is not None
        tags.transformer_tags.preserves_dtype = [self.dtype] if self.dtype in _DTYPES else []
        return tags


def _check_domain(skel: Skeleton, X, chunk_rows: int = 4096) -> None:
    """Raise :class:`rfsgen.DataError` (a ValueError) naming the first row out of a
    base's domain (a category out of range, an all-zero row for a sphere node)."""
    from .inputs import open_input
    from .kernel import prepare_inputs

    with open_input(X) as src:
        for row0, block in src.chunks(chunk_rows):
            prepare_inputs(skel, block, row0, "X")
