"""Deterministic, seeded fault injection for the in-process engine.

A :class:`FaultPlan` is a tuple of :class:`FaultRule` values plus a seed. For every
instruction Message the engine is about to deliver, the plan decides whether the
destination client

- ``drop``: never replies (the node vanished; the ServerApp sees a missing reply once
  its ``send_and_receive`` timeout passes),
- ``delay``: replies, but ``delay`` seconds late (past the timeout if ``delay`` is
  larger than it; the late reply can still be pulled later, as with Flower's SuperLink),
- ``raise``: raises inside the ClientApp, which Flower turns into an Error reply
  (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``).

A rule matches on the message type (``fnmatch`` pattern, so ``"train"``,
``"query.*"`` or ``"*"``; a type also names its stages, so ``"train"`` matches
``"train.secagg_masked"``), the round (the Message ``group_id``, which fedprivacy's
ServerApp sets to the round number) and either explicit partition ids or a seeded
fraction of all partitions. Fractions are decided per (rule, message type, round,
partition) by hashing those values with the plan's seed (SHA-256), so a plan gives the
same faults in every run, in any process, in any order of delivery. This randomness is
for test scenarios only; it never feeds privacy noise. The start-up partition query (type
``"query"`` itself) is hit only by a rule whose type is ``"query"``, so ``"raise:partitions=7"``
faults client 7's rounds, not the run's start.

Threat model note: ``drop`` at a secure-aggregation stage models a client that goes
offline mid-protocol; a malicious *server* is modelled by the ServerApp under test
(or a test double of it), not by this plan.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, field
from typing import Literal

FaultAction = Literal["drop", "delay", "raise"]
_ACTIONS = ("drop", "delay", "raise")
_START_UP_QUERY = "query"


class InjectedClientFault(RuntimeError):
    """Raised inside a client whose message matched a ``raise`` rule."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultRule:
    """One fault: what happens to which clients at which message and round.

    Attributes:
        action: ``"drop"``, ``"delay"`` or ``"raise"``.
        message_type: ``fnmatch`` pattern on ``Message.metadata.message_type``
            (e.g. ``"train"``, ``"train.*"``, ``"*"``).
        rounds: rounds (``int(group_id)``) the rule applies to; ``None`` means all.
        partition_ids: clients (by ``node_config["partition-id"]``) hit by the rule.
        fraction: alternatively, the seeded fraction in ``[0, 1]`` of clients hit.
        delay: seconds a ``delay`` reply is late (must be > 0 for ``delay``).
    """

    action: FaultAction
    message_type: str = "*"
    rounds: tuple[int, ...] | None = None
    partition_ids: tuple[int, ...] | None = None
    fraction: float | None = None
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.action not in _ACTIONS:
            raise ValueError(f"action must be one of {_ACTIONS}, got {self.action!r}")
        if not isinstance(self.message_type, str) or not self.message_type:
            raise ValueError(f"message_type must be a non-empty pattern, got {self.message_type!r}")
        if (self.partition_ids is None) == (self.fraction is None):
            raise ValueError(
                "exactly one of partition_ids and fraction must be set, got "
                f"partition_ids={self.partition_ids!r}, fraction={self.fraction!r}"
            )
        if self.partition_ids is not None:
            object.__setattr__(self, "partition_ids", tuple(int(p) for p in self.partition_ids))
            if any(p < 0 for p in self.partition_ids):
                raise ValueError(f"partition_ids must be >= 0, got {self.partition_ids}")
        if self.fraction is not None and not 0.0 <= float(self.fraction) <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {self.fraction}")
        if self.rounds is not None:
            object.__setattr__(self, "rounds", tuple(int(r) for r in self.rounds))
        if self.action == "delay" and not self.delay > 0:
            raise ValueError(f"delay must be > 0 for a delay rule, got {self.delay}")
        if self.action != "delay" and self.delay != 0.0:
            raise ValueError(f"delay is only meaningful for action='delay', got {self.delay}")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultDecision:
    """What the engine does with one instruction Message."""

    action: FaultAction
    delay: float
    rule_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultPlan:
    """A deterministic set of fault rules; the first matching rule wins.

    Attributes:
        rules: the rules, checked in order.
        seed: seed for ``fraction`` rules.
        real_time: if False (default), time is virtual: a dropped or late reply is
            simply missing from ``send_and_receive`` without sleeping. If True, the
            engine sleeps until the timeout whenever a reply is missing, as a real
            SuperLink would.
    """

    rules: tuple[FaultRule, ...] = field(default_factory=tuple)
    seed: int = 0
    real_time: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        for rule in self.rules:
            if not isinstance(rule, FaultRule):
                raise TypeError(f"rules must hold FaultRule values, got {type(rule).__name__}")
        if not isinstance(self.seed, int):
            raise TypeError(f"seed must be an int, got {type(self.seed).__name__}")

    @staticmethod
    def _round_of(group_id: str) -> int | None:
        try:
            return int(group_id)
        except ValueError:
            return None

    def _hit_fraction(
        self, *, index: int, fraction: float, message_type: str, group_id: str, partition_id: int
    ) -> bool:
        digest = hashlib.sha256(
            f"fedprivacy/faults/v1|{self.seed}|{index}|{message_type}|{group_id}|{partition_id}".encode()
        ).digest()
        u = int.from_bytes(digest[:8], "big") / 2.0**64
        return u < fraction

    def decide(
        self, *, message_type: str, group_id: str, partition_id: int
    ) -> FaultDecision | None:
        """Return the fault for this (message type, round, client), or None."""
        rnd = self._round_of(group_id)
        for index, rule in enumerate(self.rules):
            if not _type_matches(rule.message_type, message_type):
                continue
            if rule.rounds is not None and rnd not in rule.rounds:
                continue
            if rule.partition_ids is not None:
                hit = partition_id in rule.partition_ids
            else:
                hit = self._hit_fraction(
                    index=index,
                    fraction=float(rule.fraction or 0.0),
                    message_type=message_type,
                    group_id=group_id,
                    partition_id=partition_id,
                )
            if hit:
                return FaultDecision(action=rule.action, delay=rule.delay, rule_index=index)
        return None

    @classmethod
    def parse(cls, spec: str, *, seed: int = 0) -> FaultPlan:
        """Build a plan from a compact string (used by the CLI).

        Rules are separated by ``;``; each is ``action:key=value,...`` with keys
        ``type``, ``rounds`` (``1|2``), ``partitions`` (``0|3``), ``fraction`` and
        ``delay``. Example: ``"drop:type=train,rounds=2,fraction=0.3;raise:partitions=1"``.
        """
        rules = []
        for part in (p.strip() for p in spec.split(";")):
            if not part:
                continue
            action, _, rest = part.partition(":")
            kwargs: dict[str, object] = {"action": action.strip()}
            for item in (i.strip() for i in rest.split(",")):
                if not item:
                    continue
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"fault rule item must be key=value, got {item!r}")
                key = key.strip()
                if key == "type":
                    kwargs["message_type"] = value.strip()
                elif key == "rounds":
                    kwargs["rounds"] = tuple(int(v) for v in value.split("|"))
                elif key == "partitions":
                    kwargs["partition_ids"] = tuple(int(v) for v in value.split("|"))
                elif key == "fraction":
                    kwargs["fraction"] = float(value)
                elif key == "delay":
                    kwargs["delay"] = float(value)
                else:
                    raise ValueError(f"unknown fault rule key {key!r} in {part!r}")
            rule = FaultRule(**kwargs)  # type: ignore[arg-type]
            if not any(_type_matches(rule.message_type, t) for t in _app_message_types()):
                raise ValueError(f"fault rule {part!r}: type={rule.message_type!r} matches no message the "
                                 f"app sends; types: {', '.join(_app_message_types())}")
            rules.append(rule)
        return cls(rules=tuple(rules), seed=seed)


def _type_matches(pattern: str, message_type: str) -> bool:
    """``pattern`` hits ``message_type`` or one of its stages (``type.stage``); the start-up partition
    query (``"query"`` itself) only when the pattern names it."""
    if message_type == _START_UP_QUERY:
        return pattern == _START_UP_QUERY
    return fnmatch.fnmatchcase(message_type, pattern) or fnmatch.fnmatchcase(message_type, pattern + ".*")


def _app_message_types() -> tuple[str, ...]:
    """The message types fedprivacy's ServerApp sends (checked by :meth:`FaultPlan.parse`)."""
    from fedprivacy_flwr.secagg_records import MESSAGE_TYPES

    return ("train", _START_UP_QUERY, *MESSAGE_TYPES.values())
