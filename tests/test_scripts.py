"""Every script under ``scripts/`` works as a command: ``--help`` prints a whole description, and the
script runs to the end with small arguments (its defaults otherwise) and writes its JSON.

A script is either run here (``QUICK``) or named with the test that runs it (``RUN_ELSEWHERE``); a new
script that is in neither fails :func:`test_every_script_has_a_smoke_run`. The runs are slow (real
training, real accounting): they are marked ``slow`` and kept to seconds each.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
NAMES = sorted(p.stem for p in SCRIPTS.glob("*.py"))

RUN_ELSEWHERE = {
    "audit": "tests/attacks/test_attacks_scripts.py",
    "benchmark": "tests/bench/test_bench_smoke.py",
    "bench_population": "tests/bench/test_bench_population.py",
    "bench_sweep": "tests/sweep/test_sweep_runs.py",
    "deployment_local": "tests/e2e/test_e2e_flower.py",
    "flwr_local": "tests/e2e/test_sweep.py",
    "gpu_check": "tests/ml/test_gpu_check.py",
    "gradient_leakage": "tests/attacks/test_attacks_scripts.py",
    "membership_inference": "tests/attacks/test_attacks_scripts.py",
    "secagg_bench": "tests/secagg/test_secagg_bench_script.py",
}
# The defaults, cut to a smoke run. secagg_round_bench keeps its default modes: they crashed once
# (plain and central rows without secagg=false under the app's secagg=true default).
QUICK: dict[str, list[str]] = {
    "adaptive_adversary": ["--quick"],
    "bench_accounting": ["--rounds", "2"],
    "bench_byzantine": ["--quick", "--rules", "plain,trimmed-mean", "--attacks", "none,sign-flip,backdoor"],
    "bench_dpftrl_noise": ["--dim", "1000", "--rounds", "2", "--bands", "4"],
    "bench_engine": ["--quick", "--population", "20", "--cohort", "5"],
    "client_memory_bench": ["--clients", "4", "--rounds", "1"],
    "bench_tracking": ["--clients", "4", "--rounds", "3", "--skip", "1"],
    "bench_noise": ["--size", "10000", "--repeats", "1", "--exact-draws", "10"],
    "ddp_bits_bench": ["--setups", "default", "--seeds", "0", "--bits", "16", "--local-epochs", "1",
                       "--no-legacy"],
    "peer_auth_bench": ["--clients", "6", "--rounds", "2", "--repeats", "1"],
    "methods_bench": ["--dataset", "digits", "--clients", "20", "--rounds", "2", "--seeds", "0", "--only",
                      "fedavg", "fedadam"],
    "secagg_round_bench": ["--clients", "4", "--rounds", "1"],
    "user_membership": ["--epsilons", "none,8", "--models", "3", "--rounds", "1", "--clients", "8",
                        "--per-client", "10", "--local-epochs", "1", "--model", "mlp", "--statistics",
                        "--server-optimizer", "fedavgm"],
    "xnoise_bench": ["--dims", "10", "--rosters", "10:6", "--repeats", "1"],
}


def _main(name: str) -> Callable[[list[str]], int]:
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.main  # type: ignore[no-any-return]


def test_every_script_has_a_smoke_run() -> None:
    assert sorted(n for n in NAMES if n not in RUN_ELSEWHERE and n not in QUICK) == []
    assert sorted(set(RUN_ELSEWHERE) | set(QUICK)) == NAMES  # no stale entry either
    for test in RUN_ELSEWHERE.values():
        assert (SCRIPTS.parent / test).is_file(), test


@pytest.mark.parametrize("name", ["deployment_local", "secagg_round_bench", "audit", "gradient_leakage"])
def test_help_prints_the_whole_first_paragraph(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Arrange: the first paragraph of the docstring, which the description must not cut off
    main = _main(name)
    # Act
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    # Assert
    out = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0 and out.startswith("usage: ")
    first = " ".join((SCRIPTS / f"{name}.py").read_text().split('"""')[1].split("\n\n")[0].split())
    assert first.split(". ")[0].rstrip(".") in out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK))
def test_script_runs_to_the_end_and_writes_json(name: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # scratch folders a script (or its child processes) makes land in the test's own folder
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / f"{name}.json"
    assert _main(name)([*QUICK[name], "--json", str(out)]) == 0
    assert isinstance(json.loads(out.read_text()), dict)
