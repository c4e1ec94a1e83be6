"""Secure aggregation per client against its cryptographic floor, measured primitive by primitive.

Usage: ``python scripts/secagg_bench.py [--clients 100] [--dim 100000] [--neighbours 0] [--dropout 0.1]
[--stage masked] [--bits 32] [--modes distributed,none] [--repeats 3] [--active] [--allocator tuned]
[--baseline-tree DIR] [--flower] [--json PATH]``

**Floor**: what one client's cryptography and encoding must cost, each primitive timed alone at its
best (min over repeats) in this run: ``k`` X25519 agreements with HKDF, 2 Shamir splits of
``t``-of-``(k+1)``, ``k`` AEAD seals, ``k+1`` AES-256-CTR keystream expansions of the (padded) vector
and, in ``distributed`` mode, the Hadamard rotation and the discrete Gaussian. The *protocol floor*
adds what the protocol cannot avoid beyond that list (the second set of ``k`` agreements, Bonawitz
et al. 2017; the key-pair generations; ``k`` AEAD opens; in ``distributed`` mode the stochastic
rounding's uniforms). The *XNoise protocol floor* (``xnoise_protocol_floor``, when a run's XNoise
design is given) is reported beside the other two, never instead of them.

**Achieved**: a whole round of the real state machines (``fedprivacy.secagg.local.run_round``) with
every public method of ``ClientSession`` and ``ServerSession`` timed (outermost calls only), plus
each client's real encoding; per client the sum over its calls, median over clients, min over
``--repeats`` rounds. The server's time is reported as a total and per client. Times are CPU seconds
of this process (``time.process_time``: other processes on a shared machine inflate wall time, not
this); wall times are reported beside them.

``--allocator tuned`` (the default) gives both trees' processes the glibc setting of
:func:`fedprivacy.runtime.keep_freed_memory`, as the engine runs; ``default`` leaves glibc alone.
``--baseline-tree DIR`` runs the same achieved measurement with the library of another checkout in a
child process, in this same run. ``--flower`` adds Flower 1.42's SecAgg+ primitives (imported only
here) for comparison. Rationale: docs/SECAGG.md, section "Performance (`scripts/secagg_bench.py`)".
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CPU = time.process_time
WALL = time.perf_counter


def _best(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(min CPU seconds, min wall seconds) of ``fn`` over ``repeats`` calls."""
    cpu, wall = math.inf, math.inf
    for _ in range(repeats):
        c0, w0 = CPU(), WALL()
        fn()
        cpu, wall = min(cpu, CPU() - c0), min(wall, WALL() - w0)
    return cpu, wall


# ----------------------------------------------------------------------------- parameters
def _params(args: argparse.Namespace) -> dict[str, Any]:
    from fedprivacy.secagg.graph import abort_probability_bound, min_safe_threshold

    n = args.clients
    k = args.neighbours or (n - 1 if n <= 30 else min(n - 1, 2 * math.ceil(math.log2(n)) + 1))
    k = min(k, n - 1)
    return {"clients": n, "dim": args.dim, "degree": k, "threshold": min_safe_threshold(k),
            "bits": args.bits, "dropout": args.dropout, "noise_multiplier": 1.0, "clip_norm": 1.0,
            "active": bool(getattr(args, "active", False)), "stage": args.stage,
            "abort_probability_bound": abort_probability_bound(num_clients=n, degree=k,
                                                               threshold=min_safe_threshold(k),
                                                               dropout=args.dropout)}


