"""Membership inference against a *released* global model: the very model a federation published.

Setting: a federation trained one model on every training example (the benchmark's
``fedavgm-c300`` rows: 3000 clients x 20 Fashion-MNIST images = the 60k training set); the attacker holds
the final global model (black-box: its logits on a candidate) and candidates from the same distribution,
and must tell members (training examples; at user level, the clients) from non-members (the 10k test
images; at user level, *pseudo-clients* of ``per_client`` test images each, the same size as a real
client). Members and non-members are disjoint draws of one distribution (Fashion-MNIST's official train
and test splits), so an attack with no signal has AUC 1/2 and TPR = FPR.

Attacks (scores: higher = more likely a member):

- ``loss``: Yeom, Giacomelli, Fredrikson & Jha 2018 (CSF, Sec. 3.2): ``-loss``.
- ``calibrated-loss``: difficulty calibration (Watson, Guo, Cormode & Sablayrolles 2022, ICLR, Eq. 1):
  ``-(loss(target, x) - mean_r loss(ref_r, x))`` with reference models that did *not* train on x.
- ``calibrated-phi``: the same on LiRA's logit-scaled confidence ``phi = log p_y / (1 - p_y)``
  (Carlini et al. 2022, Sec. IV-B): ``phi(target, x) - mean_r phi(ref_r, x)``. It is **not LiRA**: its
  references are centrally trained models, not shadow federations trained like the target.
- ``reference-only``: ``-mean_r loss(ref_r, x)`` without the target: a difference of the member and
  non-member *populations*, not membership; the floor the loss attack must be read against.

Reference models (:func:`reference_statistics`): references trained centrally on one seeded half of
the training images score the other half, for which they are OUT, and likewise for the test images, so
every candidate, member or not, is calibrated by the same number of references that never saw it and
the FPR measured on the non-members is the attack's, whatever the references' recipe.

User level: a client's score is the mean of its examples' scores (all of a client's examples share its
membership; under user-level DP the client is the unit of privacy; McMahan et al. 2018).
Rationale: docs/ATTACKS.md, section "The accuracy-ε curve's own models (Fashion-MNIST)".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedprivacy.attacks.membership import example_loss, logit_confidence
from fedprivacy.attacks.metrics import roc_summary

__all__ = [
    "ATTACKS",
    "Candidates",
    "ReferenceStatistics",
    "attack_scores",
    "evaluate_released_model",
    "model_statistics",
    "pseudo_clients",
    "reference_halves",
    "reference_statistics",
    "user_scores",
]

ATTACKS = ("loss", "calibrated-loss", "calibrated-phi", "reference-only")


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidates:
    """The examples the attacker scores: members with their clients, non-members with pseudo-clients.

    Attributes:
        x_members, y_members: the federation's training examples (every one was in some client).
        member_clients: ``(len(y_members),)`` int client id of every member example.
        x_nonmembers, y_nonmembers: held-out examples of the same distribution.
        nonmember_clients: ``(len(y_nonmembers),)`` int pseudo-client id, or -1 (used at example level
            only), see :func:`pseudo_clients`.
        member_index, nonmember_index: where the members / non-members sit in the training split / in
            the split ``nonmembers_from`` names (to look up :class:`ReferenceStatistics`); None when no
            references are used.
        nonmembers_from: ``"test"`` (the held-out test set) or ``"train"`` (training images the
            federation left out: no split difference between members and non-members).
    """

    x_members: np.ndarray
    y_members: np.ndarray
    member_clients: np.ndarray
    x_nonmembers: np.ndarray
    y_nonmembers: np.ndarray
    nonmember_clients: np.ndarray
    member_index: np.ndarray | None = None
    nonmember_index: np.ndarray | None = None
    nonmembers_from: str = "test"

    def __post_init__(self) -> None:
        for name, x, y, g in (("members", self.x_members, self.y_members, self.member_clients),
                              ("nonmembers", self.x_nonmembers, self.y_nonmembers, self.nonmember_clients)):
            if len(y) == 0:
                raise ValueError(f"{name}: need at least one example")
            if len(x) != len(y) or np.shape(g) != (len(y),):
                raise ValueError(f"{name}: x, y and clients must have one entry per example, got "
                                 f"{len(x)}, {len(y)}, {np.shape(g)}")
        if self.nonmembers_from not in ("test", "train"):
            raise ValueError(f"nonmembers_from must be 'test' or 'train', got {self.nonmembers_from!r}")

    @classmethod
    def from_partition(cls, x_train: np.ndarray, y_train: np.ndarray, partitions: Sequence[np.ndarray],
                       x_test: np.ndarray, y_test: np.ndarray, *, per_client: int, seed: int,
                       member_clients: int | None = None, nonmembers: str = "test") -> Candidates:
        """Members = the examples of ``partitions`` (client k holds ``x_train[partitions[k]]``), or of
        ``member_clients`` of them drawn at random (seeded; whole clients); non-members
        (``nonmembers``) = the test set (``"test"``) or the training images in no partition
        (``"held-out"``: a federation that left clients out), in pseudo-clients of ``per_client``
        (:func:`pseudo_clients`)."""
        from fedprivacy.dp.rng import RandomSource

        flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in partitions])
        if np.unique(flat).size != flat.size:
            raise ValueError("partitions: every training example must belong to one client only")
        chosen = np.arange(len(partitions))
        if member_clients is not None:
            if not 1 <= member_clients <= len(partitions):
                raise ValueError(f"member_clients must be in [1, {len(partitions)}], got {member_clients}")
            chosen = np.sort(RandomSource.seeded(seed).child("member-clients")
                             .permutation(len(partitions))[:member_clients])
        index = np.concatenate([np.asarray(partitions[int(k)], dtype=np.int64) for k in chosen])
        clients = np.repeat(chosen, [len(partitions[int(k)]) for k in chosen])
        if nonmembers == "test":
            xn, yn, ni, source = np.asarray(x_test), np.asarray(y_test), np.arange(len(y_test)), "test"
        elif nonmembers == "held-out":
            ni = np.setdiff1d(np.arange(len(y_train)), flat)
            if ni.size == 0:
                raise ValueError("nonmembers='held-out': the partitions use every training example")
            xn, yn, source = np.asarray(x_train)[ni], np.asarray(y_train)[ni], "train"
        else:
            raise ValueError(f"nonmembers must be 'test' or 'held-out', got {nonmembers!r}")
        return cls(x_members=np.asarray(x_train)[index], y_members=np.asarray(y_train)[index],
                   member_clients=clients, x_nonmembers=xn, y_nonmembers=yn,
                   nonmember_clients=pseudo_clients(len(yn), per_client=per_client, seed=seed),
                   member_index=index, nonmember_index=ni, nonmembers_from=source)


def pseudo_clients(n: int, *, per_client: int, seed: int) -> np.ndarray:
    """Group ``n`` held-out examples into ``n // per_client`` random pseudo-clients of ``per_client``.

    Returns ``(n,)`` int ids; the ``n mod per_client`` examples left over get -1 (example level only).
    """
    from fedprivacy.dp.rng import RandomSource

    if per_client < 1 or per_client > n:
        raise ValueError(f"per_client must be in [1, {n}], got {per_client}")
    order = RandomSource.seeded(seed).child("pseudo-clients").permutation(n)
    ids = np.full(n, -1, dtype=np.int64)
    used = (n // per_client) * per_client
    ids[order[:used]] = np.arange(used) // per_client
    return ids


def model_statistics(model: Any, x: np.ndarray, y: np.ndarray, *, batch_size: int = 2000
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-example cross-entropy loss, logit-scaled confidence ``phi`` and correctness (argmax = label)
    of a torch model, evaluated in eval mode."""
    import torch

    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    was_training = model.training
    model.eval()
    chunks = []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            chunks.append(model(torch.tensor(np.asarray(x[i:i + batch_size], dtype=np.float32)))
                          .double().numpy())
    model.train(was_training)
    z = np.concatenate(chunks)
    labels = np.asarray(y, dtype=np.int64)
    loss = example_loss(z, labels)
    return loss, logit_confidence(z, labels), np.argmax(z, axis=1) == labels


