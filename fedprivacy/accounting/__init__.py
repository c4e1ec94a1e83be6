"""Privacy accounting: events, a ledger-keeping accountant with PLD/RDP/PRV backends, calibration.

Pure: imports only the standard library, numpy, scipy and dp-accounting (``prv_accountant`` lazily, for
the PRV cross-check). See ``events`` for the units and ``backend_base`` and the ``*_backend`` modules for the theorems used.
"""

from fedprivacy.accounting.accountant import (
    Accountant,
    Budget,
    LedgerEntry,
    PrivacyBudgetExhausted,
    epsilon_for,
)
from fedprivacy.accounting.backend_base import to_dp_event
from fedprivacy.accounting.backends import BACKENDS, get_backend
from fedprivacy.accounting.calibration import calibrate_noise_multiplier
from fedprivacy.accounting.completion import CompletedRoundGaussian  # registers its kind (journals)
from fedprivacy.accounting.events import (
    AccountedMechanism,
    DiscreteGaussianEvent,
    ExponentialEvent,
    FixedCohortSampling,
    GaussianEvent,
    LaplaceEvent,
    Neighbouring,
    NoSampling,
    PoissonSampling,
    PrivacyEvent,
    event_from_dict,
    register_mechanism,
)
from fedprivacy.accounting.journal import ChargeJournal

__all__ = [
    "BACKENDS",
    "AccountedMechanism",
    "Accountant",
    "Budget",
    "ChargeJournal",
    "CompletedRoundGaussian",
    "DiscreteGaussianEvent",
    "ExponentialEvent",
    "FixedCohortSampling",
    "GaussianEvent",
    "LaplaceEvent",
    "LedgerEntry",
    "Neighbouring",
    "NoSampling",
    "PoissonSampling",
    "PrivacyBudgetExhausted",
    "PrivacyEvent",
    "calibrate_noise_multiplier",
    "epsilon_for",
    "event_from_dict",
    "get_backend",
    "register_mechanism",
    "to_dp_event",
]
