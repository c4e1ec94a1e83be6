"""The privacy report of a run (``privacy_report.md``), generated from its ``results.json`` dict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def privacy_report_md(results: dict[str, Any], *, covers: Sequence[str]) -> str:
    """A Markdown report stating exactly what the run's ε covers and what it does not.

    ``covers`` is the mode's own section (:attr:`fedprivacy.fl.modes.PrivacyMode.covers`; empty: no
    DP, the report then claims nothing).
    """
    p = results["privacy"]
    dp = bool(covers)
    lines = [f"# Privacy report: {results.get('run_name', '')}", ""]
    lines += _seeded_warning(p, dp)
    lines += ["## Claim", ""] + _claim(p, dp)
    if results.get("dpsgd"):
        lines += _dpsgd_section(results["dpsgd"])
    if p.get("distributed"):  # ---- secure aggregation with distributed DP (fedprivacy/fl/modes/distributed.py)
        lines += _distributed_section(p)
    if p.get("correlated"):  # ---- correlated noise (fedprivacy/fl/modes/dpftrl.py)
        lines += _correlated_section(p["correlated"])
    if p.get("adaptive_clip"):  # ---- adaptive clipping (fedprivacy/fl/adaptive_clip.py)
        lines += _adaptive_clip_section(p["adaptive_clip"], results.get("rounds", []))
    if dp:  # a run without DP claims nothing: no coverage, trust or accountant boilerplate
        lines += ["## What ε covers", ""] + _covers(covers, _colluders(p)) + _accounting_section(p)
    lines += _run_section(results)
    return "\n".join(lines)


def _correlated_section(c: dict[str, Any]) -> list[str]:
    """The matrix mechanism's claim (:meth:`fedprivacy.dp.matrix.MatrixMechanism.claim`)."""
    shape = f"band {c.get('band')}" if c.get("band") is not None else f"{c.get('buffers')} buffers, not banded"
    return ["## Correlated noise", "",
            f"Round t adds (C⁻¹z)_t to the clipped sum; C = {c.get('factorization')} ({shape}, "
            f"{c.get('num_rounds')} rounds). Schema: {c.get('schema')}. Sensitivity of C: "
            f"{_fmt(c.get('sensitivity'))} ({c.get('sensitivity_basis')}). z = {_fmt(c.get('noise_multiplier'))}; "
            "the noise std above is that of the innovations z_t. Accounting: "
            f"{c.get('accounting')}.", ""]


def _seeded_warning(p: dict[str, Any], dp: bool) -> list[str]:
    if p.get("rng_mode") != "seeded":
        return []
    if not dp:
        return [f"> **Seeded research mode** ({p.get('rng')}): all randomness is reproducible from the "
                "seed.", ""]
    return [
        f"> **Seeded research mode** ({p.get('rng')}): all randomness, including the privacy noise, "
        "is reproducible from the seed. The guarantee below does NOT hold against anyone who knows "
        "the seed. Use `seed = -1` for a deployment.",
        "",
    ]


def _claim(p: dict[str, Any], dp: bool) -> list[str]:
    if not dp:
        return ["No differential privacy: updates were clipped but not noised. No ε is claimed.", ""]
    return [
        "| | |",
        "|---|---|",
        f"| Privacy mode | {p['mode']} |",
        f"| Unit of privacy | {p['unit']} |",
        f"| Adjacency | {p['adjacency']} |",
        f"| Mechanism | {p['mechanism']} |",
        f"| Clip norm C | {_fmt(p['clip_norm'])} |",
        f"| Noise multiplier σ | {_fmt(p['noise_multiplier'])}"
        f"{' (calibrated to the target)' if p.get('calibrated') else ''} |",
        f"| Noise std per coordinate | {_fmt(p['noise_std'])} |",
        f"| Sampling | {p['sampling']} |",
        f"| Aggregation denominator | {_fmt(p['denominator'])} (fixed) |",
        f"| Rounds accounted | {p['rounds']} |",
        f"| Accountant | {p['accountant']} |",
        f"| **ε** | **{_fmt(p['epsilon'], '.6g')}** |",
        *([f"| ε against participating clients | {_fmt(p['participants_epsilon'], '.6g')} (each round "
           "unamplified: a client in a round sees its roster) |"] if "participants_epsilon" in p else []),
        *([f"| Colluding clients assumed | {_colluders(p)} (ε is computed for at most that many clients "
           "colluding with the server; their noise is not counted) |"] if _colluders(p) is not None else []),
        f"| δ | {_fmt(p['delta'], 'g')} |",
        f"| Budget | {p.get('budget') or 'none'} |",
        f"| Randomness | {p['rng']} |",
        "",
    ]


