"""Benchmark the in-process engine against a single-process torch loop and Flower's Ray engine.

Every measurement runs in its own child process (this script re-invoked with ``--child``), so
start-up time and peak memory are those of a fresh command. Peak memory is the peak of the summed
PSS (proportional set size, psutil) over the child's whole process tree,
sampled every 0.2 s, so forked workers and Ray's processes are counted once for shared pages.

Workload: plain FedAvg (privacy ``none``), digits, 1000 clients, a fixed cohort of 100 per
round, 1 local epoch; a ~10k-parameter MLP (hidden 128) and a ~100k one (``mlp-large``, hidden 288).

- ``loop``: the same per-client work in a plain Python loop, no Flower: for each sampled client
  :func:`fedprivacy.fl.client.train_client` (local training, Δ, clipping), then the mean of the
  updates and the test-set evaluation, exactly what one round of the apps computes.
- ``engine``: ``server.engine.run_inprocess`` with the real apps, ``workers`` 1 and 2.
- ``flower``: the same apps on Flower's Ray engine via ``server.engine.run_flower_simulation``.

Reported per row: median steady-state seconds per round (rounds 2..R; for the engine and Flower
from ``results.json``, which includes evaluation and checkpointing, and, for the engine, the time of
the ``train`` exchange alone), seconds from command to the end of round 1, peak memory, and the
ratio to the loop measured in this same run.

``--batched`` runs only the batched-trainer rows, per model (``10k`` on the workload above; ``convnet``
on 3000 Fashion-MNIST clients of 20 examples, 300 a round, 2 epochs of batch 10): ``trainers``, the
per-client loop and the batched trainer (:mod:`fedprivacy.ml.batched`) on the same cohorts interleaved
in one process, with their ratio and the largest difference of the updates; then the engine with
``batched-training`` off and on, each beside its paired torch loop.

Usage: ``python scripts/bench_engine.py --json PATH [--rounds R] [--quick] [--skip-flower] [--batched]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

MODELS = {"10k": ("mlp", 128), "100k": ("mlp-large", 288), "convnet": ("convnet", 32)}
# --batched: the 10k MLP on the engine's workload; the convnet on the Fashion-MNIST recipe (3000 clients x
# 20 examples, 300 a round, 2 local epochs of batch 10, lr 0.1)
BATCHED_SETUPS: dict[str, dict[str, Any]] = {
    "10k": {"population": 1000, "cohort": 100, "extra": {}},
    "convnet": {"population": 3000, "cohort": 300, "dataset": "fashion-mnist",
                "extra": {"local-epochs": 2, "batch-size": 10, "learning-rate": 0.1}},
}


# --------------------------------------------------------------------------- memory


class PeakMemory:
    """The summed PSS of this process tree, sampled every 0.2 s (:mod:`fedprivacy_bench.memory`)."""

    def __init__(self, interval: float = 0.2) -> None:
        from fedprivacy_bench.memory import PeakMemorySampler

        self._sampler = PeakMemorySampler(os.getpid(), interval=interval).__enter__()

    def stop(self) -> float:
        self._sampler.__exit__(None, None, None)
        return self._sampler.peak_mb


# --------------------------------------------------------------------------- children


def _run_config(spec: dict[str, Any], out_dir: str) -> dict[str, Any]:
    model, hidden = MODELS[spec["model"]]
    cfg = {
        "num-server-rounds": spec["rounds"],
        "dataset": spec.get("dataset", "digits"),
        "model": model,
        "hidden-units": hidden,
        "local-epochs": 1,
        "privacy": spec.get("privacy", "none"),
        "secagg": False,
        "accountant": "pld",
        "sampling": "fixed",
        "cohort-size": spec["cohort"],
        "neighbouring": "replace-one",
        "seed": 1,
        "output-dir": out_dir,
    }
    cfg.update(spec.get("extra", {}))
    return cfg


_ROUND_LINE = re.compile(r"\s*round\s+\d+/\d+")  # a round's log line ("round   1/5  accuracy ...")


class _Round1Timer(logging.Handler):
    """When round 1 ended (wall clock), and the main thread's CPU seconds at every round's log line
    (the thread that runs the server and, with one worker, every client; not the memory sampler's
    thread, which costs ~4% of a core per wall second and would tax the slower row more)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: float | None = None
        self.cpu_marks: list[float] = [time.thread_time()]
        self.tree_marks: list[float] = [_tree_cpu()]

    def emit(self, record: logging.LogRecord) -> None:
        if not _ROUND_LINE.match(record.getMessage()):
            return
        # every thread (Ray's ServerApp runs in one of its own): the whole process tree's CPU
        self.tree_marks.append(_tree_cpu())
        if threading.current_thread() is threading.main_thread():
            self.cpu_marks.append(time.thread_time())
            if self.at is None:
                self.at = time.time()


