"""The "last executed" stamp a page ends with: the device, versions and date that produced its live outputs."""

from __future__ import annotations

import datetime as _dt

from ..env import environment


def _device(env: dict) -> str:
    if env.get("gpu"):
        return f"{env['gpu']} (driver {env['driver']})" if env.get("driver") else env["gpu"]
    backend = (env.get("backend") or "cpu").upper()
    return f"{backend} ({env['cpu']})" if env.get("cpu") else backend


def _when(executed) -> str:
    if isinstance(executed, int | float):
        executed = _dt.datetime.fromtimestamp(executed, _dt.UTC)
    if isinstance(executed, str):
        executed = _dt.datetime.fromisoformat(executed)
    if not isinstance(executed, _dt.datetime):
        raise ValueError(f"executed must be a datetime, a POSIX timestamp or an ISO string; got {executed!r}")
    if executed.tzinfo is not None:
        executed = executed.astimezone(_dt.UTC)
    return executed.strftime("%Y-%m-%d %H:%M UTC")


def last_executed(env: dict | None = None, *, executed=None, runtime_s: float | None = None) -> str:
    """One line naming when (``executed``; default ``env['created']``), on what and with which versions outputs came."""
    env = environment() if env is None else env
    when = _when(executed if executed is not None else env["created"])
    took = f" in {runtime_s:.0f} s" if runtime_s is not None else ""
    versions = [f"JAX {env['jax']}" + (f" (jaxlib {env['jaxlib']})" if env.get("jaxlib") else "")]
    versions += [
        f"{name} {env[key]}"
        for key, name in (("cudnn", "cuDNN"), ("transformer_engine", "TransformerEngine"), ("python", "Python"))
        if env.get(key)
    ]
    return f"Last executed {when}{took} on {_device(env)} with {', '.join(versions)}."
