"""Stand-in vllm.v1.kv_offload.tiering.spec (tests only): the tiering spec
that vLLM's OffloadingSpecFactory builds from kv_connector_extra_config
("spec_name": "TieringOffloadingSpec"); its secondary_tiers entries are
built by SecondaryTierFactory over the CPU primary's memoryview. Only
what a test of an out-of-tree spec subclass needs; no vLLM code."""

from vllm.v1.kv_offload.base import OffloadingSpec
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory


class TieringOffloadingSpec(OffloadingSpec):
    def secondary_tiers(self, primary_kv_view):
        """The tiers of extra_config["secondary_tiers"], as get_manager builds them."""
        configs = self.extra_config.get("secondary_tiers", [])
        if not isinstance(configs, list):
            raise ValueError("secondary_tiers must be a list of tier configurations")
        return [SecondaryTierFactory.create_secondary_tier(c, primary_kv_view, self) for c in configs]