def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process and every live descendant: Ray's raylet, GCS and
    actor processes live for the whole run, so differences between round lines are the rounds' CPU
    on every core, the load-robust figure for an engine that runs in several processes."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system
    return total


def _app_dir(spec: dict[str, Any]) -> Path:
    return Path(spec.get("app_dir") or REPO)


def _engine_api() -> tuple[Any, Any]:
    """(run_inprocess, resolve_run_config) of the tree this child runs."""
    try:
        from server.engine import resolve_run_config, run_inprocess
    except ImportError:  # a baseline tree with the older layout
        from server.inprocess import resolve_run_config, run_inprocess  # type: ignore[no-redef]
    return run_inprocess, resolve_run_config


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    mem = PeakMemory()
    import torch

    torch.set_num_threads(1)
    out_dir = tempfile.mkdtemp(prefix="bench_engine_")
    kind = spec["kind"]
    cfg = _run_config(spec, out_dir) if kind != "default" else {}
    keys = ("model", "cohort", "population", "workers", "privacy", "dataset", "tree", "batched")
    result: dict[str, Any] = {"kind": kind, "privacy": "none", **{k: spec[k] for k in keys if k in spec}}
    if kind in ("loop", "trainers"):
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):  # the same native-thread setting as the engine
            result.update(_loop(spec, cfg) if kind == "loop" else _trainers(spec, cfg))
    else:
        timer = _Round1Timer()
        logging.getLogger("flwr").addHandler(timer)
        if kind in ("engine", "default"):
            path = _engine_run(spec, cfg, out_dir, result)
        else:
            from server.engine import run_flower_simulation

            run_flower_simulation(run_config=cfg, num_supernodes=spec["population"],
                                  app_dir=_app_dir(spec))
            found = sorted(Path(out_dir).rglob("results.json"))
            path = found[-1] if found else None
        if path is None:
            raise RuntimeError("the run wrote no results.json")
        result.update(_run_rows(Path(path), timer, spec))
    result["peak_memory_mb"] = mem.stop()
    return result


def _engine_run(spec: dict[str, Any], cfg: dict[str, Any], out_dir: str, result: dict[str, Any]) -> Any:
    """One in-process run (engine or the app's defaults); its counters go into ``result``; returns the
    results path."""
    run_inprocess = _engine_api()[0]
    kind = spec["kind"]
    res = run_inprocess(
        run_config=cfg if kind == "engine" else {"output-dir": out_dir},
        num_supernodes=spec["population"],
        workers=spec.get("workers", 1),
        app_dir=_app_dir(spec),
    )
    result["train_exchange_seconds"] = [s for (t, _n, s) in res.stats.exchanges if t == "train"]
    result["startup_seconds"] = res.startup_seconds
    # CPU time of all ClientApp calls (summed over workers): on a shared machine this
    # shows whether a slower wall time is more work or just waiting for a core.
    result["client_cpu_seconds"] = res.stats.client_cpu_seconds
    result["client_wall_seconds"] = res.stats.client_seconds
    if spec.get("paired_loop"):
        # The loop again, in this process right after the engine run (warm caches, the
        # same machine load): the fairest ratio on a shared machine.
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):
            paired = _loop(spec, _run_config(spec, tempfile.mkdtemp()))
        result["paired_loop_round_seconds"] = paired["round_seconds"]
        result["paired_loop_train_seconds"] = paired["train_seconds"]
        result["paired_loop_round_cpu_seconds"] = paired["round_cpu_seconds"]
    return res.results_path


