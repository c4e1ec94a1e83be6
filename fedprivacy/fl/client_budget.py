"""The client's own cumulative privacy budget: the total zCDP ρ it releases, across rounds and runs.

Threat model: the server chooses every message. The per-round floor
(:class:`fedprivacy.fl.client_policy.ClientPolicy`, ``client-max-rho-per-round``) bounds what one round
costs and the node's round record (:mod:`clients.round_log`) refuses a round number twice, but a
deviating server can ask for round after round with fresh numbers, or start a new run (Flower's node
state is per run). So the client sums what it has released and refuses a round that would take the
sum above its own ``client-max-rho-total``.

The sum. Every round is charged at the ρ the client itself computed from what it really sends
(:meth:`ClientPolicy.round_rho`), a ``distributed`` round's small discrete slack recorded beside it and
added by :func:`total_epsilon`. zCDP composes additively under adaptive composition (Bun & Steinke
2016, Lemma 2.3 / Prop. 1.9), so the total bounds the client's loss against the server whatever the
server did between rounds; ρ-zCDP gives (ρ + 2√(ρ log(1/δ)), δ)-DP for every δ > 0 (their Prop. 1.3).
One total serves replace-one and add-remove; the file records the relation and refuses another. A
``central`` or ``none`` round sends the update without the client's noise: it is charged ``ρ = ∞`` and
refused by any finite total (``client-max-rho-total=inf`` is the operator saying it trusts the server).

Durability. The charges, and every other guard of the node (the rounds it took part in, each secure
stage it answered), are appended to the node's JSON-lines file (:mod:`clients.budget_log` names it),
shared by every run of the node, under an exclusive ``flock``, re-read before each check, and
``fsync``'d before the reply may leave the client: a crash leaves over-counts, never under-counts. A
torn last line (nothing was released on it) is dropped; ``expect`` (the file's id and length as the
node state last saw them) refuses a file that is missing, replaced or shorter than the node state says.

File format ``fedprivacy.client-budget/v1``: a ``header`` line, one ``charge`` line per released round
and one ``stage`` line per secure stage answered (:class:`BudgetCharge`,
:meth:`ClientBudget.record_stage`). Rationale: docs/SECAGG.md, section "The client's durable memory".
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprivacy.accounting.accountant import _fsync_dir
from fedprivacy.fl.client_limits import MAX_TV_TOTAL, PolicyRefusal

__all__ = ["BUDGET_FORMAT", "BudgetCharge", "ClientBudget", "sync_file", "total_epsilon"]

BUDGET_FORMAT = "fedprivacy.client-budget/v1"


@dataclass(slots=True)
class _Parsed:
    """A budget file as this process last read it: its identity, the bytes parsed and what they hold."""

    dev: int
    ino: int
    head: bytes = b""  # the header line (its random id): a new file under a reused inode differs there
    offset: int = 0
    lines: int = 0
    file_id: str = ""
    neighbouring: str = ""
    charges: list[BudgetCharge] = field(default_factory=list)
    stages: set[tuple[str, int, str]] = field(default_factory=set)


#: path -> its parse, oldest first (a simulation's nodes each have a file; a sweep runs many runs)
_PARSED: dict[str, _Parsed] = {}
_PARSED_MAX = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetCharge:
    """One released round, as the client charged it.

    Attributes:
        run: the run it belongs to (Flower's run id, as text).
        round: the round number.
        mode: the privacy mode of the round.
        rho: its zCDP ρ (``math.inf``: released without the client's noise).
        slack: a ``distributed`` round's density-ratio slack ``eta + A`` (an additive epsilon of the
            discrete release over its dominating Gaussian, :mod:`fedprivacy.accounting.release`).
        tv: that round's sampler-truncation term ``G`` (total variation, an additive delta).
    """

    run: str
    round: int
    mode: str
    rho: float
    slack: float = 0.0
    tv: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.round, bool) or not isinstance(self.round, int):
            raise TypeError(f"round must be an int, got {type(self.round).__name__}")
        if not (self.rho >= 0):  # NaN fails too
            raise ValueError(f"rho must be >= 0 (or inf), got {self.rho}")
        if not (0 <= self.slack < math.inf and 0 <= self.tv < 1):
            raise ValueError(f"slack must be finite and >= 0 and tv in [0, 1), got slack={self.slack}, "
                             f"tv={self.tv}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "charge", "run": self.run, "round": self.round, "mode": self.mode,
                               "rho": "inf" if math.isinf(self.rho) else self.rho}
        if self.slack or self.tv:
            out.update(slack=self.slack, tv=self.tv)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BudgetCharge:
        rho = data["rho"]
        return cls(run=str(data["run"]), round=int(data["round"]), mode=str(data["mode"]),
                   rho=math.inf if rho == "inf" else float(rho), slack=float(data.get("slack", 0.0)),
                   tv=float(data.get("tv", 0.0)))


def sync_file(path: str | os.PathLike[str]) -> None:
    """fsync ``path`` (records written with ``ClientBudget.sync = False``): one flush for several records."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _total(charges: Sequence[BudgetCharge]) -> float:
    return math.fsum(c.rho for c in charges) if all(math.isfinite(c.rho) for c in charges) else math.inf


def total_epsilon(charges: Sequence[BudgetCharge], *, delta: float) -> float:
    """The (ε, δ)-DP these releases compose to, against the server, at ``delta`` (inf if one is unbounded).

    ρ-zCDP composes additively (Bun & Steinke 2016, Lemma 2.3) and converts at ``δ'`` by
    :func:`fedprivacy.accounting.kls.zcdp_epsilon` (Canonne, Kamath & Steinke 2020, Cor. 13);
    the ``distributed`` rounds' discrete slack is added by the same chain as the server's figure
    (:func:`fedprivacy.accounting.audiences.slack_epsilon`: ``+2H'`` with ``H' = sum slack - log(1 -
    sum tv)``, at ``δ' = δ (1 - 1e-6) e^-H'``), so the total bounds the real discrete release.
    """
    from fedprivacy.accounting.audiences import slack_epsilon
    from fedprivacy.accounting.kls import zcdp_epsilon

    rho = _total(charges)
    if math.isinf(rho):
        return math.inf
    return slack_epsilon(lambda d: zcdp_epsilon(rho=rho, delta=d), delta=delta,
                         ratio=math.fsum(c.slack for c in charges), tv=math.fsum(c.tv for c in charges))


class ClientBudget:
    """A client's cumulative ρ ledger: check first, charge durably, never refund.

    Args:
        max_rho_total: the largest total ρ the client releases (``client-max-rho-total``; may be inf).
        max_slack_total: the largest total discrete slack of its distributed rounds
            (``client-max-slack-total``); their truncation terms are capped by
            :data:`fedprivacy.fl.client_limits.MAX_TV_TOTAL`.
        neighbouring: the relation its ρ are computed under (``client-neighbouring``).
        path: the node's durable memory, shared by all its runs (``client-budget-path``, or the default
            file, :meth:`fedprivacy.fl.client_policy.ClientPolicy.memory_path`); None: an in-memory
            ledger of ``charges`` (for computations; the ClientApp always has a file).
        charges: the charges so far when there is no file.
        expect: ``(id, lines)`` of the file as the node state last recorded it: a file with another id
            (missing and re-created, or replaced) or fewer complete lines is refused
            (:class:`PolicyRefusal`) on every read.
        load: read the file now (False: at the first check, charge or record, each of which reads it).
    """

    def __init__(self, *, max_rho_total: float, neighbouring: str, path: str | os.PathLike[str] | None = None,
                 charges: Sequence[BudgetCharge] = (), max_slack_total: float = math.inf,
                 expect: tuple[str, int] | None = None, load: bool = True) -> None:
        if not (max_rho_total > 0):
            raise ValueError(f"max_rho_total must be > 0, got {max_rho_total}")
        if not (max_slack_total > 0):
            raise ValueError(f"max_slack_total must be > 0, got {max_slack_total}")
        self.max_slack_total = float(max_slack_total)
        if neighbouring not in ("add-remove", "replace-one"):
            raise ValueError(f"neighbouring must be 'add-remove' or 'replace-one', got {neighbouring!r}")
        self.max_rho_total = float(max_rho_total)
        self.neighbouring = neighbouring
        self.path = path if isinstance(path, Path) else (Path(path) if path else None)
        if self.path is not None and charges:
            raise ValueError("give either a budget file (path) or the node state's charges, not both")
        self._charges: list[BudgetCharge] = list(charges)
        self._stages: set[tuple[str, int, str]] = set()  # (run, round, stage) answered (the file's record)
        self._expect = expect
        self.file_id, self.lines = "", 0  # the file's header id and complete lines (as of the last read)
        self.sync = True  # fsync each record as it is written (False: the caller's sync_file, once)
        if self.path is not None and load:
            with self._locked() as fd:
                self._charges = self._read(fd)

    # ------------------------------------------------------------------ reading
    @property
    def charges(self) -> tuple[BudgetCharge, ...]:
        """Every charge (as of the last check or charge)."""
        return tuple(self._charges)

    @property
    def spent(self) -> float:
        """The total ρ released so far (inf after a round without the client's noise)."""
        return _total(self._charges)

    def epsilon(self, *, delta: float) -> float:
        """The (ε, δ) of everything charged so far, slack of the discrete releases included
        (:func:`total_epsilon`)."""
        return total_epsilon(self._charges, delta=delta)

    def _refusal(self, rho: float, *, round: int, what: str, slack: float = 0.0, tv: float = 0.0) -> str | None:
        slack_total = math.fsum(c.slack for c in self._charges) + slack
        if slack_total > self.max_slack_total:
            return (f"{what} round {round}'s discrete slack {slack:.3g} would take this client's total slack above "
                    f"{self.max_slack_total:g} (node config client-max-slack-total; an additive epsilon of the "
                    "distributed releases over their dominating Gaussians)")
        if math.fsum(c.tv for c in self._charges) + tv > MAX_TV_TOTAL:
            return (f"{what} round {round}'s sampler truncation would take this client's total above "
                    f"{MAX_TV_TOTAL:g}, beyond what its epsilon conversion certifies")
        total = _total([*self._charges, BudgetCharge(run="", round=round, mode="", rho=rho)])
        if total <= self.max_rho_total:
            return None
        where = f"durable memory {self.path}" if self.path is not None else "memory"
        cost = "an unbounded rho (the update leaves without this client's noise)" if math.isinf(rho) \
            else f"rho = {rho:.4g}"
        # The refusal goes to the server as the error reply's reason: it names the round's cost (a function
        # of the server's own request) and the rule, never the total, the history or the file, which
        # describe the node's participation in other runs and federations. Those stay here.
        logging.getLogger(__name__).warning(
            "%s round %d refused: its %s would take this client's total to %.4g > %g (%.4g spent over %d "
            "rounds in %s)", what, round, cost, total, self.max_rho_total, self.spent, len(self._charges), where)
        return (f"{what} round {round} would cost {cost}, which this client's cumulative budget cannot pay "
                "(node config client-max-rho-total; the total and the rounds charged stay on the client; "
                "zCDP composes additively, Bun & Steinke 2016 Lemma 2.3)")

    def _repeat(self, charge: BudgetCharge) -> str | None:
        """Why a second release of one round of one run is refused, or None.

        The node's round record (:mod:`clients.round_log`) and its secure-aggregation session live in
        Flower's node state, which the SuperNode saves only after the reply has left, once, and drops
        for an expired task: a lost save rolls them back, and a repeated masked request would then be
        answered with the same masks and the same seeded XNoise, so the difference of the two replies is
        this client's own update. The budget file is durable and written before the reply leaves, so it
        refuses a round it has already charged for that run, whatever the node state says.
        """
        if not any(c.run == charge.run and c.round == charge.round for c in self._charges):
            return None
        return (f"round {charge.round} of this run was already released by this client (its charge is on "
                "record): a second reply for the same round is refused (a secure round's masks and noise "
                "are used once)")

    def check(self, rho: float, *, round: int, what: str = "", slack: float = 0.0, tv: float = 0.0) -> None:
        """Refuse (:class:`PolicyRefusal`) a round of cost ``rho`` (and discrete ``slack``, ``tv``) that the
        total cannot pay.

        Re-reads the budget file first (another run of the node may have charged). Changes nothing.
        """
        if self.path is not None:
            with self._locked() as fd:
                self._charges = self._read(fd)
        reason = self._refusal(rho, round=round, what=what, slack=slack, tv=tv)
        if reason is not None:
            raise PolicyRefusal(reason)

    def charge(self, rho: float, *, run: str, round: int, mode: str, what: str = "", slack: float = 0.0,
               tv: float = 0.0) -> BudgetCharge:
        """Charge one round's release, durably (fsync) when there is a file; call before the reply leaves.

        Check first, change state last: under the file's lock the file is re-read, the total checked
        and only then the line appended and fsync'd. Raises :class:`PolicyRefusal` (nothing written)
        when the total cannot pay: the reply must then not be sent.
        """
        charge = BudgetCharge(run=str(run), round=round, mode=mode, rho=float(rho), slack=float(slack),
                              tv=float(tv))
        if self.path is None:
            reason = self._repeat(charge) or self._refusal(charge.rho, round=round, what=what,
                                                          slack=charge.slack, tv=charge.tv)
            if reason is not None:
                raise PolicyRefusal(reason)
            self._charges.append(charge)
            return charge
        with self._locked() as fd:
            self._charges = self._read(fd)
            reason = self._repeat(charge) or self._refusal(charge.rho, round=round, what=what,
                                                          slack=charge.slack, tv=charge.tv)
            if reason is not None:
                raise PolicyRefusal(reason)
            self._append(fd, {**charge.to_dict(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        return charge

    def record_stage(self, *, run: str, round: int, stage: str) -> None:
        """Record durably (file only) that this node answered ``stage`` of round ``round`` of ``run``;
        refuse (:class:`PolicyRefusal`, nothing written) a second answer. Call before the reply leaves.

        A secure round's share stage (its keys split for one roster), consistency stage (the signed view)
        and unmask stage (which of each peer's two shares it reveals) must each be answered once: a second
        split for another roster, or revealing a survivor's self-mask share and, after a second request,
        its pairwise-key share, would let the server unmask that client's own vector. Stage ``"admit"``
        (a round's advertise or plain train) also refuses a round number not above every admitted one of
        the run (the durable twin of :class:`fedprivacy.secagg.protocol.RoundLog`). The session that
        enforces these lives in Flower's node state, which a lost save rolls back; this file, written
        before the reply leaves, does not roll back.
        """
        if self.path is None:
            return
        with self._locked() as fd:
            self._charges = self._read(fd)
            self._refuse_repeat(run=str(run), round=int(round), stage=stage)
            self._append(fd, {"kind": "stage", "run": str(run), "round": int(round), "stage": stage})

    def _refuse_repeat(self, *, run: str, round: int, stage: str) -> None:
        if (run, round, stage) in self._stages:
            raise PolicyRefusal(f"round {round}'s {stage} stage of this run was already answered by this "
                                "client (on record): a second answer is refused")
        if stage == "admit":
            last = max((r for (u, r, s) in self._stages if u == run and s == "admit"), default=-1)
            if round <= last:
                raise PolicyRefusal(f"round {round} is not after the last round this client took part in "
                                    f"({last}, on record): refusing to take part twice")

    # ------------------------------------------------------------------ the file
    @contextmanager
    def _locked(self) -> Iterator[int]:
        """The budget file's descriptor, under an exclusive lock (the file created with its header)."""
        import fcntl

        assert self.path is not None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size == 0:
                head = {"kind": "header", "format": BUDGET_FORMAT, "neighbouring": self.neighbouring,
                        "id": secrets.token_hex(8)}
                os.write(fd, (json.dumps(head) + "\n").encode("utf-8"))
                os.fsync(fd)
                _fsync_dir(self.path.parent)
            yield fd
        finally:
            os.close(fd)  # (and the lock with it)

    def _append(self, fd: int, line: Mapping[str, Any]) -> None:
        """Append one record after a :meth:`_read` under the same lock, and fsync it (:attr:`sync` False:
        the caller fsyncs it, :func:`sync_file`, before anything that depends on it leaves)."""
        text = json.dumps(line, allow_nan=False)
        data = (text + "\n").encode("utf-8")
        got = _PARSED[os.fspath(self.path)]  # type: ignore[arg-type]
        os.pwrite(fd, data, got.offset)  # the file's end: the read just before reached it
        if self.sync:
            os.fsync(fd)
        self._parse(got, [text])
        got.offset += len(data)
        self.lines = got.lines

    def _read(self, fd: int) -> list[BudgetCharge]:
        """Every complete record of the file (under the lock); a torn last line (its write never returned)
        is cut off. This process parses each byte once (:data:`_PARSED`): a file that another process
        appended to is read from where it was left; one replaced or shorter is read again from the start."""
        st = os.fstat(fd)
        key = os.fspath(self.path)  # type: ignore[arg-type]
        got = _PARSED.pop(key, None)
        if (got is None or (got.dev, got.ino) != (st.st_dev, st.st_ino) or st.st_size < got.offset
                or os.pread(fd, len(got.head), 0) != got.head):
            got = _Parsed(dev=st.st_dev, ino=st.st_ino)
        if st.st_size > got.offset:
            complete, sep, torn = os.pread(fd, st.st_size - got.offset, got.offset).rpartition(b"\n")
            if torn:
                os.ftruncate(fd, got.offset + len(complete) + len(sep))
                os.fsync(fd)
            if sep:
                self._parse(got, complete.decode("utf-8").split("\n"))  # (raises: the entry stays dropped)
                if not got.offset:
                    got.head = complete.split(b"\n", 1)[0] + b"\n"
                got.offset += len(complete) + 1
        if got.lines and got.neighbouring != self.neighbouring:
            raise ValueError(f"client budget file {self.path} sums rho under {got.neighbouring!r}, this client "
                             f"computes it under {self.neighbouring!r} (node config client-neighbouring); "
                             "use another client-budget-path or the file's relation")
        _PARSED[key] = got
        while len(_PARSED) > _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        self._stages, self.file_id, self.lines = got.stages, got.file_id, got.lines
        self._check_expected()
        return got.charges

    def _parse(self, got: _Parsed, lines: Sequence[str]) -> None:
        for line in lines:
            i = got.lines
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"client budget file {self.path} line {i + 1} is not valid JSON: {exc}") from None
            if i == 0:
                if not isinstance(rec, dict) or rec.get("format") != BUDGET_FORMAT:
                    raise ValueError(f"client budget file {self.path} does not start with a "
                                     f"{BUDGET_FORMAT} header")
                got.file_id, got.neighbouring = str(rec.get("id", "")), str(rec.get("neighbouring"))
            elif isinstance(rec, dict) and rec.get("kind") == "stage":
                got.stages.add((str(rec["run"]), int(rec["round"]), str(rec["stage"])))
            elif isinstance(rec, dict) and rec.get("kind") == "charge":
                got.charges.append(BudgetCharge.from_dict(rec))
            else:
                raise ValueError(f"client budget file {self.path} line {i + 1} is not a charge: {rec!r}")
            got.lines += 1

    def _check_expected(self) -> None:
        if self._expect is None:
            return
        file_id, lines = self._expect
        if self.file_id != file_id or self.lines < lines:
            logging.getLogger(__name__).error("durable memory %s (id %s, %d records) is not the one the node "
                                              "state saw (id %s, %d records)", self.path, self.file_id,
                                              self.lines, file_id, lines)
            raise PolicyRefusal("this client's durable memory is missing, replaced or behind its node state: "
                                "refusing to answer from a memory that may have been rolled back")

