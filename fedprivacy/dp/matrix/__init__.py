"""DP-FTRL / matrix-factorization mechanisms: workloads, strategies C, sensitivity, noise, accounting.

Pure numpy, scipy and dp-accounting. The server adds streamed ``(C^{-1} z)_t`` to round t's clipped
aggregate; its optimizer then releases ``A x + B z`` for the factorization ``A = B C`` of its workload
(Denisov et al. 2022; Choquette-Choo et al. 2023; Kalinin & Lampert 2024; Dvijotham, McMahan et al.
2024). Privacy depends on C and the participation schema only, never on B.
"""

from fedprivacy.dp.matrix.accounting import (
    CyclicPoisson,
    MatrixMechanism,
    MinSeparation,
    Schema,
    SingleParticipation,
)
from fedprivacy.dp.matrix.noise import StreamingNoise
from fedprivacy.dp.matrix.sensitivity import (
    Sensitivity,
    min_sep_sensitivity,
    participation_limit,
    single_participation_sensitivity,
)
from fedprivacy.dp.matrix.strategies import BandedToeplitz, Blt, bsr, decoder, errors
from fedprivacy.dp.matrix.workloads import Workload

__all__ = [
    "BandedToeplitz", "Blt", "CyclicPoisson", "MatrixMechanism", "MinSeparation", "Schema",
    "Sensitivity", "SingleParticipation", "StreamingNoise", "Workload", "bsr", "decoder", "errors",
    "min_sep_sensitivity", "participation_limit", "single_participation_sensitivity",
]