def _run_rows(path: Path, timer: _Round1Timer, spec: dict[str, Any]) -> dict[str, Any]:
    """Per-round wall and CPU seconds and accuracy of a finished run."""
    rows = json.loads(path.read_text())["rounds"]
    # with private counts the rounds' wall times are in the private log
    from fedprivacy.fl.run import round_seconds

    out: dict[str, Any] = {"round_seconds": round_seconds(path.parent),
                           "test_accuracy": [float(r["test_accuracy"]) for r in rows]}
    if timer.at is not None:
        out["command_to_round1_seconds"] = timer.at - float(spec["t0"])
    # CPU seconds of the main thread per round (w=1: server and clients; load-robust, unlike wall)
    marks, tree = timer.cpu_marks, timer.tree_marks
    out["round_cpu_seconds"] = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    out["round_tree_cpu_seconds"] = [b - a for a, b in zip(tree, tree[1:], strict=False)]
    return out


def _loop(spec: dict[str, Any], cfg_map: dict[str, Any]) -> dict[str, Any]:
    """The same local training as the apps, in a plain loop (no Flower, no messages)."""
    import numpy as np

    from fedprivacy.config import RunConfig
    from fedprivacy.fl import task
    from fedprivacy.fl.client import train_client

    try:
        from fedprivacy.fl.types import RoundInstructions
    except ImportError:  # a baseline tree with the older layout
        from fedprivacy.fl.client import RoundInstructions  # type: ignore[attr-defined,no-redef]
    resolve_run_config = _engine_api()[1]
    cfg = RunConfig.from_mapping(resolve_run_config(cfg_map, app_dir=_app_dir(spec)))
    n = spec["population"]
    test = task.test_set(cfg, num_partitions=n)
    num_classes = task.num_classes_for(cfg, num_partitions=n)
    weights = task.initial_weights(
        cfg, input_shape=test.feature_shape, num_classes=num_classes, seed=1
    )
    rng = np.random.default_rng(1)  # cohort choice only (benchmark, not privacy noise)
    round_s, train_s, acc = [], [], []
    t_round1 = None
    round_cpu: list[float] = []
    for rnd in range(1, spec["rounds"] + 1):
        t0 = time.perf_counter()
        c0 = time.thread_time()  # this (main) thread: as the engine rows, without the memory sampler
        cohort = sorted(rng.choice(n, size=spec["cohort"], replace=False).tolist())
        instr = _plain_instructions(RoundInstructions, cfg, rnd, num_classes)
        updates = [
            train_client(cfg, partition_id=p, num_partitions=n, weights=weights, instructions=instr)
            for p in cohort
        ]
        t1 = time.perf_counter()
        mean = [np.mean([u.delta[i] for u in updates], axis=0) for i in range(len(weights))]
        weights = [w + m.astype(w.dtype) for w, m in zip(weights, mean, strict=True)]
        _, a = task.evaluate_weights(cfg, weights, test, num_classes=num_classes)
        round_s.append(time.perf_counter() - t0)
        round_cpu.append(time.thread_time() - c0)
        train_s.append(t1 - t0)
        acc.append(a)
        if t_round1 is None:
            t_round1 = time.time()
    return {
        "round_seconds": round_s,
        "round_cpu_seconds": round_cpu,
        "train_seconds": train_s,
        "test_accuracy": acc,
        "command_to_round1_seconds": (t_round1 or 0.0) - float(spec["t0"]),
    }


