"""Differential-privacy primitives: randomness, clipping, mechanisms and exact discrete samplers.

Pure: standard library, numpy, scipy and cryptography only. Every privacy-relevant random draw goes
through :class:`fedprivacy.dp.rng.RandomSource` (secure by default, seeded only for research).
"""

from fedprivacy.dp.clipping import clip_arrays, clip_l2, flatten, l2_norm, unflatten
from fedprivacy.dp.discrete import (
    bernoulli_exp_exact,
    discrete_gaussian_pmf,
    sample_discrete_gaussian,
    sample_discrete_gaussian_exact,
    sample_discrete_laplace_exact,
)
from fedprivacy.dp.mechanisms import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_std,
    classic_gaussian_std,
    exponential_mechanism,
    gaussian_mechanism,
    laplace_mechanism,
    laplace_scale,
    report_noisy_max,
    report_noisy_max_scale,
)
from fedprivacy.dp.rng import RandomSource, default_source

__all__ = [
    "RandomSource",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_std",
    "bernoulli_exp_exact",
    "classic_gaussian_std",
    "clip_arrays",
    "clip_l2",
    "default_source",
    "discrete_gaussian_pmf",
    "exponential_mechanism",
    "flatten",
    "gaussian_mechanism",
    "l2_norm",
    "laplace_mechanism",
    "laplace_scale",
    "report_noisy_max",
    "report_noisy_max_scale",
    "sample_discrete_gaussian",
    "sample_discrete_gaussian_exact",
    "sample_discrete_laplace_exact",
    "unflatten",
]
