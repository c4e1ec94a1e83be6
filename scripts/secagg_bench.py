"""Benchmark fedprivacy's SecAgg+ against Flower 1.42's SecAgg+ primitives, in one run.

Usage: python scripts/secagg_bench.py --clients N --dim D --neighbours K --dropout F [--stage S]
       [--bits B] [--json PATH]

fedprivacy: a full in-process round (fedprivacy.secagg.local.run_round) with a fraction F of the
clients dropping before stage S; one client's masked-input call is timed (decrypting its shares,
deriving pair seeds, masking) and compared with the AES-256-CTR keystream bound ((k+1) masks of 4d
bytes into a preallocated buffer, measured here); the server's unmasking call is timed.
Flower: the same client's path with flwr's primitives (its quantize, numpy-MT19937 pseudo_rand_gen
for the self mask and k pairwise masks, P-384 ECDH + HKDF per neighbour, Shamir split of two
secrets over GF(2^128)) and the server's unmask path (Shamir combine for every needed secret and
mask regeneration). Flower is imported only here, never by the library.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import sys
import time
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedprivacy.dp.rng import RandomSource
from fedprivacy.secagg.graph import abort_probability_bound, min_safe_threshold
from fedprivacy.secagg.local import STAGES, run_round
from fedprivacy.secagg.protocol import (
    ClientSession,
    MaskedInput,
    RoundAborted,
    SetupRequest,
    SharedKeys,
    UnmaskResponse,
)
from fedprivacy.secagg.quantize import check_headroom, from_ring, stochastic_round, to_ring


def _keystream_bound(dim: int, count: int) -> float:
    """Pure AES-256-CTR cost of ``count`` masks of ``dim`` words: the best of a whole-buffer and a
    cache-sized-chunk keystream generation (no arithmetic), min over 3 repeats."""
    best = math.inf
    zeros = bytes(4 * dim)
    whole = bytearray(4 * dim + 15)
    chunk = 1 << 14
    small = bytearray(4 * chunk + 15)
    zc = bytes(4 * chunk)
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(count):
            enc = Cipher(algorithms.AES(secrets.token_bytes(32)), modes.CTR(bytes(16))).encryptor()
            enc.update_into(zeros, whole)
        best = min(best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        encs = [Cipher(algorithms.AES(secrets.token_bytes(32)), modes.CTR(bytes(16))).encryptor()
                for _ in range(count)]
        for start in range(0, dim, chunk):
            n = min(chunk, dim - start)
            for enc in encs:
                enc.update_into(zc if n == chunk else zc[: 4 * n], small)
        best = min(best, time.perf_counter() - t0)
    return best


class _TimedClient(ClientSession):
    """Records the wall time of masked_input (the client's masking stage)."""

    timings: list[float] = []

    def masked_input(self, request, vector):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        out = super().masked_input(request, vector)
        _TimedClient.timings.append(time.perf_counter() - t0)
        return out


def _fedprivacy(args: argparse.Namespace, floats: list[np.ndarray]) -> dict[str, Any]:
    n, d, bits = args.clients, args.dim, args.bits
    k = min(args.neighbours, n - 1)
    t = min_safe_threshold(k)
    clip = 1.0
    # largest fixed-point scale the worst-case headroom check accepts for n clients
    scale = float(((1 << (bits - 1)) - 1) // n - 1) / clip
    check_headroom(num_clients=n, clip_norm=clip, scale=scale, modulus_bits=bits)
    rng = RandomSource.secure()
    t0 = time.perf_counter()
    distinct = [to_ring(stochastic_round(floats[0] * scale, rng=rng), modulus_bits=bits)]
    quant_s = time.perf_counter() - t0
    distinct += [to_ring(stochastic_round(f * scale, rng=rng), modulus_bits=bits) for f in floats[1:]]
    ids = list(range(1, n + 1))
    inputs = {i: distinct[i % len(distinct)] for i in ids}
    ndrop = int(round(args.dropout * n))
    drop = {i: args.stage for i in ids[-ndrop:]} if ndrop else {}
    setup = SetupRequest(round=1, threshold=t, degree=k, modulus_bits=bits, dim=d)
    abort_p = abort_probability_bound(num_clients=n, degree=k, threshold=t, dropout=args.dropout)
    import fedprivacy.secagg.local as local

    orig = local.ClientSession
    local.ClientSession = _TimedClient  # type: ignore[misc]
    _TimedClient.timings = []
    transcript: list[object] = []
    try:
        t0 = time.perf_counter()
        # time the server's unmask call by wrapping the session method
        from fedprivacy.secagg.protocol import ServerSession

        unmask_time: list[float] = []
        orig_unmask = ServerSession.receive_unmask

        def timed(self, msgs):  # type: ignore[no-untyped-def]
            s0 = time.perf_counter()
            out = orig_unmask(self, msgs)
            unmask_time.append(time.perf_counter() - s0)
            return out

        ServerSession.receive_unmask = timed  # type: ignore[method-assign]
        try:
            total, server, _ = run_round(setup, inputs, drop_before=drop, transcript=transcript)
        except RoundAborted as exc:
            return {"aborted": str(exc), "abort_probability_bound": abort_p,
                    "client_mask_seconds": float(np.median(_TimedClient.timings or [math.nan]))}
        round_seconds = time.perf_counter() - t0
    finally:
        local.ClientSession = orig  # type: ignore[misc]
        ServerSession.receive_unmask = orig_unmask  # type: ignore[method-assign]
    expected = sum(floats[i % len(floats)].astype(np.float64) for i in server.u3)
    got = from_ring(total, modulus_bits=bits) / scale
    mask_s = float(np.median(_TimedClient.timings))
    mask_min = float(np.min(_TimedClient.timings))
    bound = _keystream_bound(d, k + 1)
    me = ids[0]
    up = 64  # two X25519 public keys
    up += sum(sum(len(c) for c in m.ciphertexts) for m in transcript
              if isinstance(m, SharedKeys) and m.node_id == me)
    up += sum(m.masked.nbytes for m in transcript if isinstance(m, MaskedInput) and m.node_id == me)
    up += sum(sum(map(len, m.seed_shares)) + sum(map(len, m.key_shares)) for m in transcript
              if isinstance(m, UnmaskResponse) and m.node_id == me)
    return {
        "client_mask_seconds": mask_s,
        "keystream_bound_seconds": bound,
        "mask_over_bound": mask_s / bound,
        "client_mask_seconds_min": mask_min,
        "mask_min_over_bound": mask_min / bound,
        "client_quantize_seconds": quant_s,
        "server_unmask_seconds": unmask_time[0],
        "round_seconds_in_process": round_seconds,
        "upload_bytes_per_client": up,
        "upload_bytes_per_coordinate": up / d,
        "max_abs_error": float(np.max(np.abs(got - expected))),
        "threshold": t,
        "degree": k,
        "abort_probability_bound": abort_p,
        "survivors": len(server.u3),
        "scale": scale,
    }


def _flower(args: argparse.Namespace, floats: list[np.ndarray]) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        parameters_addition,
        parameters_mod,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.quantization import dequantize, quantize
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    from flwr.common.typing import NDArray

    n, d = args.clients, args.dim
    k = min(args.neighbours, n - 1)
    t = min_safe_threshold(k)
    clipping_range, target_range, mod_range = 8.0, 1 << 22, 1 << 32  # Flower's defaults
    dims: list[tuple[int, ...]] = [(d,)]
    my_sk = ec.generate_private_key(ec.SECP384R1())
    peers = [ec.generate_private_key(ec.SECP384R1()).public_key() for _ in range(k)]
    rd_seed = secrets.token_bytes(32)
    t0 = time.perf_counter()
    sk_bytes = secrets.token_bytes(48)
    create_shares(rd_seed, t, k + 1)
    create_shares(sk_bytes, t, k + 1)
    shamir_split = time.perf_counter() - t0
    t0 = time.perf_counter()
    q = quantize([floats[0]], clipping_range, target_range)
    quant_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    vec: list[NDArray] = parameters_addition(q, pseudo_rand_gen(rd_seed, mod_range, dims))
    for j, pk in enumerate(peers):
        key = generate_shared_key(my_sk, pk)
        pm = pseudo_rand_gen(key, mod_range, dims)
        vec = parameters_addition(vec, pm) if j % 2 else parameters_subtraction(vec, pm)
    vec = parameters_mod(vec, mod_range)
    mask_s = time.perf_counter() - t0
    upload = int(vec[0].astype(np.int64).nbytes)  # Flower ships int64 ndarrays
    # server: combine t shares for each survivor's seed and each dropped key, regenerate masks
    # clients lost in the unmask stage still uploaded: nobody's key must be reconstructed
    ndrop = 0 if args.stage == "unmask" else int(round(args.dropout * n))
    shares_seed = create_shares(rd_seed, t, k + 1)
    shares_key = create_shares(sk_bytes, t, k + 1)
    acc: np.ndarray = np.zeros(d, dtype=np.int64)
    t0 = time.perf_counter()
    for _ in range(n - ndrop):
        seed = combine_shares(shares_seed[:t])
        acc -= pseudo_rand_gen(seed, mod_range, dims)[0]
    for _ in range(ndrop):
        combine_shares(shares_key[:t])
        for _ in range(k):
            acc += pseudo_rand_gen(secrets.token_bytes(32), mod_range, dims)[0]
    acc %= mod_range
    unmask_s = time.perf_counter() - t0
    # accuracy of Flower's quantisation on the same survivors' sum
    survivors = n - ndrop if args.stage in ("advertise", "share", "masked") else n
    total = np.zeros(d, dtype=np.int64)
    for i in range(survivors):
        total += quantize([floats[(i + 1) % len(floats)]], clipping_range, target_range)[0]
    deq = dequantize([total % mod_range], clipping_range, target_range)[0]
    deq = deq - (survivors - 1) * clipping_range  # dequantize subtracts one offset, a sum has n
    expected = sum(floats[(i + 1) % len(floats)] for i in range(survivors))
    return {
        "client_mask_seconds": mask_s,
        "client_shamir_split_seconds": shamir_split,
        "client_quantize_seconds": quant_s,
        "server_unmask_seconds": unmask_s,
        "upload_bytes_per_client": upload,
        "upload_bytes_per_coordinate": upload / d,
        "max_abs_error": float(np.max(np.abs(deq - expected))),
        "note": "primitives only (quantize, MT19937 masks, P-384 ECDH, GF(2^128) Shamir)",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--dim", type=int, default=1_000_000)
    p.add_argument("--neighbours", type=int, default=7)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--stage", choices=STAGES, default="masked",
                   help="stage before which the dropped clients vanish")
    p.add_argument("--bits", type=int, default=32)
    p.add_argument("--json", type=str, default=None)
    p.add_argument("--no-flower", action="store_true")
    args = p.parse_args(argv)
    if not 0 <= args.dropout < 1 or args.clients < 3 or args.dim < 1:
        print("error: need --clients >= 3, --dim >= 1, 0 <= --dropout < 1", file=sys.stderr)
        return 2
    rng = RandomSource.secure()
    # four distinct client updates of L2 norm <= 1 (inputs are reused to save memory)
    floats = []
    for _ in range(4):
        v = rng.normal(std=1.0, size=args.dim)
        floats.append(v / max(1.0, float(np.linalg.norm(v))))
    out: dict[str, Any] = {"clients": args.clients, "dim": args.dim, "neighbours": args.neighbours,
                           "dropout": args.dropout, "stage": args.stage, "bits": args.bits}
    out.update(_fedprivacy(args, floats))
    if not args.no_flower and "aborted" not in out:
        out["flower"] = _flower(args, floats)
        out["speedup_client_mask_vs_flower"] = (
            (out["flower"]["client_mask_seconds"] + out["flower"]["client_shamir_split_seconds"])
            / out["client_mask_seconds"])
        out["speedup_server_unmask_vs_flower"] = (out["flower"]["server_unmask_seconds"]
                                                  / out["server_unmask_seconds"])
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