def _plain_instructions(cls: Any, cfg: Any, rnd: int, num_classes: int) -> Any:
    """A plain (no DP) round's instructions, as the server sends them."""
    return cls(round=rnd, privacy="none", clip_norm=cfg.clip_norm, client_mechanism="",
               noise_multiplier=0.0, private=False, learning_rate=cfg.learning_rate,
               local_epochs=cfg.local_epochs, batch_size=cfg.batch_size, num_classes=num_classes, seed=1)


def _trainers(spec: dict[str, Any], cfg_map: dict[str, Any]) -> dict[str, Any]:
    """Per-client loop (:func:`train_client` one after another) against the batched trainer
    (:func:`fedprivacy.fl.client_batch.train_clients`) on the same cohorts, interleaved round by round
    in this process: the ratio of the two at the same load. Round 1 of each warms caches and is dropped."""
    import numpy as np

    from fedprivacy.config import RunConfig
    from fedprivacy.fl import task
    from fedprivacy.fl.client import train_client
    from fedprivacy.fl.client_batch import train_clients
    from fedprivacy.fl.types import RoundInstructions

    cfg = RunConfig.from_mapping(_engine_api()[1](cfg_map, app_dir=_app_dir(spec)))
    n = spec["population"]
    test = task.test_set(cfg, num_partitions=n)
    k = task.num_classes_for(cfg, num_partitions=n)
    weights = task.initial_weights(cfg, input_shape=test.feature_shape, num_classes=k, seed=1)
    rng = np.random.default_rng(1)
    loop_s, batched_s, max_diff = [], [], 0.0
    for rnd in range(1, spec["rounds"] + 1):
        cohort = sorted(rng.choice(n, size=spec["cohort"], replace=False).tolist())
        instr = _plain_instructions(RoundInstructions, cfg, rnd, k)
        t0 = time.perf_counter()
        one = [train_client(cfg, partition_id=p, num_partitions=n, weights=weights, instructions=instr)
               for p in cohort]
        t1 = time.perf_counter()
        many = train_clients(cfg, partition_ids=cohort, num_partitions=n, weights=weights,
                             instructions=[instr] * len(cohort))
        t2 = time.perf_counter()
        loop_s.append(t1 - t0)
        batched_s.append(t2 - t1)
        max_diff = max(max_diff, *(float(np.max(np.abs(a - b))) for u, v in zip(one, many, strict=True)
                                   for a, b in zip(u.delta, v.delta, strict=True)))
    loop_med, batched_med = _median(loop_s[1:] or loop_s), _median(batched_s[1:] or batched_s)
    return {"loop_train_seconds": loop_s, "batched_train_seconds": batched_s,
            "steady_loop_train_seconds": loop_med, "steady_batched_train_seconds": batched_med,
            "batched_vs_loop": batched_med / loop_med, "max_abs_delta_difference": max_diff,
            "batching_pays": task.batching_chosen(cfg.replace(batched_training="auto"))}


def _median(xs: list[float]) -> float:
    import statistics

    return float(statistics.median(xs))


def _batched_section(args: argparse.Namespace, run: Any) -> None:
    """Rows of the batched trainer: per model, the trainers side by side, then the engine with
    ``batched-training`` off and on (both with the paired per-client torch loop)."""
    for model in args.models.split(","):
        setup = BATCHED_SETUPS.get(model, BATCHED_SETUPS["10k"])
        base = {"rounds": args.rounds, "model": model, "population": setup["population"],
                "cohort": setup["cohort"], **({"dataset": setup["dataset"]} if "dataset" in setup else {})}
        run({**base, "kind": "trainers", "extra": setup["extra"]}, both=False)
        for mode in ("off", "on"):
            run({**base, "kind": "engine", "workers": 1, "paired_loop": True, "batched": mode,
                 "extra": {**setup["extra"], "batched-training": mode}}, both=False)