def _encoder(mode: str, p: dict[str, Any]) -> tuple[Callable[..., np.ndarray], int, dict[str, Any]]:
    """(encode(x, rng) -> uint32 vector, vector length, details) for a mode, as the engine sizes it."""
    from fedprivacy.secagg.quantize import check_headroom, encode_fixed_point

    n, d, bits, clip = p["clients"], p["dim"], p["bits"], p["clip_norm"]
    if mode == "none":
        scale = min(2.0**20, 2.0 ** math.floor(math.log2(((1 << (bits - 1)) - 1) / (n * clip) - 1)))
        check_headroom(num_clients=n, clip_norm=clip, scale=scale, modulus_bits=bits)

        def enc_fp(x: np.ndarray, rng: Any) -> np.ndarray:
            return encode_fixed_point(x, clip_norm=clip, scale=scale, modulus_bits=bits, rng=rng)

        return enc_fp, d, {"scale": scale}
    from fedprivacy.secagg.ddp import DistributedDPConfig, encode_update

    scale = 2.0**20
    while True:  # the largest power-of-two scale whose sum cannot wrap (as fl.secure sizes it)
        try:
            cfg = DistributedDPConfig(dim=d, clip_norm=clip, noise_multiplier=p["noise_multiplier"],
                                      min_survivors=p["threshold"], scale=scale, modulus_bits=bits,
                                      max_clients=4 * n)
            break
        except ValueError:
            scale /= 2.0
    rseed = secrets.token_bytes(32)

    def enc_dd(x: np.ndarray, rng: Any) -> np.ndarray:
        return encode_update(x, config=cfg, rotation_seed=rseed, rng=rng)

    return enc_dd, cfg.padded_dim, {"scale": scale, "local_sigma": cfg.local_sigma}


