"""Stand-in vllm.v1.attention.backend (tests only): the two names the
connector base module imports."""


class AttentionBackend:
    """An attention implementation's class (its KV shape and stride order)."""


class AttentionMetadata:
    """Per-forward attention metadata."""