def _default_run(spec: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """The README's default in-process run as a user starts it (``fedprivacy simulate``, 10 clients,
    the app's defaults, 2 rounds): wall and CPU seconds (the command's process tree, psutil) from
    the command to the end of round 1, read off its log line."""
    import psutil

    app = _app_dir(spec)
    entry = "server.engine.cli" if (app / "server" / "engine" / "cli.py").exists() else "fedprivacy.cli"
    out = tempfile.mkdtemp(prefix="bench_default_")
    cmd = [sys.executable, "-c", f"import sys; from {entry} import main; sys.exit(main())", "simulate",
           "--num-supernodes", "10", "-c", f'num-server-rounds=2 output-dir="{out}"']
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(app)}
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    ps = psutil.Process(proc.pid)
    result: dict[str, Any] = {"kind": "default", "model": "default", "privacy": "default",
                              "population": 10, "cohort": 10, "tree": spec.get("tree")}
    assert proc.stdout is not None
    for line in proc.stdout:
        if "round   1/" in line and "command_to_round1_seconds" not in result:
            result["command_to_round1_seconds"] = time.time() - t0
            cpu = ps.cpu_times()
            result["command_to_round1_cpu_seconds"] = cpu.user + cpu.system
        if time.time() - t0 > timeout:
            proc.kill()
            result["error"] = f"timed out after {timeout:.0f} s"
            break
    proc.wait()
    result["command_seconds"] = time.time() - t0
    if proc.returncode and "error" not in result:
        result["error"] = f"exit {proc.returncode}"
    return result