# ----------------------------------------------------------------------------- floor
def measure_floor(mode: str, p: dict[str, Any], repeats: int, *, design: Any = None) -> dict[str, Any]:
    """Each primitive of one client's round, timed alone (CPU seconds, min over repeats). ``design``: the
    XNoise design of the round measured (``secagg_round_bench`` passes its run's: this bench's own 32-bit
    sizing is not the engine's, and its variances are beyond the tabulated sampler's tables)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from fedprivacy.dp.discrete import sample_discrete_gaussian
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg import shamir
    from fedprivacy.secagg.keys import (
        KeyPair,
        context_bytes,
        derive_keys,
        load_private,
        open_many,
        seal_many,
    )
    from fedprivacy.secagg.rotation import fwht

    k, t = p["degree"], p["threshold"]
    _, length, details = _encoder(mode, p)
    me = load_private(KeyPair.generate().private)
    pubs = [KeyPair.generate().public for _ in range(k)]
    ctxs = [context_bytes(round=1, sender=0, receiver=j + 1) for j in range(k)]
    seeds = [secrets.token_bytes(32), secrets.token_bytes(32)]
    xs = list(range(1, k + 2))
    keys = derive_keys(me, pubs, purpose="share-seal", contexts=ctxs)
    pair = shamir.encode_shares(shamir.split_secrets(seeds, threshold=t, xs=xs)[0])
    sealed = seal_many(keys, [pair] * k, purpose="share-seal", contexts=ctxs)
    zeros = bytes(4 * length)
    buf = bytearray(4 * length + 15)

    def expand() -> None:
        for _ in range(k + 1):
            Cipher(algorithms.AES(secrets.token_bytes(32)), modes.CTR(bytes(16))).encryptor().update_into(zeros, buf)

    rows: dict[str, Callable[[], object]] = {
        "x25519_hkdf_k": lambda: derive_keys(me, pubs, purpose="mask", contexts=ctxs),
        "shamir_2_splits": lambda: shamir.split_secrets(seeds, threshold=t, xs=xs),
        "aead_seal_k": lambda: seal_many(keys, [pair] * k, purpose="share-seal", contexts=ctxs),
        "aes_ctr_k_plus_1": expand,
    }
    src = RandomSource.secure()
    if mode == "distributed":
        v = src.normal(std=1.0, size=length)
        rows["rotation_fwht"] = lambda: fwht(v)
        rows["discrete_gaussian"] = lambda: sample_discrete_gaussian(sigma=details["local_sigma"],
                                                                     size=length, rng=src)
    extras: dict[str, Callable[[], object]] = {
        "x25519_hkdf_second_k": rows["x25519_hkdf_k"],
        "keypair_generation_2": lambda: (KeyPair.generate(), KeyPair.generate()),
        "aead_open_k": lambda: open_many(keys, sealed, purpose="share-seal", contexts=ctxs),
    }
    extras["rounding_uniforms"] = lambda: src.uniform(size=length) < 0.5  # stochastic rounding
    out = _timed_floor(rows, extras, repeats=repeats, length=length)
    if design is not None and mode == "distributed":
        out["xnoise"] = _xnoise_floor(design, clients=p["clients"], length=length, repeats=repeats)
        # the protocol floor with XNoise's sampling in place of the floor's one discrete Gaussian
        out["xnoise_protocol_floor"] = (out["protocol_floor"] - out["primitives"]["discrete_gaussian"]
                                        + out["xnoise"]["client_components"]
                                        + out["xnoise"]["server_regeneration_per_client"])
    return {**out, **details}


def _timed_floor(rows: dict[str, Callable[[], object]], extras: dict[str, Callable[[], object]], *,
                 repeats: int, length: int) -> dict[str, Any]:
    """Each primitive at its best of ``repeats``; the floor is their sum (with the extras: the protocol's)."""
    floor = {name: _best(fn, repeats)[0] for name, fn in rows.items()}
    extra = {name: _best(fn, repeats)[0] for name, fn in extras.items()}
    return {"primitives": floor, "floor": sum(floor.values()), "protocol_extras": extra,
            "protocol_floor": sum(floor.values()) + sum(extra.values()), "vector_length": length}


def _xnoise_floor(design: Any, *, clients: int, length: int, repeats: int) -> dict[str, Any]:
    """XNoise's sampling, which the issue's floor list does not name (its "discrete Gaussian" is one
    vector): every component a client draws (``design.variances``, the tabulated sampler the protocol
    uses, each from its own keyed source) and, per client, the components the server regenerates when
    all ``clients`` survive (``design.removable`` for every rank). Each timed alone at its best."""
    from fedprivacy.secagg.xnoise import component_noise

    seed = secrets.token_bytes(32)
    per = [_best(lambda v=v, j=j: component_noise(seed, variance=v, size=length, round=1, node_id=1, index=j),
                 repeats)[0] for j, v in enumerate(design.variances)]
    regenerated = sum(per[j] for r in range(clients) for j in design.removable(survivors=clients, rank=r))
    return {"component_seconds": per, "client_components": sum(per),
            "server_regeneration_per_client": regenerated / clients,
            "components_per_client": len(per),
            "regenerated_per_client": sum(len(design.removable(survivors=clients, rank=r))
                                          for r in range(clients)) / clients}


# ----------------------------------------------------------------------------- achieved
class _Timer:
    """Accumulates CPU and wall time of the outermost public-method calls, per party."""

    def __init__(self) -> None:
        self.cpu: dict[object, dict[str, float]] = {}
        self.wall: dict[object, float] = {}
        self._depth = 0

    def add(self, who: object, what: str, cpu: float, wall: float) -> None:
        row = self.cpu.setdefault(who, {})
        row[what] = row.get(what, 0.0) + cpu
        self.wall[who] = self.wall.get(who, 0.0) + wall

    def timed(self, base: type, who: Callable[[Any], object]) -> type:
        """A subclass of ``base`` whose ``__init__`` and public methods are timed."""
        timer = self
        ns: dict[str, Any] = {}
        for name, attr in inspect.getmembers(base):
            static = inspect.getattr_static(base, name)
            if (name.startswith("_") and name != "__init__") or not callable(attr) or isinstance(
                    static, property | staticmethod | classmethod):
                continue

            def wrap(fn: Callable[..., Any], name: str = name) -> Callable[..., Any]:
                def timed_call(self: Any, *a: Any, **kw: Any) -> Any:
                    if timer._depth:
                        return fn(self, *a, **kw)
                    timer._depth += 1
                    c0, w0 = CPU(), WALL()
                    try:
                        return fn(self, *a, **kw)
                    finally:
                        timer._depth -= 1
                        timer.add(who(self), name, CPU() - c0, WALL() - w0)
                return timed_call

            ns[name] = wrap(attr)
        return type(f"Timed{base.__name__}", (base,), ns)


def measure_achieved(mode: str, p: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Per-client CPU seconds of real rounds (see the module docstring)."""
    import fedprivacy
    import fedprivacy.secagg.local as local
    from fedprivacy.dp.rng import RandomSource
    from fedprivacy.secagg import RoundAborted, SetupRequest  # exported by every tree

    n, t, k = p["clients"], p["threshold"], p["degree"]
    encode, length, _ = _encoder(mode, p)
    src = RandomSource.secure()
    updates = [src.normal(std=1.0, size=p["dim"]) for _ in range(4)]
    ids = list(range(1, n + 1))
    ndrop = int(round(p["dropout"] * n))
    drop = {i: p["stage"] for i in ids[n - ndrop:]}
    orig_client, orig_server = local.ClientSession, local.ServerSession
    best: dict[str, Any] | None = None
    try:
        for rep in range(repeats):
            timer = _Timer()
            local.ClientSession = timer.timed(orig_client, lambda s: s.node_id)  # type: ignore[misc,assignment]
            local.ServerSession = timer.timed(orig_server, lambda s: "server")  # type: ignore[misc,assignment]
            inputs = {}
            for i in ids:
                c0, w0 = CPU(), WALL()
                inputs[i] = encode(updates[i % 4], RandomSource.secure())
                timer.add(i, "encode", CPU() - c0, WALL() - w0)
            extra = {"active": True} if p.get("active") else {}  # the consistency stage
            setup = SetupRequest(round=rep + 1, threshold=t, degree=k, modulus_bits=p["bits"], dim=length,
                                 **extra)
            w0 = WALL()
            transcript: list[object] = []
            try:
                total, server, _ = local.run_round(setup, inputs, drop_before=drop, transcript=transcript)
            except RoundAborted as exc:
                return {"aborted": str(exc)}
            round_wall = WALL() - w0
            want = np.zeros(length, dtype=np.uint32)
            for i in server.u3:
                want += inputs[i]  # uint32 wraps: the sum mod 2^32
            if p["bits"] < 32:
                want &= np.uint32((1 << p["bits"]) - 1)
            exact = bool(np.array_equal(total, want))
            row = _achieved_row(timer, ids=ids, drop=drop, n=n, round_wall=round_wall)
            row.update(survivors=len(server.u3), sum_exact=exact,  # the survivors' inputs mod 2^b, bit for bit
                       upload_bytes_per_client=_upload_bytes(transcript, ids[0]))
            row["upload_bytes_per_coordinate"] = row["upload_bytes_per_client"] / p["dim"]
            if best is None or row["client_seconds"] < best["client_seconds"]:
                best = row
    finally:
        local.ClientSession, local.ServerSession = orig_client, orig_server  # type: ignore[misc,assignment]
    assert best is not None
    best["library"] = str(Path(fedprivacy.__file__).resolve().parent)
    return best


def _achieved_row(timer: Any, *, ids: list[int], drop: dict[int, str], n: int, round_wall: float) -> dict[str, Any]:
    """The per-client and server CPU seconds of one measured round (medians over the live clients)."""
    live = [i for i in ids if i not in drop]
    per_client = [sum(timer.cpu[i].values()) for i in live if i in timer.cpu]
    server_cpu = sum(timer.cpu.get("server", {}).values())
    calls = sorted({c for i in live for c in timer.cpu[i]})
    return {
        "client_seconds": statistics.median(per_client),
        "client_seconds_max": max(per_client),
        "client_wall_seconds": statistics.median([timer.wall[i] for i in live]),
        "client_by_call": {name: statistics.median([timer.cpu[i].get(name, 0.0) for i in live]) for name in calls},
        "server_seconds": server_cpu,
        "server_by_call": timer.cpu.get("server", {}),
        "server_seconds_per_client": server_cpu / n,
        "round_wall_seconds": round_wall,
    }


def _upload_bytes(transcript: list[object], node: int) -> int:
    """Bytes client ``node`` sends in its replies: every bytes field and array (lists of them too)."""
    def size(v: object) -> int:
        if isinstance(v, bytes | bytearray):
            return len(v)
        if isinstance(v, np.ndarray):
            return int(v.nbytes)
        if isinstance(v, list | tuple):
            return sum(size(x) for x in v)
        return 0

    total = 0
    for m in transcript:
        if getattr(m, "node_id", None) == node:
            total += sum(size(getattr(m, f)) for f in getattr(m, "__dataclass_fields__", {}))
    return total


def _child(tree: Path | None, mode: str, args: argparse.Namespace, *, floor: bool) -> dict[str, Any]:
    """One round (and optionally the floor) in a fresh process, with the library of ``tree``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--modes", mode,
           "--clients", str(args.clients), "--dim", str(args.dim), "--neighbours", str(args.neighbours),
           "--dropout", str(args.dropout), "--stage", args.stage, "--bits", str(args.bits)]
    cmd += ["--with-floor"] if floor else []
    if args.active and tree is None:  # a baseline tree from before the active schedule has no active schedule
        cmd.append("--active")
    env = dict(os.environ)
    if args.allocator == "tuned":  # what fedprivacy.runtime.keep_freed_memory sets, for either tree
        env.update(MALLOC_MMAP_THRESHOLD_=str(16 << 20), MALLOC_TRIM_THRESHOLD_=str(32 << 20))
    if tree is not None:
        env["PYTHONPATH"] = str(tree.resolve())
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                         cwd=tree if tree is not None else None)
    return json.loads(out.stdout)[mode]