# ------------------------------------------------------------------------------- reference models
def reference_halves(n_train: int, n_test: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded half (0 or 1) of every training and every test example (see :func:`reference_statistics`)."""
    from fedprivacy.dp.rng import RandomSource

    src = RandomSource.seeded(seed).child("reference-halves")
    halves = []
    for name, n in (("train", n_train), ("test", n_test)):
        h = np.zeros(n, dtype=np.int64)
        h[src.child(name).permutation(n)[: n // 2]] = 1
        halves.append(h)
    return halves[0], halves[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceStatistics:
    """Mean loss and phi of every training and test example under ``count`` reference models that did
    not train on it (all are OUT for it), and the references' accuracy on the test images they scored."""

    train_loss: np.ndarray
    train_phi: np.ndarray
    test_loss: np.ndarray
    test_phi: np.ndarray
    count: int
    test_accuracy: tuple[float, ...]
    recipe: dict[str, Any]


def reference_statistics(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    build: Callable[[int], Any],
    *,
    count: int,
    train_size: int,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
) -> ReferenceStatistics:
    """OUT reference models for the calibrated attacks, trained centrally (plain SGD,
    :func:`fedprivacy.ml.train.train_local`) on training images only.

    The training and the test examples are each split in two seeded halves (:func:`reference_halves`).
    For each half h, ``count`` references train on ``train_size`` random training images of half h and
    score every training and test example of half ``1 - h``. So every example, member or non-member, is
    calibrated by exactly ``count`` references, none of which saw it; members and non-members are treated
    alike and the FPR measured on the non-members is the attack's.

    Args:
        x_train, y_train, x_test, y_test: the data set (the federation's members are training images).
        build: ``build(seed)`` returns a fresh torch model (the target's architecture).
        count: references per half (>= 1).
        train_size: training images per reference, in [1, half the training set].
        epochs, learning_rate, batch_size: the references' SGD.
        seed: seeds the halves, the subsets and every reference's initialisation and shuffling.
    """
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.ml.data import Split
    from fedprivacy.ml.train import train_local

    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    th, sh = reference_halves(len(y_train), len(y_test), seed=seed)
    if not 1 <= train_size <= int(min(np.sum(th == 0), np.sum(th == 1))):
        raise ValueError(f"train_size must be in [1, {int(np.sum(th == 1))}] (half the training set), "
                         f"got {train_size}")
    sums = {k: np.zeros(n) for k, n in (("tl", len(y_train)), ("tp", len(y_train)), ("sl", len(y_test)),
                                        ("sp", len(y_test)))}
    accs: list[float] = []
    src = RandomSource.seeded(seed).child("reference-subsets")
    for h in (0, 1):
        pool = np.flatnonzero(th == h)
        for r in range(count):
            run_seed = seed * 1000 + 10 * h + r
            pick = pool[src.child(h, r).permutation(pool.size)[:train_size]]
            model = build(run_seed)
            train_local(model, Split(x=np.asarray(x_train[pick], dtype=np.float32),
                                     y=np.asarray(y_train[pick], dtype=np.int64)),
                        epochs=epochs, lr=learning_rate, batch_size=batch_size, seed=run_seed)
            out_train, out_test = th != h, sh != h
            tl, tp, _ = model_statistics(model, x_train[out_train], y_train[out_train])
            sl, sp, ok = model_statistics(model, x_test[out_test], y_test[out_test])
            sums["tl"][out_train] += tl / count
            sums["tp"][out_train] += tp / count
            sums["sl"][out_test] += sl / count
            sums["sp"][out_test] += sp / count
            accs.append(float(np.mean(ok)))
            if progress is not None:
                progress(f"reference {h * count + r + 1}/{2 * count} (half {h}): trained on {train_size} "
                         f"training images, accuracy on its {int(out_test.sum())} OUT test images {accs[-1]:.4f}")
    return ReferenceStatistics(
        train_loss=sums["tl"], train_phi=sums["tp"], test_loss=sums["sl"], test_phi=sums["sp"], count=count,
        test_accuracy=tuple(accs),
        recipe={"count_per_half": count, "train_size": train_size, "epochs": epochs,
                "learning_rate": learning_rate, "batch_size": batch_size, "seed": seed,
                "training": "central plain SGD on training images of one half; scores the other half"})


# ------------------------------------------------------------------------------------------ scores
def attack_scores(attack: str, loss: np.ndarray, phi: np.ndarray, *, ref_loss: np.ndarray | None = None,
                  ref_phi: np.ndarray | None = None) -> np.ndarray:
    """Scores of one attack (module docstring) from the target's per-example loss / phi and the
    references' means (needed by the calibrated attacks)."""
    if attack == "loss":
        return -np.asarray(loss, dtype=np.float64)
    if attack not in ATTACKS:
        raise ValueError(f"attack must be one of {ATTACKS}, got {attack!r}")
    if ref_loss is None or ref_phi is None:
        raise ValueError(f"attack {attack!r} needs the reference statistics (ref_loss, ref_phi)")
    if attack == "calibrated-loss":
        return -(np.asarray(loss, dtype=np.float64) - ref_loss)
    if attack == "reference-only":
        return -np.asarray(ref_loss, dtype=np.float64)
    return np.asarray(phi, dtype=np.float64) - ref_phi


def user_scores(scores: np.ndarray, clients: np.ndarray) -> np.ndarray:
    """The mean score of every client's examples (clients with id < 0 are left out), in id order."""
    s = np.asarray(scores, dtype=np.float64)
    g = np.asarray(clients, dtype=np.int64)
    keep = g >= 0
    ids, inverse = np.unique(g[keep], return_inverse=True)
    return np.bincount(inverse, weights=s[keep], minlength=ids.size) / np.bincount(inverse, minlength=ids.size)


def evaluate_released_model(
    model: Any,
    candidates: Candidates,
    *,
    references: ReferenceStatistics | None = None,
    fprs: Sequence[float] = (0.01, 0.001),
    bootstrap: int = 200,
    permutations: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Attack ``model`` at example and user level; AUC and TPR at each FPR with intervals and p-values.

    Returns ``{"rows": [...], "test_accuracy": ..., "train_accuracy": ...}``: one row per (attack,
    level) with :meth:`fedprivacy.attacks.metrics.RocSummary.to_row`'s figures; the calibrated attacks
    only when ``references`` is given.
    """
    from fedprivacy.dp.rng import RandomSource

    if references is not None and (candidates.member_index is None or candidates.nonmember_index is None):
        raise ValueError("references need the candidates' member_index and nonmember_index")
    ml, mp, m_ok = model_statistics(model, candidates.x_members, candidates.y_members)
    nl, npp, n_ok = model_statistics(model, candidates.x_nonmembers, candidates.y_nonmembers)
    attacks = ATTACKS if references is not None else ("loss",)
    src = RandomSource.seeded(seed).child("released-model-statistics")
    rows: list[dict[str, Any]] = []
    for attack in attacks:
        ref: dict[str, Any] = {"m": {}, "n": {}}
        if references is not None:
            mi, ni = candidates.member_index, candidates.nonmember_index
            held_out = candidates.nonmembers_from == "train"
            n_loss = references.train_loss if held_out else references.test_loss
            n_phi = references.train_phi if held_out else references.test_phi
            ref = {"m": {"ref_loss": references.train_loss[mi], "ref_phi": references.train_phi[mi]},
                   "n": {"ref_loss": n_loss[ni], "ref_phi": n_phi[ni]}}
        ms = attack_scores(attack, ml, mp, **ref["m"])
        ns = attack_scores(attack, nl, npp, **ref["n"])
        levels = (("example", ms, ns),
                  ("user", user_scores(ms, candidates.member_clients),
                   user_scores(ns, candidates.nonmember_clients)))
        for level, pos, neg in levels:
            summary = roc_summary(pos, neg, fprs=fprs, bootstrap=bootstrap, permutations=permutations,
                                  rng=src.child(attack, level))
            rows.append({"attack": attack, "level": level, **summary.to_row()})
    return {"rows": rows, "nonmembers_from": candidates.nonmembers_from, "train_accuracy": float(np.mean(m_ok)),
            "nonmember_accuracy": float(np.mean(n_ok)),
            "test_accuracy": float(np.mean(n_ok)) if candidates.nonmembers_from == "test" else None,
            "member_loss_mean": float(np.mean(ml)), "nonmember_loss_mean": float(np.mean(nl)),
            "members": int(len(ml)), "nonmembers": int(len(nl)),
            "member_clients": int(np.unique(candidates.member_clients).size),
            "nonmember_clients": int(np.unique(candidates.nonmember_clients[candidates.nonmember_clients >= 0]).size)}
