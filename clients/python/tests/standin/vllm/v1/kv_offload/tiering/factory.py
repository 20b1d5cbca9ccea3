"""Stand-in vllm.v1.kv_offload.tiering.factory (tests only): tiers
registered by type with a module path and a class name, built from a
secondary_tiers entry of the tiering spec's extra_config: "type" picks
the tier, every other key is passed to its constructor beside
offloading_spec, primary_kv_view and tier_type (the 041410b9 form). No
vLLM code."""

import importlib

from vllm.v1.kv_offload.tiering.base import SecondaryTierManager


class SecondaryTierFactory:
    _registry = {}

    @classmethod
    def register_tier(cls, tier_type: str, module_path: str, class_name: str) -> None:
        if tier_type in cls._registry:
            raise ValueError("Tier %r is already registered." % tier_type)

        def loader():
            return getattr(importlib.import_module(module_path), class_name)

        cls._registry[tier_type] = loader

    @classmethod
    def create_secondary_tier(cls, tier_config: dict, primary_kv_view: memoryview,
                              offloading_spec) -> SecondaryTierManager:
        config = dict(tier_config)
        tier_type = config.pop("type", None)
        if not tier_type:
            raise ValueError("Secondary tier configuration must include 'type'")
        if tier_type not in cls._registry:
            raise ValueError("Unknown secondary tier type: %r. Supported types: %s" % (tier_type, list(cls._registry)))
        tier_cls = cls._registry[tier_type]()
        if not issubclass(tier_cls, SecondaryTierManager):
            raise TypeError("%r is not a SecondaryTierManager" % tier_cls)
        return tier_cls(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view, tier_type=tier_type, **config)
