"""User-level membership inference against federated Fashion-MNIST models, without DP and at several ε.

Usage: python scripts/user_membership.py [--json PATH] [--png PATH] [--epsilons none,64,16,8]
                                         [--models K] [--rounds T] [--clients U] [--per-client n]
                                         [--server-optimizer fedavgm] [--statistics]
                                         [--per-example-variance]

Each setting trains K federated models (fedprivacy's run loop and client pipeline), each on a random
half of U candidate clients of n Fashion-MNIST training images, and attacks every model with the others
as shadows (loss threshold, LiRA online/offline; fedprivacy.attacks.user_membership). Prints AUC and TPR
at 1% / 0.1% FPR at user and example level with each setting's test accuracy (official 10k test set);
``--json`` is rewritten after every setting (a stopped run keeps what finished); ``--png`` draws attack
AUC / TPR and test accuracy against ε (fedprivacy_bench.curves.plot_membership). ``--statistics`` adds
to every row 95% intervals (a bootstrap of whole candidate clients) and permutation p-values that
relabel within each model (the experiment's own randomization: each model's members are a random half),
so "at chance" is a test (``at_chance_5pct``), not a reading. ``--server-optimizer fedavgm`` applies
server momentum to the released mean update (post-processing: σ and ε are unchanged).
``--per-example-variance`` adds LiRA online/offline with each candidate's own IN/OUT variance
(``lira-online-exvar`` / ``lira-offline-exvar``; Carlini et al. 2022 Sec. IV); it needs 25+ models (24 shadows).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def _settings(text: str) -> list[float | None]:
    out: list[float | None] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item.lower() == "none":
            out.append(None)
            continue
        value = float(item)
        if not value > 0:
            raise ValueError(f"--epsilons: every ε must be > 0 or 'none', got {item!r}")
        out.append(value)
    if not out:
        raise ValueError("--epsilons: give at least one setting")
    return out


def _tested(row: dict[str, Any]) -> str:
    """The row's intervals and p-values (``--statistics``), or nothing."""
    if "auc_p_value" not in row:
        return ""
    lo, hi = row["auc_ci95"]
    tlo, thi = row["tpr_at_fpr_0.01_ci95"]
    return (f"\n          AUC 95% [{lo:.3f}, {hi:.3f}] p {row['auc_p_value']:.3f}; TPR@1% 95% [{tlo:.3f}, "
            f"{thi:.3f}] p {row['tpr_at_fpr_0.01_p_value']:.3f} ({row['tpr_at_fpr_0.01_false_positives_allowed']}"
            f" FPs allowed); at chance (5%): {row['at_chance_5pct']}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--epsilons", default="none,64,16,8", help="comma-separated; 'none' = no DP")
    parser.add_argument("--models", type=int, default=4, help="models per setting (K >= 3)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--clients", type=int, default=100, help="candidate clients (half per model)")
    parser.add_argument("--per-client", type=int, default=100)
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--sample-rate", type=float, default=0.4)
    parser.add_argument("--clip-norm", type=float, default=1.0)
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--server-optimizer", choices=("fedavg", "fedavgm"), default="fedavg")
    parser.add_argument("--server-learning-rate", type=float, default=1.0)
    parser.add_argument("--server-momentum", type=float, default=0.9)
    parser.add_argument("--statistics", action="store_true",
                        help="95%% cluster-bootstrap intervals and within-model permutation p-values per row")
    parser.add_argument("--per-example-variance", action="store_true",
                        help="also LiRA with a per-example variance (needs many shadows: --models 25+)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _print_setting(res: dict[str, Any]) -> None:
    s = res["summary"]
    print(f"{s['label']}: σ {s['noise_multiplier']:.3f}  test acc {s['test_accuracy']:.3f}  "
          f"train acc {s['train_accuracy']:.3f}  ({s['seconds']:.0f} s)")
    if s.get("dp_ceiling"):
        c = s["dp_ceiling"]
        print(f"  DP ceiling (any test, this σ, q, T): TPR@1% <= {c['tpr_at_fpr'][0.01]:.4f}, "
              f"TPR@0.1% <= {c['tpr_at_fpr'][0.001]:.4f}, AUC <= {c['auc']:.3f}")
    for row in res["rows"]:
        print(f"  {row['level']:<7} {row['attack']:<18} AUC {row['auc']:.3f}  TPR@1% "
              f"{row['tpr_at_fpr_1pct']:.3f}  TPR@0.1% {row['tpr_at_fpr_01pct']:.3f}  "
              f"(FPR resolution {row['fpr_resolution']:.2g})" + _tested(row))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from fedprivacy.attacks.lira_eval import EXVAR_MIN_MODELS

    try:
        settings = _settings(args.epsilons)
        if args.per_example_variance and args.models < EXVAR_MIN_MODELS:
            raise ValueError(f"--models must be >= {EXVAR_MIN_MODELS} with --per-example-variance "
                             f"({EXVAR_MIN_MODELS - 1} shadows), got {args.models}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    import torch

    from fedprivacy.attacks.lira_eval import ATTACKS, EXVAR_ATTACKS
    from fedprivacy.attacks.membership import FederatedTargetConfig
    from fedprivacy.attacks.user_membership import user_membership_experiment
    from fedprivacy.ml.data import load_dataset

    torch.set_num_threads(1)
    train, test = load_dataset("fashion-mnist", seed=args.seed, test_fraction=0.2)
    out: dict[str, Any] = {"script": "scripts/user_membership.py", "argv": sys.argv[1:] if argv is None
                           else list(argv), "dataset": "fashion-mnist", "settings": []}
    t_all = time.perf_counter()
    for eps in settings:
        try:
            config = FederatedTargetConfig(
                clients=args.clients // 2, rounds=args.rounds, local_epochs=args.local_epochs,
                learning_rate=0.1, batch_size=10, model=args.model, hidden_units=args.hidden,
                clip_norm=args.clip_norm, target_epsilon=eps, sample_rate=args.sample_rate,
                server_optimizer=args.server_optimizer, server_learning_rate=args.server_learning_rate,
                server_momentum=args.server_momentum)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        res = user_membership_experiment(train.x, train.y, test.x, test.y, config=config,
                                         clients=args.clients, per_client=args.per_client,
                                         models=args.models, seed=args.seed, progress=print,
                                         statistics=args.statistics,
                                         attacks=ATTACKS + (EXVAR_ATTACKS if args.per_example_variance else ()))
        res["summary"]["seconds"] = time.perf_counter() - t0
        out["settings"].append(res)
        _print_setting(res)
        out["seconds"] = time.perf_counter() - t_all
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1, default=float))
    if args.png is not None:
        from fedprivacy_bench.curves import plot_membership

        plot_membership(out["settings"], args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