def _adaptive_clip_section(a: dict[str, Any], rounds: list[dict[str, Any]]) -> list[str]:
    """The clip norm round by round and how the count query is paid for (Andrew et al. 2021)."""
    lines = [
        "## Adaptive clipping",
        "",
        f"The clip norm followed a private estimate of the {_fmt(a.get('target_quantile'))}-quantile of "
        f"the update norms, from C = {_fmt(a.get('initial_clip_norm'))}, moved by "
        f"exp(−{_fmt(a.get('learning_rate'))}·(b̃ − γ)) after each round, b̃ the released fraction of "
        f"unclipped updates. The count carried N(0, {_fmt(a.get('count_noise_std'))}²) noise and the "
        f"update's noise multiplier was raised to z_Δ = {_fmt(a.get('update_noise_multiplier'))}, so "
        "the pair is one Gaussian of the multiplier in the claim above (Theorem 1): the same ε as a "
        "fixed clip norm.",
        "",
        "| round | clip norm C | released unclipped fraction |",
        "|---|---|---|",
    ]
    lines += [f"| {r['round']} | {_fmt(r.get('clip_norm'))} | {_fmt(r.get('clip_unclipped_fraction'), '.3f')} |"
              for r in rounds if "clip_norm" in r]
    return lines + [""]


def _dpsgd_section(d: dict[str, Any]) -> list[str]:
    return [
        "## Sample-level DP-SGD (per client)",
        "",
        f"Unit: {d['unit']}. ε = {_fmt(d.get('epsilon'), '.6g')} at δ = {_fmt(d.get('delta'), 'g')} "
        f"(σ = {_fmt(d.get('noise_multiplier'))}, per-example clip {_fmt(d.get('max_grad_norm'))}, "
        f"accountant {d.get('accountant')}). {d.get('note', '')}",
        *(["", f"Basis: {d['epsilon_basis']}."] if d.get("epsilon_basis") else []),
        "",
        *[f"- {label}: {d[key]}" for label, key in (("Adjacency", "adjacency"), ("Mechanism", "mechanism"),
                                                    ("Sampling", "sampling")) if d.get(key)],
        "",
    ]




def _colluders(p: dict[str, Any]) -> int | None:
    """The colluder count the distributed ε was computed under (None outside distributed mode)."""
    aud = (p.get("distributed") or {}).get("audiences") or {}
    if "server" in aud:
        return int(aud["server"].get("colluders", 0))
    return None


def _covers(covers: Sequence[str], colluders: int | None = None) -> list[str]:
    lines = list(covers)
    return [line.replace("{colluders}", str(colluders or 0)) for line in lines] + [
        "- Assumes: the listed clip norm is enforced (the server re-clips in central mode; under secure "
        "aggregation each honest client clips its own update), the "
        "accountant's composition theorem, and a secure source of randomness (see Randomness).",
        "",
    ]


def _accounting_section(p: dict[str, Any]) -> list[str]:
    """Participation counts and the write-ahead journal, when the run has them."""
    out: list[str] = []
    part = p.get("participation")
    if part:
        state = "published" if part.get("published") else "not published"
        out.append(f"- Participation counts ({state}; not covered by ε): {part.get('note', '')}.")
    wal = p.get("write_ahead")
    if wal:
        line = (f"- Charged before release: every round's charge was on disk (`{wal.get('journal')}`) "
                "before anything of the round could be seen.")
        if wal.get("unfinished_rounds"):
            line += (f" Rounds {wal['unfinished_rounds']} were charged and cut off (a crash); their "
                     "charges stay in ε, and their repetitions were charged again.")
        out.append(line)
    return out + ([""] if out else [])