def _spawn(spec: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    if spec["kind"] == "default":
        return _default_run(spec, timeout=timeout)
    spec = {**spec, "t0": time.time()}
    app = _app_dir(spec)
    # the tree's own packages first; this checkout's fedprivacy_bench (memory sampler) behind them
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": f"{app}{os.pathsep}{REPO}"}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=app,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout:.0f} s"}
    wall = time.time() - spec["t0"]
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("BENCH-RESULT "):
            out = json.loads(line[len("BENCH-RESULT ") :])
            out["command_seconds"] = wall
            return out
    return {**spec, "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}


# --------------------------------------------------------------------------- report


def _steady(xs: list[float] | None) -> float | None:
    from fedprivacy_bench.spec import steady_state_seconds

    return steady_state_seconds(xs or [])


def _summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    loops = {(r.get("tree"), r["model"], r["population"]): r for r in rows if r.get("kind") == "loop"}
    for r in rows:
        r["steady_round_seconds"] = _steady(r.get("round_seconds"))
        if r.get("kind") == "engine":
            r["steady_train_exchange_seconds"] = _steady(r.get("train_exchange_seconds"))
        if r.get("kind") == "loop":
            r["steady_train_seconds"] = _steady(r.get("train_seconds"))
        pl_round = _steady(r.get("paired_loop_round_seconds"))
        pl_train = _steady(r.get("paired_loop_train_seconds"))
        eng_train = _steady(r.get("train_exchange_seconds"))
        if pl_round and pl_train and eng_train and r["steady_round_seconds"]:
            r["ratio_vs_paired_loop"] = r["steady_round_seconds"] / pl_round
            r["train_ratio_vs_paired_loop"] = eng_train / pl_train
        r["steady_round_cpu_seconds"] = _steady(r.get("round_cpu_seconds"))
        r["steady_round_tree_cpu_seconds"] = _steady(r.get("round_tree_cpu_seconds"))
        pl_cpu = _steady(r.get("paired_loop_round_cpu_seconds"))
        if pl_cpu and r["steady_round_cpu_seconds"] and r.get("workers", 1) == 1:
            r["cpu_ratio_vs_paired_loop"] = r["steady_round_cpu_seconds"] / pl_cpu
        base = loops.get((r.get("tree"), r.get("model"), r.get("population")))
        if base and r.get("steady_round_seconds") and base.get("steady_round_seconds"):
            r["ratio_vs_loop"] = r["steady_round_seconds"] / base["steady_round_seconds"]
            if r.get("steady_train_exchange_seconds") and base.get("steady_train_seconds"):
                r["train_ratio_vs_loop"] = (
                    r["steady_train_exchange_seconds"] / base["steady_train_seconds"]
                )
    return rows


def _loop_seconds(w1: dict[str, Any] | None, loops: list[dict[str, Any]]) -> float | None:
    """The torch loop's steady round for ``w1``'s model: its paired run, else the separate loop row."""
    if not w1:
        return None
    paired = _steady(w1.get("paired_loop_round_seconds"))
    if paired:
        return paired
    same = [r for r in loops if r.get("model") == w1.get("model") and r.get("population") == w1.get("population")]
    return same[0].get("steady_round_seconds") if same else None


def _goals(rows: list[dict[str, Any]], *, population: int) -> dict[str, Any]:
    """The ratios, per tree, from the rows of this run (None where a row is missing)."""
    out: dict[str, Any] = {}
    for tree in sorted({r.get("tree", "current") for r in rows}):
        mine = [r for r in rows if r.get("tree", "current") == tree and "error" not in r]

        def one(mine: list[dict[str, Any]] = mine, **want: Any) -> dict[str, Any] | None:
            hit = [r for r in mine if all(r.get(k) == v for k, v in want.items())]
            return hit[0] if hit else None

        g: dict[str, Any] = {}
        loops = [r for r in mine if r.get("kind") == "loop"]
        for model in sorted({r["model"] for r in mine if r.get("kind") == "engine"}):
            w1 = one(kind="engine", model=model, workers=1, population=population, privacy="none")
            w2 = one(kind="engine", model=model, workers=2, population=population)
            fl = one(kind="flower", model=model)
            g[model] = {
                "engine_over_loop_paired (goal <= 1.3)": w1 and w1.get("ratio_vs_paired_loop"),
                "engine_over_loop_separate": w1 and w1.get("ratio_vs_loop"),
                "engine_over_loop_paired_cpu (load-robust)": w1 and w1.get("cpu_ratio_vs_paired_loop"),
                "flower_over_engine (goal >= 8)": (fl and w1 and fl.get("steady_round_seconds")
                                                   and w1.get("steady_round_seconds")
                                                   and fl["steady_round_seconds"] / w1["steady_round_seconds"]),
                # The ceiling of the ratio above: an engine with zero overhead runs at the loop's pace.
                # The ">= 8x" came from its own figures (Ray 2.631 s vs loop 0.257 s = 10.2x,
                # so 1.3x the loop is ~8x Ray); Ray runs these same, since sped-up, ClientApps, so
                # when this is below 8 * 1.3 = 10.4 the two goals cannot both hold.
                # CPU of every process of each engine per round (Ray: raylet, GCS, actors), load-robust
                "flower_over_engine_tree_cpu (load-robust)": (
                    fl and w1 and fl.get("steady_round_tree_cpu_seconds")
                    and w1.get("steady_round_tree_cpu_seconds")
                    and fl["steady_round_tree_cpu_seconds"] / w1["steady_round_tree_cpu_seconds"]),
                "flower_over_loop (ceiling of flower_over_engine)": (
                    fl and fl.get("steady_round_seconds") and _loop_seconds(w1, loops)
                    and fl["steady_round_seconds"] / _loop_seconds(w1, loops)),
                "workers2_speedup_wall": (w1 and w2 and w2.get("steady_round_seconds")
                                          and w1["steady_round_seconds"] / w2["steady_round_seconds"]),
                "workers_client_cpu_seconds (w1, w2)": (w1 and w1.get("client_cpu_seconds"),
                                                        w2 and w2.get("client_cpu_seconds")),
                "peak_memory_mb (goal <= 600 at 100k)": w1 and w1.get("peak_memory_mb"),
            }
        d = one(kind="default")
        g["default_run_command_to_round1_seconds (goal <= 5)"] = d and d.get("command_to_round1_seconds")
        g["default_run_command_to_round1_cpu_seconds"] = d and d.get("command_to_round1_cpu_seconds")
        out[tree] = g
    return out


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    parser.add_argument("--figure", type=Path, default=None,
                        help="also draw the rows' steady round seconds here (matplotlib, .png/.svg)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--population", type=int, default=1000)
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--models", default="10k,100k")
    parser.add_argument("--skip-flower", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--skip-privacy", action="store_true")
    parser.add_argument("--flower-timeout", type=float, default=900.0)
    parser.add_argument("--quick", action="store_true", help="10k model, 3 rounds, no Flower/scale")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="also run every loop/engine/default row with this checkout's library "
                             "(e.g. an older main), interleaved, in the same run")
    parser.add_argument("--batched", action="store_true",
                        help="only the batched-trainer rows (--models 10k,convnet by default)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.child is not None:
        out = _child(json.loads(args.child))
        print("BENCH-RESULT " + json.dumps(out), flush=True)
        return 0

    if args.quick:
        args.models, args.rounds = "10k", 3
        args.skip_flower = args.skip_scale = args.skip_privacy = True
    base = {"rounds": args.rounds, "population": args.population, "cohort": args.cohort}
    rows: list[dict[str, Any]] = []
    load_start = os.getloadavg()

    trees: list[tuple[str, str | None]] = [("current", None)]
    if args.baseline_tree is not None:
        trees.append(("baseline", str(args.baseline_tree.resolve())))

    def run(spec: dict[str, Any], timeout: float = 900.0, *, both: bool = True) -> None:
        for tree, app in trees if both else trees[:1]:
            one = {**spec, "tree": tree, **({"app_dir": app} if app else {})}
            label = " ".join(f"{k}={v}" for k, v in one.items() if k not in ("rounds", "app_dir"))
            print(f"... {label}", flush=True)
            rows.append(_spawn(one, timeout=timeout))
            if "error" in rows[-1]:
                print(f"    error: {rows[-1]['error'][-300:]}", flush=True)

    if args.batched:
        if args.models == parser.get_default("models"):
            args.models = "10k,convnet"
        _batched_section(args, run)
    else:
        _engine_section(args, run, base)
    return _report(args, rows, base, load_start)


def _engine_section(args: argparse.Namespace, run: Any, base: dict[str, Any]) -> None:
    """The per-client rows: the default run, per model the loop, the engine (1 and 2 workers, and the
    batched trainer where ``auto`` chooses it) and Flower's Ray engine; the privacy modes; the scale row."""
    # the default in-process run (10 clients, the app's defaults): command to the end of round 1
    run({"rounds": 0, "population": 10, "cohort": 10, "kind": "default", "model": "default"})
    for model in args.models.split(","):
        run({**base, "kind": "loop", "model": model})
        for workers in (1, 2):
            run({**base, "kind": "engine", "model": model, "workers": workers, "paired_loop": True,
                 "batched": "off", "extra": {"batched-training": "off"}})
        run({**base, "kind": "engine", "model": model, "workers": 1, "paired_loop": True,
             "batched": "on", "extra": {"batched-training": "on"}}, both=False)
        if not args.skip_flower:
            # The ServerApp first asks every one of the 1000 SuperNodes for its partition (not part of a
            # round); on a loaded machine Ray answered ~680 of them in the default 120 s client-timeout
            # and the row failed, so the Ray rows wait longer (the rounds are measured all the same).
            run({**base, "kind": "flower", "model": model,
                 "extra": {"client-timeout": 900.0, "batched-training": "off"}},
                timeout=args.flower_timeout, both=False)
    if not args.skip_privacy:
        for privacy, extra in PRIVACY_ROWS:
            run({**base, "kind": "engine", "model": "100k", "workers": 1, "privacy": privacy, "extra": extra},
                both=False)
    if not args.skip_scale:
        run({"rounds": 3, "population": 10_000, "cohort": 1000, "kind": "engine", "model": "10k",
             "workers": 2, "dataset": "synthetic"}, timeout=1200.0, both=False)


# the privacy rows (100k, one worker); the distributed accounting needs Poisson sampling (add-remove)
PRIVACY_ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("central", {"noise-multiplier": 1.0}),
    ("local", {"noise-multiplier": 1.0}),
    ("distributed", {"noise-multiplier": 1.0, "secagg": True, "accountant": "rdp", "sampling": "poisson",
                     "sample-rate": 0.1, "neighbouring": "add-remove"}),
)


def _report(args: argparse.Namespace, rows: list[dict[str, Any]], base: dict[str, Any],
            load_start: tuple[float, float, float]) -> int:
    rows = _summarise(rows)
    nonedp = {
        r["model"]: r["steady_round_seconds"]
        for r in rows
        if r.get("kind") == "engine"
        and r.get("privacy", "none") == "none"
        and r.get("workers") == 1
        and r.get("population") == args.population
    }
    for r in rows:
        if r.get("kind") == "engine" and r.get("privacy") and nonedp.get(r["model"]):
            if r.get("steady_round_seconds"):
                r["ratio_vs_none"] = r["steady_round_seconds"] / nonedp[r["model"]]

    print()
    print(
        f"{'kind':8} {'model':5} {'pop':>6} {'cohort':>6} {'w':>2} {'privacy':11} "
        f"{'round s':>8} {'train s':>8} {'x loop':>7} {'x pair':>7} {'to r1 s':>8} {'peak MB':>8}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r.get('kind', '?'):8} {r.get('model', '?'):5} error: {r['error'][-120:]}")
            continue
        train = r.get("steady_train_exchange_seconds", r.get("steady_train_seconds"))
        print(
            f"{r['kind']:8} {r['model']:5} {r['population']:>6} {r['cohort']:>6} "
            f"{r.get('workers', 1):>2} {r.get('privacy', 'none'):11} "
            f"{_fmt(r.get('steady_round_seconds')):>8} {_fmt(train):>8} "
            f"{_fmt(r.get('ratio_vs_loop'), '.2f'):>7} "
            f"{_fmt(r.get('ratio_vs_paired_loop'), '.2f'):>7} "
            f"{_fmt(r.get('command_to_round1_seconds'), '.1f'):>8} "
            f"{_fmt(r.get('peak_memory_mb'), '.0f'):>8}"
        )
    load_end = os.getloadavg()
    report = {
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": load_start, "loadavg_at_end": load_end},
        "workload": {**base, "models": {k: list(v) for k, v in MODELS.items()}},
        "goals": _goals(rows, population=args.population),
        "rows": rows,
    }
    print(json.dumps(report["goals"], indent=1))
    if args.figure is not None:
        _figure(rows, args.figure, load=(load_start, load_end))
        print(f"wrote {args.figure}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")
    return 0



def _figure(rows: list[dict[str, Any]], path: Path, *, load: tuple[Any, Any]) -> None:
    """One bar per row that has a steady round: seconds per round, labelled by kind, model, workers and
    batching; the load averages of the run in the title (the figures are under that load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.get("steady_round_seconds") or r.get("steady_batched_train_seconds")]
    labels, values = [], []
    for r in shown:
        tag = f"{r['kind']} {r['model']}"
        if r["kind"] == "engine":
            tag += f" w={r.get('workers', 1)} {r.get('privacy', 'none')}"
            tag += f" batched={r['batched']}" if "batched" in r else ""
        if r["kind"] == "trainers":  # the trainers row: two bars, per client and batched
            labels += [f"{tag} per-client", f"{tag} batched"]
            values += [r["steady_loop_train_seconds"], r["steady_batched_train_seconds"]]
            continue
        labels.append(tag)
        values.append(r["steady_round_seconds"])
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1.5))
    ax.barh(range(len(labels)), values)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per steady round (trainers: local training only)")
    start, end = (" ".join(f"{x:.1f}" for x in la) for la in load)
    ax.set_title(f"bench_engine (load average start {start}, end {end})", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
