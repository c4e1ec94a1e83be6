"""What experiment tracking adds to a round: the same seeded run without a tracker and with each one,
stepped in turns in one process (round r of every arm runs back to back, the order rotating each
round), each round timed from the call to the end of its callbacks (a tracker's periodic write to
its store falls in the round that makes it; TensorBoard's writer thread writes in the background). Prints
the JSON (also to ``--json``): per arm the median round time, the median of the per-round ratios to
the untracked arm (the goal: <= 1.02), the time spent in the trackers' own round hook as a share of
the untracked rounds (the same cost without the machine's noise), and the one-off seconds at the start (import, store) and at
the end (flush, artifacts). Rounds before ``--skip`` (warm-up) are left out of the ratios. Compare
ratios from one run only."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _config(tracking: str, out: Path, args: argparse.Namespace) -> Any:
    from fedprivacy.config import RunConfig

    keys: dict[str, Any] = {"privacy": "central", "noise-multiplier": 1.0, "sample-rate": 1.0,
                            "num-server-rounds": args.rounds, "local-epochs": 1, "seed": 0,
                            "target-delta": 1e-4, "output-dir": str(out), "run-name": tracking or "none",
                            "tracking": tracking, "publish-participation": True}
    return RunConfig.from_mapping(keys)


def _arm(tracking: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from fedprivacy.fl import FederatedRun, local_exchange

    cfg = _config(tracking, out, args)
    run = FederatedRun(cfg, population=args.clients, exchange=local_exchange(cfg, population=args.clients),
                       run_dir=out / cfg.run_name, log=lambda _line: None)
    arm: dict[str, Any] = {"name": tracking or "none", "run": run, "rounds": [], "in_tracker": []}
    for callback in run.callbacks[-len(cfg.tracking.split(",")):] if tracking else []:
        callback.on_round_end = _clocked(callback.on_round_end, arm["in_tracker"])
    return arm


def _clocked(hook: Any, seconds: list[float]) -> Any:
    """``hook``, adding the seconds each call takes to ``seconds`` (a tracker's own time in a round)."""
    def timed(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return hook(*args)
        finally:
            seconds.append(time.perf_counter() - t0)
    return timed


def _timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def bench(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Every arm started, stepped in turns to the last round, finished; the figures."""
    arms = [_arm(t, out, args) for t in ("", *args.trackers)]
    for arm in arms:
        _, arm["start_seconds"] = _timed(arm["run"].start)
    for r in range(args.rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            record, seconds = _timed(arm["run"].step)
            assert record is not None, "the benchmark's run stopped early"
            arm["rounds"].append(seconds)
    for arm in arms:
        _, arm["end_seconds"] = _timed(arm["run"].finish)
    base = arms[0]["rounds"][args.skip:]
    report: dict[str, Any] = {"clients": args.clients, "rounds": args.rounds, "skip": args.skip,
                              "goal_ratio": 1.02, "arms": {}}
    for arm in arms:
        rounds = arm["rounds"][args.skip:]
        ratios = [t / b for t, b in zip(rounds, base, strict=True)]
        report["arms"][arm["name"]] = {
            "median_round_seconds": round(statistics.median(rounds), 5),
            "median_paired_ratio": round(statistics.median(ratios), 4),
            "total_ratio": round(sum(rounds) / sum(base), 4),
            # the tracker's own hook time over the untracked round: the cost without the machine's noise
            "median_tracker_ms": round(statistics.median(arm["in_tracker"][args.skip:] or [0.0]) * 1e3, 4),
            "tracker_share": round(sum(arm["in_tracker"][args.skip:]) / sum(base), 5),
            "start_seconds": round(arm["start_seconds"], 3), "end_seconds": round(arm["end_seconds"], 3)}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--skip", type=int, default=2, help="warm-up rounds left out of the ratios")
    ap.add_argument("--trackers", default="tensorboard,mlflow",
                    help="comma list of tracking values, each an arm (e.g. 'tensorboard,mlflow')")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.trackers = [t.strip() for t in args.trackers.split(",") if t.strip()]
    if args.rounds <= args.skip:
        ap.error(f"--rounds must be > --skip = {args.skip}, got {args.rounds}")
    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        report = bench(args, Path(tmp))
    text = json.dumps(report, indent=2)
    print(text)
    for name, arm in report["arms"].items():
        print(f"{name}: median round {arm['median_round_seconds'] * 1e3:.1f} ms, paired ratio "
              f"{arm['median_paired_ratio']:.4f} (total {arm['total_ratio']:.4f}), in the tracker "
              f"{arm['tracker_share']:.2%} of a round, start "
              f"{arm['start_seconds']:.2f} s, end {arm['end_seconds']:.2f} s", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