def _run_section(results: dict[str, Any]) -> list[str]:
    cfg, rounds = results["config"], results["rounds"]
    last = rounds[-1] if rounds else {}
    return [
        "## Run",
        "",
        f"- Status: {results.get('status')}" + (f" ({results['stopped']})" if results.get("stopped") else ""),
        f"- Rounds completed: {len(rounds)} of {cfg.get('num-server-rounds')}",
        *[f"- Resumed after round {r.get('after_round')} ({r.get('at')}); the accounting inputs were "
          "checked against the checkpoint" for r in results.get("resumed") or []],
        f"- Clients (population): {results.get('population')}",
        f"- Final test accuracy: {_fmt(last.get('test_accuracy'))}",
        f"- Dataset / model: {cfg.get('dataset')} / {cfg.get('model')}",
        "",
    ]


def _distributed_section(p: dict[str, Any]) -> list[str]:
    """The noise the survivors really left, round by round, and ε for each audience."""
    d = p["distributed"]
    surv = d.get("survivors_per_round") or []
    stds = d.get("noise_std_of_sum_per_round") or []
    lines = [
        "## Distributed DP: the noise the survivors left, and who ε is against",
        "",
        f"Noise: {d.get('noise', '')} (σ = z·C = {_fmt(p.get('noise_std'))}, t = {d.get('threshold')}). "
        "Per completed round (each is charged the run's one worst-case release: the largest roster "
        "and the supremum of the slack over survivor counts, so ε does not depend on the counts):",
        "",
        "| round | survivors in the sum | noise std of the sum |",
        "|---|---|---|",
    ]
    if isinstance(surv, str):  # counts kept private (the public's amplified ε needs them secret)
        lines += [f"| {i} | private | private |" for i in d.get("completed_rounds") or []]
        lines += ["", f"Counts: {d.get('counts', '')}; aborted rounds: private.", ""]
    else:
        numbers = d.get("completed_rounds") or list(range(1, len(surv) + 1))
        for i, n, std in zip(numbers, surv, stds, strict=False):
            lines.append(f"| {i} | {n} | {_fmt(std)} |")
        aborted = d.get("aborted_rounds") or []
        lines += ["", f"Aborted rounds (nothing released, no ε spent, model unchanged): "
                  f"{aborted or 'none'}.", ""]
    aud = d.get("audiences")
    delta = _fmt(p.get("delta"), "g")
    if aud:
        srv, obs = aud["server"], aud["observers"]
        part = aud.get("participants") or {}
        lines += [
            f"| audience | ε at δ = {delta} | amplification | threat model |",
            "|---|---|---|---|",
            f"| the server | {_fmt(srv['epsilon'], '.6g')} | none | {srv['threat_model']} |",
            f"| participating clients | {_fmt(part.get('epsilon'), '.6g')} | "
            f"{'in the rounds it is not in' if part.get('amplification') else 'none'} | "
            f"{part.get('threat_model', '')} |",
            f"| the public (takes part in no round) | {_fmt(obs['epsilon'], '.6g')} | {obs['sampling']} | "
            f"{obs['threat_model']} |",
            "",
            f"Accountant: {srv['accountant']}; RDP cross-check for the server: "
            f"{_fmt(srv['rdp_cross_check'], '.6g')}; accounting slack H' = {_fmt(aud['slack'], '.3g')} "
            f"(included). Noise sampler: {aud['noise_sampler']}. Colluding clients assumed: "
            f"{srv['colluders']}.",
            "",
        ]
    lines += [
        f"| reference | ε at δ = {delta} |",
        "|---|---|",
        f"| central DP, Gaussian with σ = z·C on the sum, no sampling | "
        f"{_fmt(d.get('central_dp_epsilon_same_sigma'), '.6g')} |",
        f"| central DP, same σ and the sampling that ran | "
        f"{_fmt(d.get('central_dp_epsilon_same_sigma_and_sampling'), '.6g')} |",
        "",
        f"Reference: {d.get('central_dp_reference', '')}.",
        "",
    ]
    return lines
