"""The one registry of privacy modes: plan, round factory and the run's claim, per mode.

``MODES`` is filled here, explicitly, with the built-in modes (``none``, ``central``, ``local``,
``distributed``, ``dpftrl``); nothing registers itself as an import side effect. The config's ``privacy`` key is
checked against it, and :func:`plan_privacy` looks the mode up in it, then refuses a plan whose event
is not the one its mechanisms produce (:func:`fedprivacy.fl.mechanisms.check_plan`). A research prototype either
passes its mode object straight to :class:`fedprivacy.fl.run.FederatedRun` (``mode=MyMode()``) or
calls :func:`register_mode` so that ``privacy = "<name>"`` selects it from a run config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedprivacy.fl.modes.base import Disclosure, PrivacyMode, Transport, plain_round, privacy_block
from fedprivacy.fl.modes.distributed import DistributedMode
from fedprivacy.fl.modes.dpftrl import DpftrlMode
from fedprivacy.fl.modes.plain import CentralMode, LocalMode, NoneMode
from fedprivacy.fl.privacy import PrivacyPlan, check_population

if TYPE_CHECKING:
    from fedprivacy.config import RunConfig

__all__ = ["MODES", "Disclosure", "PrivacyMode", "Transport", "get_mode", "is_private", "mode_names", "plain_round",
           "plan_privacy", "privacy_block", "register_mode"]

#: what a mode must say about itself (None / False where it has none): PrivacyMode's members
_ATTRIBUTES = ("trusted_server", "client_mechanism", "server_mechanism", "secure_noise", "covers")
_METHODS = ("plan", "round_fn", "summary", "check", "disclosure")

MODES: dict[str, PrivacyMode] = {m.name: m for m in (NoneMode(), CentralMode(), LocalMode(), DistributedMode(),
                                                     DpftrlMode())}
_BUILT_IN = frozenset(MODES)


def register_mode(mode: PrivacyMode) -> None:
    """Make ``privacy = mode.name`` select ``mode`` (the built-in modes cannot be replaced)."""
    name = getattr(mode, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"mode.name must be a non-empty string, got {name!r}")
    if name in _BUILT_IN:
        raise ValueError(f"privacy mode {name!r} is built in and cannot be replaced")
    check_mode_object(mode)
    MODES[name] = mode


def check_mode_object(mode: PrivacyMode) -> None:
    """TypeError unless ``mode`` says everything a mode means (:class:`PrivacyMode`'s members): a mode
    that does not name its mechanisms, or declare it has none, cannot run."""
    for method in _METHODS:
        if not callable(getattr(mode, method, None)):
            raise TypeError(f"a privacy mode needs a {method}() method; {type(mode).__name__} has none")
    for attr in _ATTRIBUTES:
        if not hasattr(mode, attr):
            raise TypeError(f"a privacy mode must say its {attr} (None or False where it has none); "
                            f"{type(mode).__name__} does not")


def is_private(mode: PrivacyMode) -> bool:
    """Whether ``mode`` adds noise (a client, server or secure-aggregation mechanism) and claims an ε."""
    return mode.client_mechanism is not None or mode.server_mechanism is not None or bool(mode.secure_noise)


def mode_names() -> tuple[str, ...]:
    return tuple(MODES)


def get_mode(name: str) -> PrivacyMode:
    """The registered mode ``name``; ValueError naming the ``privacy`` key otherwise."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"privacy must be one of {', '.join(MODES)}; got {name!r}") from None


def plan_privacy(cfg: RunConfig, *, population: int, dim: int | None = None,
                 mode: PrivacyMode | None = None) -> PrivacyPlan:
    """Resolve the privacy plan of ``cfg.privacy`` (or of ``mode``) for ``population`` clients.

    Args:
        cfg: the validated run config.
        population: number of partitions N.
        dim: number of model parameters the clients send (needed by ``distributed``: its encoding
            scale and worst-case event are sized from the weights the run really uses).
        mode: a :class:`PrivacyMode` object; default: the registered one named ``cfg.privacy``.

    Raises:
        ValueError: naming the run-config key that cannot be honoured.
    """
    from fedprivacy.fl.mechanisms import check_plan

    check_population(cfg, population=population)
    mode = mode or get_mode(cfg.privacy)
    check_mode_object(mode)
    plan = mode.plan(cfg, population=population, dim=dim)
    check_plan(mode, plan, dim=dim, completion=_completion(cfg, population=population))
    return plan


def _completion(cfg: RunConfig, *, population: int) -> Any:
    """The public's completion-labelled sampling of a secure run (None without it)."""
    if not cfg.secagg:
        return None
    from fedprivacy.accounting.completion import CohortRuleSampling
    from fedprivacy.fl.secure.params import public_sampling

    try:
        sampling = public_sampling(cfg, population=population)
    except ValueError:  # no secure parameters for this population: the mode's plan says why
        return None
    return sampling if isinstance(sampling, CohortRuleSampling) else None
