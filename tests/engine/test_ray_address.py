"""``--ray-address``: what is accepted, what is refused before anything starts, and what reaches Ray.

The environment the launcher hands to Flower's driver is read back with Ray's own code (``JobConfig``
and the merge ``ray.init`` does with Flower's runtime env), not compared with a hard-coded string.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from server.engine.cli import main
from server.engine.flower import free_port
from server.engine.ray_cluster import JOB_CONFIG_ENV, check_ray_address, check_reachable, ray_env

REPO_DIR = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("address", ["auto", "127.0.0.1:6379", "head.example.org:6379", "[::1]:6380",
                                     "10.0.0.7:1", "h:65535"])
def test_auto_and_host_port_are_accepted(address: str) -> None:
    assert check_ray_address(f" {address} ") == address


@pytest.mark.parametrize("address", ["", "local", "ray://head:10001", "http://head:8265", "head", ":6379",
                                     "head:0", "head:65536", "head:port", "head:6379:1", "a b:1", "-h:1",
                                     "head:\u0663"])
def test_anything_else_is_refused_naming_the_forms(address: str) -> None:
    with pytest.raises(ValueError, match=r"must be 'auto' or HOST:PORT"):
        check_ray_address(address)


def test_a_port_nobody_listens_on_is_refused_and_a_listening_one_passes() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    with pytest.raises(ValueError, match="no Ray cluster answers at 127.0.0.1:"):
        check_reachable(f"127.0.0.1:{free_port()}")


def test_without_an_address_the_driver_starts_its_own_ray() -> None:
    # "local" makes ray.init start a new instance even when RAY_ADDRESS or `ray start` say otherwise
    assert ray_env(None, {"RAY_ADDRESS": "10.0.0.1:6379"}) == {"RAY_ADDRESS": "local"}


def test_the_cluster_actors_get_the_clients_floor_in_the_job_runtime_env() -> None:
    ray = pytest.importorskip("ray")
    from ray.runtime_env.runtime_env import _merge_runtime_env

    environ = {"FEDPRIVACY_CLIENT_POLICY": '{"client-allow-seeded": true}', "FEDPRIVACY_RUN_TEMP": "rt",
               "FEDPRIVACY_STATUS_FILE": "status.json", "HOME": "home",
               JOB_CONFIG_ENV: json.dumps({"runtime_env": {"env_vars": {"A": "1"}}})}
    env = ray_env("127.0.0.1:6379", environ)
    # the way ray.init reads and merges it with the runtime env Flower's RayBackend passes
    job = ray.job_config.JobConfig.from_json(json.loads(env[JOB_CONFIG_ENV]))
    merged = _merge_runtime_env(job.runtime_env, {"env_vars": {"PYTHONPATH": "p"}})
    assert env["RAY_ADDRESS"] == "127.0.0.1:6379"
    assert merged is not None  # no conflict with Flower's own runtime env
    assert merged["env_vars"] == {"A": "1", "FEDPRIVACY_CLIENT_POLICY": '{"client-allow-seeded": true}',
                                  "FEDPRIVACY_RUN_TEMP": "rt", "PYTHONPATH": "p"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ray-address", "127.0.0.1:6379"], "--ray-address applies only to --engine flower"),
        (["--engine", "inprocess", "--ray-address", "auto"], "--ray-address applies only to --engine flower"),
        (["--engine", "flower", "--ray-address", "ray://head:10001"], "--ray-address: must be 'auto' or"),
        (["--engine", "flower", "--ray-address", "head:70000"], "--ray-address: must be 'auto' or"),
    ],
)
def test_simulate_refuses_the_option_with_one_line_and_exit_2(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--app-dir", str(REPO_DIR), *args])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and needle in err[0]


def test_simulate_refuses_an_address_nobody_answers_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    cfg = f"num-server-rounds=1 privacy='central' secagg=false output-dir='{tmp_path}' run-name='never'"
    code = main(["simulate", "--engine", "flower", "--ray-address", f"127.0.0.1:{port}", "--num-supernodes",
                 "2", "--run-config", cfg, "--app-dir", str(REPO_DIR)])

    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and f"--ray-address: no Ray cluster answers at 127.0.0.1:{port}" in err[0]
    assert "flwr run" not in captured.out and not (tmp_path / "never").exists()


def test_flwr_local_refuses_a_malformed_address_with_exit_2() -> None:
    out = subprocess.run([sys.executable, str(REPO_DIR / "scripts" / "flwr_local.py"), "--ray-address",
                          "head"], capture_output=True, text=True, timeout=120, check=False)

    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "flwr_local: error: --ray-address: must be 'auto' or HOST:PORT with a port in 1..65535, got 'head'"]
