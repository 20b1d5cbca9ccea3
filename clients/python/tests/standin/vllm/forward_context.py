"""Stand-in vllm.forward_context (tests only)."""

from dataclasses import dataclass, field


@dataclass
class ForwardContext:
    """What a forward pass carries; the connector reads nothing of it."""
    no_compile_layers: dict = field(default_factory=dict)
    attn_metadata: object = None
