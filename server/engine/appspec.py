"""What ``pyproject.toml`` says about a Flower app, and run-config overrides resolved exactly as
``flwr run`` resolves them (Flower's own parser and fuser)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.engine._flwr_private import (
    flatten_dict,
    fuse_dicts,
    get_metadata_from_config,
    get_project_config,
    parse_config_args,
)

__all__ = ["AppSpec", "absolute_output_dir", "app_root", "config_string", "load_app_spec", "parse_overrides",
           "resolve_run_config"]

# the folder above the ``server`` package: the fedprivacy app's own pyproject.toml (a clone or an
# editable install)
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppSpec:
    """What ``pyproject.toml`` says about the Flower app in ``app_dir``."""

    app_dir: Path
    server_app_ref: str
    client_app_ref: str
    default_config: dict[str, Any]
    fab_id: str
    fab_version: str


def app_root(app_dir: str | Path = ".") -> Path:
    """The folder of the Flower app to run: ``app_dir`` when its ``pyproject.toml`` names a Flower app;
    for the default ``"."`` without one, the installed fedprivacy app (so ``fedprivacy simulate`` and
    :func:`server.engine.run.run_inprocess` work from any folder).

    Raises:
        FileNotFoundError: neither holds a ``pyproject.toml`` with ``[tool.flwr.app]``.
    """
    path = Path(app_dir).absolute()
    if _is_flower_app(path):
        return path
    if str(app_dir) == "." and _is_flower_app(_PACKAGE_ROOT):
        return _PACKAGE_ROOT
    raise FileNotFoundError(f"app-dir: {path} holds no pyproject.toml with a [tool.flwr.app] table; "
                            "pass --app-dir (app_dir=) the folder of the fedprivacy app")


def _is_flower_app(path: Path) -> bool:
    import tomllib

    try:
        with (path / "pyproject.toml").open("rb") as fh:
            return "app" in tomllib.load(fh).get("tool", {}).get("flwr", {})
    except (OSError, tomllib.TOMLDecodeError):
        return False


def load_app_spec(app_dir: str | Path = ".") -> AppSpec:
    """Read components and ``[tool.flwr.app.config]`` defaults as Flower does (from :func:`app_root`)."""
    path = app_root(app_dir)
    config = get_project_config(path)
    app = config["tool"]["flwr"]["app"]
    fab_id, fab_version = get_metadata_from_config(config)
    return AppSpec(
        app_dir=path,
        server_app_ref=app["components"]["serverapp"],
        client_app_ref=app["components"]["clientapp"],
        default_config=flatten_dict(app.get("config", {})),
        fab_id=fab_id,
        fab_version=fab_version,
    )


def parse_overrides(run_config: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Turn a ``flwr run --run-config`` string (or a mapping) into flat overrides."""
    if run_config is None:
        return {}
    if isinstance(run_config, str):
        import click

        _check_pairs(run_config)
        try:
            return dict(parse_config_args([run_config]) if run_config.strip() else {})
        except click.ClickException as exc:
            raise ValueError(f"run_config {run_config!r}: {exc.format_message()}") from exc
    if isinstance(run_config, Mapping):
        return flatten_dict(dict(run_config))
    raise TypeError(f"run_config must be a mapping or a string, got {type(run_config).__name__}")


def _check_pairs(run_config: str) -> None:
    """Refuse what Flower's parser silently drops: a word without ``=``, or ``key=`` without a value."""
    import shlex

    try:
        words = shlex.split(run_config)
    except ValueError as exc:
        raise ValueError(f"run_config {run_config!r}: {exc}") from exc
    seen: set[str] = set()
    for word in words:
        key, eq, value = word.partition("=")
        if eq and key in seen:
            raise ValueError(f"run_config: key {key!r} is given twice; give each key once")
        seen.add(key)
        if eq and key.strip() and not value and f"{key}=''" not in run_config \
                and f'{key}=""' not in run_config:
            raise ValueError(f"run_config: key {key!r} has an empty value ({word!r}); give it a value, "
                             f"e.g. {key}=1.0, or write an empty string as {key}=\"\"")
        if not eq or not key.strip():
            raise ValueError(
                f"run_config: {word!r} is not a key=value pair (e.g. 'num-server-rounds=5 "
                "privacy=\"central\"'; an empty string is written key=\"\")")


def resolve_run_config(
    run_config: Mapping[str, Any] | str | None, *, app_dir: str | Path = "."
) -> dict[str, Any]:
    """Defaults from ``pyproject.toml`` fused with overrides, exactly as ``flwr run``.

    Raises:
        ValueError: an override names a key that has no default (Flower's message).
    """
    spec = load_app_spec(app_dir)
    return fuse_dicts(spec.default_config, parse_overrides(run_config))


def absolute_output_dir(overrides: dict[str, Any], fused: Mapping[str, Any]) -> dict[str, Any]:
    """Pin a relative ``output-dir`` to this working directory (Flower's processes may run elsewhere)."""
    out = fused.get("output-dir")
    if isinstance(out, str) and out and not Path(out).is_absolute():
        return {**overrides, "output-dir": str(Path(out).absolute())}
    return overrides


def config_string(overrides: Mapping[str, Any]) -> str:
    """Render overrides in ``flwr run --run-config`` syntax (TOML values)."""
    parts = []
    for key, value in overrides.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, int | float):
            text = repr(value)
        else:
            text = str(value)
            if '"' in text and "'" in text:
                raise ValueError(f"run-config value of {key!r} cannot hold both quote kinds")
            text = f"'{text}'" if '"' in text else f'"{text}"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


def simulation_node_config(run_config: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """The ``client-*`` node config a local-simulation launcher gives its clients: derived from the run
    the user asked for (:meth:`fedprivacy.fl.client_policy.ClientPolicy.for_simulation`), since the
    user runs both sides. Raises ValueError for a bad run config."""
    from fedprivacy.config import RunConfig
    from fedprivacy.fl.byzantine import NODE_KEY
    from fedprivacy.fl.client_policy import ClientPolicy

    cfg = RunConfig.from_mapping(run_config)
    out = ClientPolicy.for_simulation(cfg, colluders=cfg.secagg_colluders,
                                      schedule=cfg.secagg_schedule).to_node_config()
    if cfg.byzantine:  # the simulation's Byzantine clients read their own spec from their node config
        out[NODE_KEY] = cfg.byzantine
    return out
