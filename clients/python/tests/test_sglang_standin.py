"""The stand-in SGLang interface (tests/standin) against a table written
from the facts (../shared/engines/README.md; sgl-project/sglang
python/sglang/srt/mem_cache/hicache_storage.py at 001067ff), and
kvtier.sglang.KvtierStorage against the same table: every method SGLang
calls exists with SGLang's parameter names, and the class is concrete."""

import dataclasses
import inspect

import pytest

from sglang.srt.mem_cache import hicache_storage as hs

from kvtier.sglang import KvtierStorage

# method -> (parameters after self, with defaults; abstract?)
FACTS = {
    "get": (("key", None), ("target_location", None), ("target_sizes", None)), 
    "batch_get": (("keys", None), ("target_locations", None), ("target_sizes", None)),
    "set": (("key", None), ("value", None), ("target_location", None), ("target_sizes", None)),
    "batch_set": (("keys", None), ("values", None), ("target_locations", None), ("target_sizes", None)),
    "exists": (("key", None),),
    "batch_exists": (("keys", None), ("extra_info", None)),
    "batch_get_v1": (("keys", None), ("host_indices", None), ("extra_info", None)),
    "batch_set_v1": (("keys", None), ("host_indices", None), ("extra_info", None)),
    "batch_exists_v2": (("keys", None), ("pool_transfers", None), ("extra_info", None)),
    "batch_get_v2": (("transfers", None), ("extra_info", None)),
    "batch_set_v2": (("transfers", None), ("extra_info", None)),
    "register_mem_pool_host": (("mem_pool_host", None),),
    "register_mem_host_pool_v2": (("host_pool", None), ("host_pool_name", None)),
    "clear": (),
    "get_stats": (),
}
ABSTRACT = {"get", "batch_get", "set", "batch_set", "exists"}
REQUIRED = {"key", "keys", "host_indices", "transfers", "mem_pool_host", "host_pool", "host_pool_name"}

CONFIG_FIELDS = [("tp_rank", None), ("tp_size", None), ("pp_rank", None), ("pp_size", None),
                 ("attn_cp_rank", None), ("attn_cp_size", None), ("is_mla_model", None),
                 ("enable_storage_metrics", None), ("is_page_first_layout", None), ("model_name", None),
                 ("dp_rank", 0), ("dp_size", 1), ("tp_lcm_size", None), ("should_split_heads", False),
                 ("extra_config", None)]


def params(fn):
    out = []
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        out.append((p.name, p.default is not inspect.Parameter.empty))
    return out


@pytest.mark.parametrize("name", sorted(FACTS))
def test_standin_methods(name):
    fn = getattr(hs.HiCacheStorage, name)
    want = [(n, n not in REQUIRED) for n, _ in FACTS[name]]
    assert params(fn) == want, "stand-in %s%s against the facts %s" % (name, params(fn), want)
    for n, p in inspect.signature(fn).parameters.items():
        if n != "self" and n not in REQUIRED:
            assert p.default is None, "%s.%s defaults to %r" % (name, n, p.default)


def test_standin_abstract_and_constants():
    assert hs.HiCacheStorage.__abstractmethods__ == frozenset(ABSTRACT)
    assert hs.STORAGE_BATCH_SIZE == 128
    assert [p.value for p in hs.PoolHitPolicy] == ["all_pages", "trailing_pages"]
    got = [(f.name, None if f.default is dataclasses.MISSING else f.default) for f in dataclasses.fields(hs.HiCacheStorageConfig)]
    assert got == CONFIG_FIELDS
    assert [f.name for f in dataclasses.fields(hs.PoolTransfer)] == [
        "name", "host_indices", "device_indices", "keys", "hit_policy", "nodes_to_load", "indices_from_pool"]
    assert [f.name for f in dataclasses.fields(hs.PoolTransferResult)][:2] == ["kv_hit_pages", "extra_pool_hit_pages"]


@pytest.mark.parametrize("name", sorted(FACTS))
def test_backend_signatures(name):
    """KvtierStorage keeps SGLang's parameter names (SGLang passes some by
    position, some by name) and overrides every method SGLang calls."""
    assert issubclass(KvtierStorage, hs.HiCacheStorage)
    assert not getattr(KvtierStorage, "__abstractmethods__", None)
    got = [n for n, _ in params(getattr(KvtierStorage, name))]
    assert got == [n for n, _ in FACTS[name]], "KvtierStorage.%s(%s)" % (name, ", ".join(got))
    if name not in ("register_mem_host_pool_v2",):
        assert getattr(KvtierStorage, name) is not getattr(hs.HiCacheStorage, name), "%s not overridden" % name


def test_factory_construction():
    """SGLang's factory builds backend_class(storage_config, kwargs)."""
    cfg = hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="m", extra_config={"backend_name": "kvtier", "module_path": "kvtier.sglang",
                                                                "class_name": "KvtierStorage", "socket": "/nonexistent.sock"})
    b = KvtierStorage(cfg, {})
    try:
        assert b.socket == "/nonexistent.sock"
        assert b.batch_exists(["a"]) == 0  # no host pool yet: a miss, no error
        assert b.get_stats() is None  # metrics off
    finally:
        b.close()


@pytest.mark.parametrize("value,want", [(None, True), (True, True), (False, False), ("false", False), ("1", True), (0, False)])
def test_prefetch_setting(value, want, monkeypatch):
    """extra_config "prefetch" (default true) rides on batch_exists, the
    prefetch path's first call; exists(key) never prefetches."""
    extra = {"socket": "/nonexistent.sock"}
    if value is not None:
        extra["prefetch"] = value
    cfg = hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="m", extra_config=extra)
    b = KvtierStorage(cfg, {})
    try:
        assert b.prefetch is want
        sent = []

        def fake_exists(keys, prefetch=False):
            sent.append(prefetch)
            return len(keys)

        monkeypatch.setattr(b, "_exists_count", fake_exists)
        assert b.batch_exists(["a", "b"]) == 2
        assert b.exists("a")
        assert sent == [want, False]
    finally:
        b.close()


def test_prefetch_setting_refused():
    cfg = hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="m", extra_config={"socket": "/nonexistent.sock", "prefetch": "maybe"})
    with pytest.raises(Exception, match="prefetch"):
        KvtierStorage(cfg, {})
