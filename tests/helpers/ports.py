"""Ports: every launch and every in-process process group takes its own free one, below the
kernel's ephemeral range (megatron/runtime/ports.py says why)."""
from megatron.runtime.ports import launch_port


def free_port() -> int:
    """A TCP port on localhost that nothing holds right now, drawn at random below the ephemeral
    range (:func:`megatron.runtime.ports.launch_port`), where no outgoing connection can take it
    before the launch binds it."""
    return launch_port()