def _min_by(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return min(rows, key=lambda r: r.get(key, math.inf))


# ----------------------------------------------------------------------------- Flower
def measure_flower(p: dict[str, Any]) -> dict[str, Any]:
    """Flower 1.42's SecAgg+ primitives for the same round (client: quantize, MT19937 masks, P-384
    ECDH, GF(2^128) Shamir; server: Shamir combine and mask regeneration). Imported only here."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        parameters_addition,
        parameters_mod,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.quantization import quantize
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen

    n, k, t, d = p["clients"], p["degree"], p["threshold"], p["dim"]
    x = np.random.default_rng(0).normal(size=d)
    x /= np.linalg.norm(x)
    my_sk = ec.generate_private_key(ec.SECP384R1())
    peers = [ec.generate_private_key(ec.SECP384R1()).public_key() for _ in range(k)]
    c0 = CPU()
    seed, sk = secrets.token_bytes(32), secrets.token_bytes(48)
    shares_seed, shares_key = create_shares(seed, t, k + 1), create_shares(sk, t, k + 1)
    vec = parameters_addition(quantize([x], 8.0, 1 << 22), pseudo_rand_gen(seed, 1 << 32, [(d,)]))
    for j, pk in enumerate(peers):
        pm = pseudo_rand_gen(generate_shared_key(my_sk, pk), 1 << 32, [(d,)])
        vec = parameters_addition(vec, pm) if j % 2 else parameters_subtraction(vec, pm)
    parameters_mod(vec, 1 << 32)
    client = CPU() - c0
    ndrop = 0 if p["stage"] == "unmask" else int(round(p["dropout"] * n))
    acc = np.zeros(d, dtype=np.int64)
    c0 = CPU()
    for _ in range(n - ndrop):
        acc -= pseudo_rand_gen(combine_shares(shares_seed[:t]), 1 << 32, [(d,)])[0]
    for _ in range(ndrop):
        combine_shares(shares_key[:t])
        for _ in range(k):
            acc += pseudo_rand_gen(secrets.token_bytes(32), 1 << 32, [(d,)])[0]
    acc %= 1 << 32
    return {"client_seconds": client, "server_unmask_seconds": CPU() - c0,
            "upload_bytes_per_coordinate": 8.0,  # int64 arrays
            "note": "Flower primitives only, CPU seconds"}


# ----------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--dim", type=int, default=100_000)
    ap.add_argument("--neighbours", type=int, default=0, help="degree k (0: the engine's automatic rule)")
    ap.add_argument("--dropout", type=float, default=0.0, help="fraction of clients that drop out")
    ap.add_argument("--stage", default="masked", choices=("advertise", "share", "masked", "unmask"),
                    help="the stage before which they drop")
    ap.add_argument("--bits", type=int, default=32)
    ap.add_argument("--modes", default="distributed,none")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-tree", type=Path, default=None)
    ap.add_argument("--flower", action="store_true")
    ap.add_argument("--active", action="store_true",
                    help="the actively secure schedule (consistency stage); a baseline tree runs semi-honest")
    ap.add_argument("--allocator", choices=("tuned", "default"), default="tuned",
                    help="tuned: glibc keeps freed memory (fedprivacy.runtime.keep_freed_memory), as "
                         "the engine runs; default: glibc's own thresholds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--with-floor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, default=None)
    return ap


def _mode_row(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode's row: the floors and achieved figures, each the best of ``args.repeats`` fresh processes."""
    cur: list[dict[str, Any]] = []
    base: list[dict[str, Any]] = []
    for _ in range(args.repeats):  # interleaved, so that both see the same machine load
        cur.append(_child(None, mode, args, floor=True))
        if args.baseline_tree is not None:
            base.append(_child(args.baseline_tree, mode, args, floor=False)["achieved"])
    floors = [c["floor"] for c in cur]
    floor = _min_by(floors, "floor")
    floor["primitives"] = {k: min(f["primitives"][k] for f in floors) for k in floor["primitives"]}
    floor["protocol_extras"] = {k: min(f["protocol_extras"][k] for f in floors)
                                for k in floor["protocol_extras"]}
    floor["floor"] = sum(floor["primitives"].values())
    floor["protocol_floor"] = floor["floor"] + sum(floor["protocol_extras"].values())
    if "xnoise" in floor:
        xn = _min_by([f["xnoise"] for f in floors], "client_components")
        floor["xnoise"] = xn
        floor["xnoise_protocol_floor"] = (floor["protocol_floor"] - floor["primitives"]["discrete_gaussian"]
                                          + xn["client_components"] + xn["server_regeneration_per_client"])
    ach = _min_by([c["achieved"] for c in cur], "client_seconds")
    row: dict[str, Any] = {"floor": floor, "achieved": ach}
    if "aborted" not in ach:
        row["client_over_floor"] = ach["client_seconds"] / floor["floor"]
        row["client_over_protocol_floor"] = ach["client_seconds"] / floor["protocol_floor"]
    if base:
        b = _min_by(base, "client_seconds")
        row["baseline"] = b
        if "aborted" not in b and "aborted" not in ach:
            row["baseline_client_over_floor"] = b["client_seconds"] / floor["floor"]
            row["speedup_client_vs_baseline"] = b["client_seconds"] / ach["client_seconds"]
            row["speedup_server_vs_baseline"] = b["server_seconds"] / ach["server_seconds"]
    return row


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    modes = args.modes.split(",")
    if args.clients < 3 or args.dim < 1 or not 0 <= args.dropout < 0.5 or not set(modes) <= {"distributed", "none"}:
        print("error: need --clients >= 3, --dim >= 1, 0 <= --dropout < 0.5, --modes from "
              "distributed,none", file=sys.stderr)
        return 2
    p = _params(args)
    if args.child:  # one measurement in this process (see _child)
        one: dict[str, Any] = {"achieved": measure_achieved(modes[0], p, 1)}
        if args.with_floor:
            one["floor"] = measure_floor(modes[0], p, 5)
        print(json.dumps({modes[0]: one}))
        return 0
    out: dict[str, Any] = {"params": p, "allocator": args.allocator, "load_before": os.getloadavg(), "modes": {},
                           "method": "each repeat runs the current tree, then the baseline tree, each in a "
                                     "fresh process; per quantity the repeat with the lowest value is kept "
                                     "(CPU seconds)"}
    for mode in modes:
        row = _mode_row(mode, args)
        out["modes"][mode] = row
        ach, floor = row["achieved"], row["floor"]
        print(f"{mode:12s} client {ach.get('client_seconds', math.nan) * 1e3:8.2f} ms CPU  floor "
              f"{floor['floor'] * 1e3:7.2f} ms (x{row.get('client_over_floor', math.nan):.2f}), protocol "
              f"floor {floor['protocol_floor'] * 1e3:7.2f} ms (x{row.get('client_over_protocol_floor', math.nan):.2f})"
              f"  server {ach.get('server_seconds', math.nan) * 1e3:8.1f} ms"
              + (f"  baseline client {row['baseline']['client_seconds'] * 1e3:.2f} ms"
                 if "baseline" in row and "client_seconds" in row["baseline"] else ""),
              file=sys.stderr, flush=True)
    if args.flower:
        out["flower"] = measure_flower(p)
        for row in out["modes"].values():
            if "client_seconds" in row["achieved"]:
                row["speedup_client_vs_flower"] = out["flower"]["client_seconds"] / row["achieved"]["client_seconds"]
                row["speedup_server_unmask_vs_flower"] = (out["flower"]["server_unmask_seconds"]
                                                          / row["achieved"]["server_by_call"]["receive_unmask"])
    out["load_after"] = os.getloadavg()
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
