"""How fast this host compiles: one line to set a build's times against another host's.

    python tools/compile_probe.py

A docs build is mostly XLA compilation, whose speed depends on the host's CPUs (and, for the matmul autotuning, on
the GPU). This compiles two fixed programs once each in a fresh process and prints the host's CPU, its core count
and load, and the seconds of each compilation: the gradient of blockwise attention at B=4, T=S=1024, N=8, H=64,
float32, for the default device (a GPU autotunes its matmuls) and for the CPU.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def compile_seconds(device) -> float:
    """Seconds to lower and compile the gradient of blockwise attention (B=4, T=S=1024, N=8, H=64, float32, causal,
    tiles of 128) for ``device``."""
    import jax
    import jax.numpy as jnp

    from attention_tutorial.kernels.blockwise import blockwise_attention

    def loss(q, k, v):
        return jnp.sum(blockwise_attention(q, k, v, is_causal=True, block_q=128, block_k=128))

    x = jax.device_put(jnp.ones((4, 1024, 8, 64), jnp.float32), device)
    t0 = time.perf_counter()
    jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x).compile()
    return time.perf_counter() - t0


def main() -> int:
    import jax

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    default = jax.devices()[0]
    parts = [f"host: {cpu_model()}, {os.cpu_count()} cores, load {load}"]
    if default.platform != "cpu":
        parts.append(f"compile on {default.device_kind}: {compile_seconds(default):.2f} s")
    parts.append(f"compile for the CPU: {compile_seconds(jax.devices('cpu')[0]):.2f} s")
    print("; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
