"""scripts/secagg_bench.py runs end to end on a tiny round and reports what its docstring promises."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "secagg_bench.py"


def _load():  # noqa: ANN202 - a module
    spec = importlib.util.spec_from_file_location("_secagg_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_floor_and_achieved_are_reported_per_mode_and_the_sum_is_exact() -> None:
    # Arrange: the script's own parameters for a tiny round (in this process, no children)
    bench = _load()
    args = bench.argparse.Namespace(clients=6, dim=100, neighbours=0, bits=32, dropout=0.2,
                                    stage="masked", active=False)
    p = bench._params(args)
    for mode in ("distributed", "none"):
        # Act
        floor = bench.measure_floor(mode, p, 2)
        ach = bench.measure_achieved(mode, p, 1)
        # Assert
        rows = {"x25519_hkdf_k", "shamir_2_splits", "aead_seal_k", "aes_ctr_k_plus_1"}
        if mode == "distributed":
            rows |= {"rotation_fwht", "discrete_gaussian"}
        assert set(floor["primitives"]) == rows
        assert floor["protocol_floor"] > floor["floor"] > 0
        assert ach["sum_exact"] is True and ach["survivors"] == 5  # one of six dropped
        assert set(ach["client_by_call"]) >= {"encode", "share_keys", "masked_input", "unmask"}
        assert ach["upload_bytes_per_client"] > 4 * 100  # at least the masked vector
        assert math.isfinite(ach["client_seconds"] / floor["floor"])


def test_bad_arguments_exit_with_code_2() -> None:
    assert _load().main(["--clients", "2"]) == 2
