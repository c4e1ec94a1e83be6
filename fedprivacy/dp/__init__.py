"""Differential-privacy primitives: randomness, clipping, mechanisms and exact discrete samplers.

Pure: standard library, numpy, scipy and cryptography only. Every privacy-relevant random draw goes
through :class:`fedprivacy.dp.rng.RandomSource` (secure by default, seeded only for research).
"""

from fedprivacy.dp.clipping import clip_arrays, clip_l2, flatten, l2_norm, unflatten
from fedprivacy.dp.rng import RandomSource, default_source

__all__ = [
    "RandomSource",
    "clip_arrays",
    "clip_l2",
    "default_source",
    "flatten",
    "l2_norm",
    "unflatten",
]
