"""The client's own privacy floor: what it agrees to, decided on the client's side only.

Threat model: the server chooses every field of its messages, and in a Flower deployment
``context.run_config`` is chosen by whoever submits the run, normally the server side. Only
``node_config`` (set by the SuperNode's operator) and the ClientApp's own code belong to the client.
So the privacy mode, the minimum noise multiplier, the largest per-round privacy loss, the colluders
assumed, the secure-aggregation schedule, whether a seeded research mode may be used and which
metrics may leave the client are read from ``node_config`` keys ``client-*`` (:data:`NODE_CONFIG_KEYS`),
with safe defaults in code (:class:`ClientPolicy`'s). A server request outside the floor is refused with
a :class:`PolicyRefusal` naming the rule; the server counts the ClientApp's error reply as a dropout.

Per-round privacy loss, as zCDP ρ of this client's contribution (Bun & Steinke 2016, Prop. 1.6):

* a client mechanism (``local`` and any registered one, :mod:`fedprivacy.fl.mechanisms`): the ρ of its
  own accounting event under replace-one (:func:`fedprivacy.fl.mechanisms.zcdp_rho`; ``2/z²`` for the
  Gaussian); the client adds *its own* noise, raised to its floor; a request for less is not obeyed.
* ``distributed``: the dominating Gaussian of the worst released sum, from the complete encoding the
  server sent (checked at the share stage, before any secret leaves the client); only exact XNoise
  encodings are accepted, and adaptive clipping's count gets at least ``min_noise_multiplier`` too.

Cumulative budget: the client also sums the ρ of every round it releases and refuses a round that
would take the total above ``client-max-rho-total``, across every run of the node
(:meth:`ClientPolicy.memory_path`, :mod:`fedprivacy.fl.client_budget`). Randomness: always the client's
own secure source unless its own side sets ``client-allow-seeded``.

Where the policy comes from (:meth:`ClientPolicy.resolve`): ``node_config``, then the
``FEDPRIVACY_CLIENT_POLICY`` environment variable (JSON of the same keys), then the code defaults; a
local simulation's launcher may derive it from the run (:meth:`ClientPolicy.for_simulation`) and must
say so. Rationale: docs/PRIVACY.md, section "The client's floor in detail".
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedprivacy.fl.client_limits import MAX_TV_PER_ROUND, MAX_TV_TOTAL, PolicyRefusal, check_crowd
from fedprivacy.fl.mechanisms import GaussianNoise, UnknownMechanism, get_client_mechanism, zcdp_rho

if TYPE_CHECKING:
    from fedprivacy.accounting.release import DistributedRelease
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.client_budget import BudgetCharge, ClientBudget
    from fedprivacy.fl.mechanisms import ClientMechanism
    from fedprivacy.fl.types import ClientUpdate, RoundInstructions
    from fedprivacy.secagg.ddp import DistributedDPConfig
    from fedprivacy.secagg.messages import SetupRequest

__all__ = ["ENV_VAR", "MAX_TV_PER_ROUND", "MAX_TV_TOTAL", "MEMORY_ENV_VAR", "NODE_CONFIG_KEYS", "RUN_TEMP",
           "RUN_TEMP_ENV_VAR", "ClientPolicy", "PolicyRefusal", "default_memory_dir", "run_temp_dir"]

#: environment variable of the ClientApp's process holding a JSON object of ``client-*`` keys
ENV_VAR = "FEDPRIVACY_CLIENT_POLICY"
#: environment variable naming the default durable-memory directory of this process's nodes
MEMORY_ENV_VAR = "FEDPRIVACY_CLIENT_MEMORY_DIR"
#: ``client-memory-dir`` value: the run's own temporary area (a simulation's clients, :func:`run_temp_dir`)
RUN_TEMP = "run-temp"
#: environment variable naming the root of the runs' temporary areas (:func:`run_temp_dir`)
RUN_TEMP_ENV_VAR = "FEDPRIVACY_RUN_TEMP"


def default_memory_dir() -> Path:
    """Where a SuperNode's durable memory lives without ``client-memory-dir``: ``$FEDPRIVACY_CLIENT_MEMORY_DIR``,
    else ``$XDG_STATE_HOME/fedprivacy/client-memory``, else ``~/.local/state/fedprivacy/client-memory``."""
    given = os.environ.get(MEMORY_ENV_VAR)
    if given:
        return Path(given)
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "fedprivacy" / "client-memory"


@functools.cache
def run_temp_base() -> str:
    """Where the runs' temporary areas live without ``$FEDPRIVACY_RUN_TEMP``: ``/dev/shm`` when it is a
    writable directory, else the system's temporary directory. A simulation's memory in RAM: the run
    (server included) ends with the machine, so a flush to disk would guard nothing, and each fsync of a
    shared disk costs 0.3-5 ms, 3 a client and round (docs/SECAGG.md "The client's durable memory")."""
    shm = "/dev/shm"  # noqa: S108 -- the node's own owner-only files, in a directory of its own uid
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else tempfile.gettempdir()


def run_temp_dir(run_id: int) -> Path:
    """A simulation's clients' memory (:data:`RUN_TEMP`): ``run-<run id>`` under ``$FEDPRIVACY_RUN_TEMP``,
    else under ``fedprivacy-client-memory-<uid>`` of :func:`run_temp_base`."""
    root = os.environ.get(RUN_TEMP_ENV_VAR) or os.path.join(run_temp_base(), f"fedprivacy-client-memory-{os.getuid()}")
    return Path(root) / f"run-{int(run_id)}"


@functools.lru_cache(maxsize=4096)
def _path(text: str) -> Path:
    return Path(text)


@functools.lru_cache(maxsize=4096)
def _memory_path(memory_dir: str, run_id: int, partition_id: int, env: tuple[str | None, ...]) -> Path:
    """:meth:`ClientPolicy.memory_path` under the environment ``env`` (its variables' values: the cache
    key), built once per node (a Path costs ~10 µs, a node's message a few of them)."""
    del env  # (read again below; only the key)
    if memory_dir == RUN_TEMP:
        base = run_temp_dir(run_id)
    else:
        base = Path(memory_dir) if memory_dir else default_memory_dir()
    return base / f"partition-{partition_id}.jsonl"


SCHEDULES = ("active", "semi-honest")
METRICS = ("num-examples", "train-loss", "dpsgd-steps", "dpsgd-sample-rate")
PEER_AUTH = ("pin", "relay")


#: node_config key -> ClientPolicy field
NODE_CONFIG_KEYS = {
    "client-privacy-modes": "modes",
    "client-min-noise-multiplier": "min_noise_multiplier",
    "client-max-rho-per-round": "max_rho_per_round",
    "client-max-rho-total": "max_rho_total",
    "client-max-slack-per-round": "max_slack_per_round",
    "client-max-slack-total": "max_slack_total",
    "client-budget-path": "budget_path",
    "client-memory-dir": "memory_dir",
    "client-neighbouring": "neighbouring",
    "client-secagg-colluders": "colluders",
    "client-secagg-schedule": "schedule",
    "client-min-threshold": "min_threshold",
    "client-min-survivors": "min_survivors",
    "client-min-roster": "min_roster",
    "client-allow-seeded": "allow_seeded",
    "client-disclose": "disclose",
    "client-identity-key": "identity_key",
    "client-peer-directory": "peer_directory",
    "client-peer-auth": "peer_auth",
}


def _names(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"{what} must be a comma-separated string, got {type(value).__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientPolicy:
    """A client's privacy floor. The defaults are what a client with no configuration accepts.

    Attributes:
        modes: names of the privacy modes it takes part in; by default only those where the server never
            sees its update un-noised (``local``, ``distributed``).
        min_noise_multiplier: the smallest ``z`` it accepts (``local``: of its own noise; ``distributed``:
            the target ``z`` of the encoding; what a round really costs is capped by ρ below).
        max_rho_per_round: the largest zCDP ρ of one round it will spend.
        max_rho_total: the largest total zCDP ρ it releases, summed over rounds (and, with
            ``budget_path``, over runs): :mod:`fedprivacy.fl.client_budget`. A round in ``central`` or
            ``none`` mode costs ``ρ = ∞`` (its update leaves without the client's noise), so a finite
            total refuses those modes.
        max_slack_per_round: the largest discrete slack ``eta + A`` (an additive ε: the distributed
            release against its dominating Gaussian, :mod:`fedprivacy.accounting.release`) of one
            distributed round it accepts; honest encodings carry ~4e-7 at 10⁶ coordinates, a server that
            shrinks C·scale under a large roster can make it ~6.
        max_slack_total: the largest total slack it releases (with ``max_rho_total``: the total ε is then
            at most ε_zCDP(ρ, δ′) + 2(slack − ln(1 − tv)), :func:`fedprivacy.fl.client_budget.total_epsilon`).
        budget_path: the node's durable memory file, shared by all its runs ("" = ``memory_dir``'s).
        memory_dir: where the node's durable memory (:meth:`memory_path`) lives: ``""`` the default
            SuperNode location (:func:`default_memory_dir`), :data:`RUN_TEMP` the run's own temporary
            area (simulations, where the user runs both sides), or a directory.
        neighbouring: the relation its ρ is computed under.
        colluders: clients it assumes collude with the server; setups and encodings assuming fewer are
            refused.
        schedule: the weakest secure-aggregation schedule it accepts (``active`` = secure against a
            malicious server; ``semi-honest`` also accepts the two-exchange schedule).
        min_threshold: the smallest Shamir threshold ``t`` of a secure round it joins.
        min_survivors: the fewest inputs besides the ``colluders`` the server's setup assumes in any sum
            a secure round it joins may release (the round's required survivors minus its colluders),
            in every mode, ``none`` included: the crowd its input hides in.
        min_roster: the smallest roster of a secure round it shares its keys with.
        allow_seeded: whether the seeded research mode (not private) may be used.
        disclose: metrics it may send beside its update.
        identity_key: its long-term Ed25519 key file (PEM): it signs its key advertisements and checks its
            peers' (:mod:`fedprivacy.secagg.peers`); ``""``: one the node makes itself on first use,
            ``partition-<id>.identity.pem`` beside its durable memory (unless ``peer_auth`` is ``relay``).
        peer_directory: the operator's node id -> public key file (needs ``identity_key``); ``""``: peers'
            keys are pinned on first use beside the durable memory (:func:`fedprivacy.fl.secure.peer_auth`).
        peer_auth: ``pin`` (the default: peers' long-term keys checked against the directory or pinned on
            first use) or ``relay`` (the weaker opt-out: no identity, peers' keys trusted as the server
            relays them; docs/SECAGG.md "Peer keys").
    """

    modes: tuple[str, ...] = ("local", "distributed")
    min_noise_multiplier: float = 0.5
    max_rho_per_round: float = 2.0
    #: 10 rounds at the per-round cap; ε ≈ 50 at δ = 1e-5 (Bun & Steinke 2016, Prop. 1.3)
    max_rho_total: float = 20.0
    max_slack_per_round: float = 1e-4
    #: the server's own bound on a whole run's slack (fedprivacy.accounting.audiences)
    max_slack_total: float = 1e-3
    budget_path: str = ""
    memory_dir: str = ""
    neighbouring: str = "add-remove"
    colluders: int = 0
    schedule: str = "active"
    #: the crowd floor (:func:`fedprivacy.fl.client_limits.check_crowd`): every sum released holds 4 inputs
    #: beside the colluders assumed, in a roster of 5 (a world of 3 or 4 is refused)
    min_threshold: int = 3
    min_survivors: int = 4
    min_roster: int = 5
    allow_seeded: bool = False
    disclose: tuple[str, ...] = field(default=())
    identity_key: str = ""
    peer_directory: str = ""
    peer_auth: str = "pin"

    def __post_init__(self) -> None:
        if not all(isinstance(m, str) and m for m in self.modes):
            raise ValueError(f"modes must be non-empty names, got {self.modes!r}")
        if not (math.isfinite(self.min_noise_multiplier) and self.min_noise_multiplier >= 0):
            raise ValueError(f"min_noise_multiplier must be >= 0, got {self.min_noise_multiplier}")
        if not self.max_rho_per_round > 0:
            raise ValueError(f"max_rho_per_round must be > 0, got {self.max_rho_per_round}")
        if not self.max_rho_total > 0:
            raise ValueError(f"max_rho_total must be > 0, got {self.max_rho_total}")
        if not self.max_slack_per_round > 0:
            raise ValueError(f"max_slack_per_round must be > 0, got {self.max_slack_per_round}")
        if not self.max_slack_total > 0:
            raise ValueError(f"max_slack_total must be > 0, got {self.max_slack_total}")
        if not isinstance(self.budget_path, str) or not isinstance(self.memory_dir, str):
            raise TypeError("budget_path and memory_dir must be str")
        if self.neighbouring not in ("add-remove", "replace-one"):
            raise ValueError(f"neighbouring must be 'add-remove' or 'replace-one', got {self.neighbouring!r}")
        if isinstance(self.colluders, bool) or not isinstance(self.colluders, int) or self.colluders < 0:
            raise ValueError(f"colluders must be an int >= 0, got {self.colluders!r}")
        for name in ("min_threshold", "min_survivors", "min_roster"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not isinstance(self.allow_seeded, bool):
            raise TypeError(f"allow_seeded must be a bool, got {type(self.allow_seeded).__name__}")
        for m in self.disclose:
            if m not in METRICS:
                raise ValueError(f"disclose must be among {METRICS}, got {m!r}")
        if self.peer_auth not in PEER_AUTH:
            raise ValueError(f"peer_auth (client-peer-auth) must be one of {PEER_AUTH}, got {self.peer_auth!r}")
        if self.peer_auth == "relay" and (self.identity_key or self.peer_directory):
            raise ValueError("client-peer-auth = 'relay' trusts the server's relay of peer keys; it cannot be "
                             "combined with client-identity-key or client-peer-directory")

    # ------------------------------------------------------------------ configuration
    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> ClientPolicy:
        """The policy of ``client-*`` keys in ``node_config`` (other keys are ignored; an unknown
        ``client-*`` key is refused, so a typo cannot silently fall back to a default)."""
        kwargs: dict[str, Any] = {}
        for key, value in node_config.items():
            if not key.startswith("client-"):
                continue
            name = NODE_CONFIG_KEYS.get(key)
            if name is None:
                raise ValueError(f"unknown client policy key {key!r}; known: {sorted(NODE_CONFIG_KEYS)}")
            if name in ("modes", "disclose"):
                kwargs[name] = _names(value, key)
            elif name in ("min_noise_multiplier", "max_rho_per_round", "max_rho_total", "max_slack_per_round",
                          "max_slack_total"):
                kwargs[name] = float(value)
            elif name in ("colluders", "min_threshold", "min_survivors", "min_roster"):
                if isinstance(value, bool) or int(value) != value:
                    raise ValueError(f"{key} must be an int, got {value!r}")
                kwargs[name] = int(value)
            elif name == "allow_seeded":
                if not isinstance(value, bool) and value not in ("true", "false"):
                    raise ValueError(f"{key} must be true or false, got {value!r}")
                kwargs[name] = value is True or value == "true"
            else:
                kwargs[name] = str(value)
        return cls(**kwargs)

    @classmethod
    def resolve(cls, node_config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ClientPolicy:
        """The client's policy: ``node_config`` keys over the ``FEDPRIVACY_CLIENT_POLICY`` JSON over
        the code defaults (see the module docstring)."""
        import json

        merged: dict[str, Any] = {}
        raw = (environ or {}).get(ENV_VAR)
        if raw:
            try:
                from_env = json.loads(raw)
            except ValueError as exc:
                raise ValueError(f"{ENV_VAR} must be a JSON object of client-* keys: {exc}") from None
            if not isinstance(from_env, dict):
                raise ValueError(f"{ENV_VAR} must be a JSON object of client-* keys")
            merged.update(from_env)
        merged.update({k: v for k, v in node_config.items() if str(k).startswith("client-")})
        return cls.from_node_config(merged)

    @classmethod
    def for_simulation(cls, cfg: RunConfig, *, colluders: int = 0, schedule: str = "active") -> ClientPolicy:
        """What the user asked for, as the clients' floor of a local simulation (the user runs both
        sides): its privacy mode and noise multiplier, no cap on ρ beyond what that run spends, its
        seed, and the metrics that mode discloses. Never use it for clients the user does not run.

        Whether the server is trusted is the mode's own word (``cfg.mode.trusted_server``). With ``secagg = true`` nothing is disclosed beside the masked vector, whatever the mode: the
        server is the adversary secure aggregation is run against, and a client's number of examples and
        un-noised training loss (a membership signal) would reach it in the clear."""
        trusted = cfg.mode.trusted_server and not cfg.secagg
        noisy = not cfg.mode.trusted_server
        return cls(modes=(cfg.privacy,), min_noise_multiplier=cfg.noise_multiplier if noisy else 0.0,
                   max_rho_per_round=math.inf, max_rho_total=math.inf, max_slack_per_round=math.inf,
                   max_slack_total=math.inf, neighbouring=cfg.neighbouring, memory_dir=RUN_TEMP,
                   colluders=colluders, min_threshold=1, min_survivors=1, min_roster=1,
                   schedule=schedule, allow_seeded=cfg.seed >= 0,
                   disclose=METRICS if trusted else ())

    def to_node_config(self) -> dict[str, str | int | float | bool]:
        """The inverse of :meth:`from_node_config` (what a launcher passes to a SuperNode)."""
        inverse = {v: k for k, v in NODE_CONFIG_KEYS.items()}
        out: dict[str, str | int | float | bool] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[inverse[f.name]] = ",".join(v) if isinstance(v, tuple) else v
        return out

    # ------------------------------------------------------------------ checks
    def check_mode(self, privacy: str) -> None:
        if privacy not in self.modes:
            raise PolicyRefusal(f"server asks for privacy {privacy!r}; this client takes part only in "
                                f"{list(self.modes)} (node config client-privacy-modes)")

    def seed(self, requested: int) -> int:
        """The seed this client uses: ``-1`` (its own secure source) unless its side allows seeding."""
        if requested < 0:
            return -1
        if not self.allow_seeded:
            raise PolicyRefusal(f"server asks for the seeded research mode (seed={requested}); this "
                                f"client does not allow it (node config client-allow-seeded)")
        return requested

    def _rho(self, z: float) -> float:
        if z <= 0:
            return math.inf
        return (1.0 if self.neighbouring == "add-remove" else 4.0) / (2.0 * z * z)

    def _check_rho(self, rho: float, what: str) -> None:
        if rho > self.max_rho_per_round:
            raise PolicyRefusal(f"{what}: one round would cost rho = {rho:.4g} > {self.max_rho_per_round:g} "
                                f"(node config client-max-rho-per-round)")

    def client_noise_multiplier(self, mechanism: ClientMechanism, *, clip_norm: float, requested: float,
                                dim: int | None = None) -> float:
        """The ``z`` of the noise this client adds itself with ``mechanism`` (never below its floor).

        Its floor: one round costs at most ``max_rho_per_round`` and at most what a Gaussian of
        ``min_noise_multiplier`` costs (replace-one, ``2/z_min²``). Below that the client raises ``z``
        itself (the smallest power-of-two multiple of the request that meets it, then bisection) rather
        than refuse; a mechanism whose ρ it cannot bound is refused.
        """
        if not clip_norm > 0:
            raise PolicyRefusal(f"client mechanism {mechanism.name!r} needs a clip norm > 0, got {clip_norm}")
        cap = min(self.max_rho_per_round, self._gaussian_rho(self.min_noise_multiplier))
        rho = self._mechanism_rho(mechanism, requested, dim)
        if rho <= cap:
            return requested
        if not math.isfinite(self._mechanism_rho(mechanism, 1e6 * max(requested, 1.0), dim)):
            raise PolicyRefusal(f"client mechanism {mechanism.name!r}: this client cannot bound its privacy "
                                "loss (no zCDP bound for its event); refused")
        # Gaussian: closed form; other mechanisms: bisection on the monotone rho(z)
        if isinstance(mechanism, GaussianNoise):
            return max(requested, self.min_noise_multiplier, math.sqrt(2.0 / self.max_rho_per_round))
        lo, hi = max(requested, 1e-12), max(requested, 1e-12)
        while self._mechanism_rho(mechanism, hi, dim) > cap:
            lo, hi = hi, 2.0 * hi
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self._mechanism_rho(mechanism, mid, dim) > cap else (lo, mid)
        return hi

    @staticmethod
    def _gaussian_rho(z: float) -> float:
        return math.inf if z <= 0 else 2.0 / (z * z)

    @staticmethod
    def _mechanism_rho(mechanism: ClientMechanism, z: float, dim: int | None) -> float:
        if not z > 0:
            return math.inf
        return zcdp_rho(mechanism.event(noise_multiplier=z, dim=dim), neighbouring="replace-one")

    def check_secagg(self, setup: SetupRequest) -> None:
        """The secure-aggregation setup: schedule, colluders and the crowd floor's threshold and survivors
        (:func:`fedprivacy.fl.client_limits.check_crowd`; the roster is checked at the share stage)."""
        if self.schedule == "active" and not setup.active:
            raise PolicyRefusal("server asks for the semi-honest secure-aggregation schedule; this "
                                "client requires the actively secure one (node config client-secagg-schedule)")
        if setup.colluders < self.colluders:
            raise PolicyRefusal(f"server's setup assumes {setup.colluders} colluding clients, this client "
                                f"assumes {self.colluders} (node config client-secagg-colluders)")
        check_crowd(self, threshold=setup.threshold, survivors=setup.required_survivors,
                    colluders=max(setup.colluders, self.colluders))

    def check_distributed(self, config: DistributedDPConfig, *, setup: SetupRequest, roster: int) -> float:
        """Refuse a distributed encoding outside the floor; returns the worst-case ρ of the round.

        ``config`` is the complete encoding as the server sent it; ``roster`` the size of the round's
        roster as this client saw it.
        """
        self.check_mode("distributed")
        self.check_secagg(setup)
        if not config.xnoise:
            raise PolicyRefusal("encoding asks for the legacy noise share (each client N_Z(0, sigma^2/t) "
                                "from the float64 sampler, whose deviation is not bounded in the claim); "
                                "this client adds only exact XNoise components (xnoise=true)")
        from fedprivacy.dp.tabulated import check_exp_accuracy

        try:  # the exact sampler's bound assumes this platform's exp: check before sharing
            check_exp_accuracy()
        except ArithmeticError as exc:
            raise PolicyRefusal(str(exc)) from None
        if config.colluders < self.colluders:
            raise PolicyRefusal(f"encoding assumes {config.colluders} colluders, this client assumes "
                                f"{self.colluders}")
        if config.padded_dim != setup.dim or config.modulus_bits != setup.modulus_bits:
            raise PolicyRefusal("encoding does not match the round's secure-aggregation setup")
        if config.min_survivors > setup.required_survivors:
            raise PolicyRefusal(f"encoding assumes {config.min_survivors} noisy survivors but the round "
                                f"releases sums of {setup.required_survivors}")
        if config.noise_multiplier < self.min_noise_multiplier:
            raise PolicyRefusal(f"server asks for noise multiplier {config.noise_multiplier:g} < "
                                f"{self.min_noise_multiplier:g} (node config client-min-noise-multiplier)")
        if config.count_scale:  # adaptive clipping's count coordinate: never less noise than the floor
            count_z = math.sqrt(config.target_variance) / config.count_scale
            if count_z < self.min_noise_multiplier:
                raise PolicyRefusal(f"server asks for a clipped-count coordinate of noise multiplier "
                                    f"{count_z:g} < {self.min_noise_multiplier:g} (node config "
                                    "client-min-noise-multiplier; the count is 2 sigma_b)")
        release = self.distributed_release(config, roster=roster)
        rho = self._rho(release.noise_multiplier)
        slack = release.eta + release.sampler_ratio
        if slack > self.max_slack_per_round:  # the accounting's own looseness is a cost too
            raise PolicyRefusal(f"distributed encoding's discrete slack {slack:.3g} (an additive epsilon of the "
                                f"release over its dominating Gaussian) > {self.max_slack_per_round:g} (node config "
                                "client-max-slack-per-round): its C x scale is too small for its roster and dimension")
        if release.sampler_tv > MAX_TV_PER_ROUND:
            raise PolicyRefusal(f"distributed encoding's sampler truncation {release.sampler_tv:.3g} > "
                                f"{MAX_TV_PER_ROUND:g}: this client cannot account it")
        self._check_rho(rho, f"distributed encoding (worst sum: {config.min_survivors} survivors, "
                             f"{config.colluders} colluders)")
        return rho

    @staticmethod
    def distributed_release(config: DistributedDPConfig, *, roster: int) -> DistributedRelease:
        """What a distributed round really costs this client: the release that dominates every sum
        the server could finish the round with (any survivor count, any roster up to ``roster``;
        :meth:`fedprivacy.secagg.ddp.DistributedDPConfig.worst_release`, the same one the server's
        ledger charges). Its dominating Gaussian gives the round's ρ and its ``eta + sampler_ratio``
        and ``sampler_tv`` the discrete slack the client's total adds. Raises
        :class:`PolicyRefusal` when the encoding cannot be accounted (e.g. a scale too small)."""
        try:
            return config.worst_release(max_roster=roster)
        except ValueError as exc:  # no bound, no participation
            raise PolicyRefusal(f"distributed encoding cannot be accounted: {exc}") from None

    def round_rho(self, instructions: RoundInstructions, *, dim: int | None = None) -> float:
        """The zCDP ρ of a plain-path round's reply under :meth:`apply`'s instructions, for the
        client's total (:mod:`fedprivacy.fl.client_budget`).

        With a client mechanism: the ρ of its own event (:func:`fedprivacy.fl.mechanisms.zcdp_rho`,
        replace-one on the clipped update; the Gaussian's ``2/z²``). Without one the update leaves
        without the client's noise: ``ρ = ∞``. A seeded round (``seed >= 0``, only where
        ``client-allow-seeded``): the server that sent the seed can regenerate the noise and subtract
        it, ``ρ = ∞`` too.
        """
        if instructions.seed >= 0 or not instructions.clip_norm > 0:
            return math.inf
        try:
            mechanism = get_client_mechanism(instructions.client_mechanism)
        except UnknownMechanism:
            return math.inf
        if mechanism is None or getattr(mechanism, "secure_only", False):
            return math.inf
        return self._mechanism_rho(mechanism, instructions.noise_multiplier, dim)

    def memory_path(self, *, run_id: int, partition_id: int) -> Path:
        """The node's durable memory file: ``budget_path``, else ``partition-<partition_id>.jsonl`` in
        ``memory_dir`` (:data:`RUN_TEMP`: :func:`run_temp_dir`; ``""``: :func:`default_memory_dir`).
        Named by the operator's ``partition-id``, never by the node id, which the server assigns: a new
        node id must not open a fresh memory (and a fresh budget)."""
        if self.budget_path:
            return _path(self.budget_path)
        env = tuple(os.environ.get(k) for k in (MEMORY_ENV_VAR, RUN_TEMP_ENV_VAR, "XDG_STATE_HOME", "HOME"))
        return _memory_path(self.memory_dir, int(run_id), int(partition_id), env)

    def budget(self, *, charges: Sequence[BudgetCharge] = (), path: Path | None = None,
               expect: tuple[str, int] | None = None, load: bool = True) -> ClientBudget:
        """This client's :class:`fedprivacy.fl.client_budget.ClientBudget`: the file ``path`` (default
        ``budget_path``; ``expect``: its id and length as the node state saw them), or ``charges`` when
        there is no file."""
        from fedprivacy.fl.client_budget import ClientBudget

        file = path or (Path(self.budget_path) if self.budget_path else None)
        return ClientBudget(max_rho_total=self.max_rho_total, max_slack_total=self.max_slack_total,
                            neighbouring=self.neighbouring, path=file, charges=() if file else charges,
                            expect=expect, load=load)

    def disclosed(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Only the metrics this client may send."""
        return {k: v for k, v in metrics.items() if k in self.disclose}

    # ------------------------------------------------------------------ applied to a round
    def apply(self, instructions: RoundInstructions, *, path: str = "plain", dim: int | None = None,
              mode: Any = None) -> RoundInstructions:
        """The instructions this client follows: its mode floor, its own seed rule, and with a client
        mechanism its own noise (never below its floor). Raises :class:`PolicyRefusal`.

        ``path`` is the message path the instructions came on: ``"plain"`` (the ``train`` message,
        whose reply is the clipped update with the client mechanism's noise) or ``"secagg"`` (the
        masked stage). A mechanism that adds its noise only inside secure aggregation (distributed
        mode's XNoise) is refused on the plain path whatever the floor admits: a server that skips the
        secure stages would otherwise read the un-noised update. A mechanism this process has not
        registered is refused, and so is one other than ``mode``'s (the client's own registry entry for
        the privacy the server names, :class:`fedprivacy.fl.modes.PrivacyMode`): a server cannot run a
        mode under another mode's mechanism.
        """
        import dataclasses

        if path not in ("plain", "secagg"):
            raise ValueError(f"path must be 'plain' or 'secagg', got {path!r}")
        self.check_mode(instructions.privacy)
        try:
            mechanism = get_client_mechanism(instructions.client_mechanism)
        except UnknownMechanism as exc:
            raise PolicyRefusal(str(exc)) from None
        if mode is not None:
            own = mode.client_mechanism
            if (own.name if own is not None else "") != instructions.client_mechanism:
                raise PolicyRefusal(f"server asks for privacy {instructions.privacy!r} with client mechanism "
                                    f"{instructions.client_mechanism!r}; that mode's is "
                                    f"{own.name if own is not None else 'none'!r} here; refused")
        secure_only = mechanism is not None and getattr(mechanism, "secure_only", False)
        if path == "plain" and secure_only:
            raise PolicyRefusal(f"privacy {instructions.privacy!r} on the plain train path: its noise "
                                f"({instructions.client_mechanism}) is added only through the secure-"
                                "aggregation stages; refused")
        changes: dict[str, Any] = {"seed": self.seed(instructions.seed)}
        if mechanism is not None and not secure_only:
            changes["noise_multiplier"] = self.client_noise_multiplier(
                mechanism, clip_norm=instructions.clip_norm, requested=instructions.noise_multiplier, dim=dim)
        if all(getattr(instructions, k) == v for k, v in changes.items()):
            return instructions  # nothing to change (frozen: the same instructions, without a replace)
        return dataclasses.replace(instructions, **changes)

    def filter_update(self, update: ClientUpdate) -> ClientUpdate:
        """The update with only the metadata this client discloses (``disclose``)."""
        import dataclasses

        metrics = {k: v for k, v in update.metrics.items() if k.replace("_", "-") in self.disclose}
        if (len(metrics) == len(update.metrics) and (update.num_examples is None or "num-examples" in self.disclose)
                and (update.train_loss is None or "train-loss" in self.disclose)):
            return update  # everything in it may leave (frozen: the same update, without a replace)
        return dataclasses.replace(
            update, metrics=metrics,
            num_examples=update.num_examples if "num-examples" in self.disclose else None,
            train_loss=update.train_loss if "train-loss" in self.disclose else None)

