"""Helpers of the kvtier.sglang tests: a host KV pool of SGLang's shape,
a driver that calls the backend as SGLang's cache controller does, the
pages' deterministic bytes, and a real ``kvtier serve`` with a small store
stack. SGLang itself is not installed: tests/standin provides the
interface module (conftest puts it on sys.path)."""

import hashlib
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading

import torch

from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE, HiCacheStorageConfig

from kvtier._serveproc import wait_listening

# Test geometry: 16 tokens a page, 8 layers, bfloat16; every payload kind
# of a page is 64 KiB (MHA: 4 heads x 64 dims a kind, k and v; MLA: one
# latent of 256 dims).
PAGE_TOKENS = 16
LAYERS = 8
HEADS = 4
HEAD_DIM = 64
MLA_DIM = 256
KIND_BYTES = 64 << 10


class HostPool:
    """SGLang's host KV pool, as MHATokenToKVPoolHost and
    MLATokenToKVPoolHost shape it (pool_host/mha.py, mla.py): token slots
    of page_size tokens, the layouts layer_first and page_first, and the
    methods storage backends call (get_page_buffer_meta, get_data_page,
    get_dummy_flat_data_page, set_from_flat_data_page). Written from the
    shapes, not SGLang's code."""

    def __init__(self, mla, layout, pages, page_size=PAGE_TOKENS, layer_num=LAYERS, dtype=torch.bfloat16,
                 head_num=HEADS, head_dim=HEAD_DIM, kv_dim=MLA_DIM):
        if layout not in ("layer_first", "page_first"):
            raise ValueError("layout %r" % layout)
        self.mla, self.layout, self.page_size, self.layer_num, self.dtype = mla, layout, page_size, layer_num, dtype
        self.size = pages * page_size
        self.head_num, self.head_dim, self.kv_cache_dim = head_num, head_dim, kv_dim
        isz = torch.tensor([], dtype=dtype).element_size()
        if mla:
            self.token_bytes = kv_dim * isz  # one layer's bytes of a token
            dims = (layer_num, self.size, 1, kv_dim) if layout == "layer_first" else (self.size, layer_num, 1, kv_dim)
            self.size_per_token = self.token_bytes * layer_num
        else:
            self.token_bytes = head_num * head_dim * isz
            dims = ((2, layer_num, self.size, head_num, head_dim) if layout == "layer_first"
                    else (2, self.size, layer_num, head_num, head_dim))
            self.size_per_token = self.token_bytes * layer_num * 2
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self.page_shape = (dims[0], layer_num, page_size) + dims[3:] if not mla and layout == "layer_first" else None

    def _page(self, index):
        if self.mla:
            return self.kv_buffer[:, index:index + self.page_size] if self.layout == "layer_first" \
                else self.kv_buffer[index:index + self.page_size]
        return self.kv_buffer[:, :, index:index + self.page_size] if self.layout == "layer_first" \
            else self.kv_buffer[:, index:index + self.page_size]

    def get_data_page(self, index, flat=True):
        p = self._page(int(index))
        return p.flatten() if flat else p

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.size_per_token * self.page_size // self.kv_buffer.element_size(), dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        p = self._page(int(index))
        p.copy_(data_page.reshape(p.shape))

    def get_page_buffer_meta(self, indices):
        """Per page: MHA page_first [k, v]; MHA layer_first [k, v] per layer;
        MLA page_first [kv]; MLA layer_first [kv] per layer. Addresses and
        byte counts."""
        assert len(indices) % self.page_size == 0
        idx = indices.tolist()
        base = self.kv_buffer.data_ptr()
        ptrs = []
        if self.mla:
            if self.layout == "layer_first":
                for i in range(0, len(idx), self.page_size):
                    for layer in range(self.layer_num):
                        ptrs.append(base + (layer * self.size + idx[i]) * self.token_bytes)
                n = self.page_size * self.token_bytes
            else:
                for i in range(0, len(idx), self.page_size):
                    ptrs.append(base + idx[i] * self.layer_num * self.token_bytes)
                n = self.page_size * self.layer_num * self.token_bytes
            return ptrs, [n] * len(ptrs)
        v_off = self.layer_num * self.size * self.token_bytes
        if self.layout == "layer_first":
            for i in range(0, len(idx), self.page_size):
                for layer in range(self.layer_num):
                    k = base + (layer * self.size + idx[i]) * self.token_bytes
                    ptrs += [k, k + v_off]
            n = self.page_size * self.token_bytes
        else:
            for i in range(0, len(idx), self.page_size):
                k = base + idx[i] * self.layer_num * self.token_bytes
                ptrs += [k, k + v_off]
            n = self.page_size * self.layer_num * self.token_bytes
        return ptrs, [n] * len(ptrs)

    def page_bytes(self):
        return self.size_per_token * self.page_size

    def slot_indices(self, slots):
        """host_indices of pages in the given page slots (page_size each)."""
        return torch.cat([torch.arange(s * self.page_size, (s + 1) * self.page_size, dtype=torch.int64)
                          for s in slots]) if slots else torch.zeros(0, dtype=torch.int64)

    def fill(self, slot, data):
        """Writes a page's flat bytes (uint8) into slot."""
        self.set_from_flat_data_page(slot * self.page_size, data.view(self.dtype))

    def read(self, slot):
        return self.get_data_page(slot * self.page_size, flat=True).contiguous().view(torch.uint8)


def page_data(key, salt, nbytes):
    """The deterministic bytes of a page (uint8), from its key and a salt
    (the TP rank for MHA: ranks hold different heads)."""
    seed = int.from_bytes(hashlib.sha256(("%s|%s" % (key, salt)).encode()).digest()[:8], "little")
    g = torch.Generator().manual_seed(seed & ((1 << 63) - 1))
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def chain_keys(prefix, n):
    """n chained page keys, hex, as SGLang's page hashes are."""
    out, h = [], hashlib.sha256(prefix.encode()).hexdigest()
    for i in range(n):
        h = hashlib.sha256(("%s%d" % (h, i)).encode()).hexdigest()
        out.append(h)
    return out


def storage_config(tp_rank=0, tp_size=1, mla=False, layout="page_first", extra=None, model="test/model",
                   pp_rank=0, pp_size=1, cp_rank=0, cp_size=1, metrics=True):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size,
                                attn_cp_rank=cp_rank, attn_cp_size=cp_size, is_mla_model=mla,
                                enable_storage_metrics=metrics, is_page_first_layout=layout == "page_first",
                                model_name=model, extra_config=dict(extra or {}))


class Controller:
    """Calls a backend as SGLang's HiCacheController does
    (managers/cache_controller.py): a prefetch thread that counts the
    stored prefix with batch_exists in batches of STORAGE_BATCH_SIZE, then
    reads it batch by batch (batch_get_v1 with "interface_v1", else
    batch_get into get_dummy_flat_data_page() and set_from_flat_data_page),
    stopping at the first page that failed; and a backup thread that writes
    batch by batch (batch_set_v1 and all(), else batch_set of
    get_data_page()) and stops at the first failed batch. Any exception
    escaping the backend kills the thread, as in SGLang: the test checks
    none does."""

    def __init__(self, backend, pool, v1):
        self.backend, self.pool, self.v1 = backend, pool, v1
        self.prefetch_q, self.backup_q = queue.Queue(), queue.Queue()
        self.errors = []
        self.threads = [threading.Thread(target=self._loop, args=(self.prefetch_q, self._prefetch), daemon=True),
                        threading.Thread(target=self._loop, args=(self.backup_q, self._backup), daemon=True)]
        for t in self.threads:
            t.start()

    def _loop(self, q, fn):
        while True:
            op = q.get()
            if op is None:
                return
            try:
                op["result"] = fn(op)
            except BaseException as e:  # SGLang's thread would die here
                self.errors.append(repr(e))
                op["result"] = None
                op["done"].set()
                return
            op["done"].set()

    def _prefetch(self, op):
        keys, ps = op["keys"], self.pool.page_size
        hit = []
        for i in range(0, len(keys), STORAGE_BATCH_SIZE):
            b = keys[i:i + STORAGE_BATCH_SIZE]
            n = self.backend.batch_exists(b)
            hit += b[:n]
            if n < len(b):
                break
        done = 0
        hi = op["host_indices"]
        for i in range(0, len(hit), STORAGE_BATCH_SIZE):
            b = hit[i:i + STORAGE_BATCH_SIZE]
            idx = hi[i * ps:(i + len(b)) * ps]
            if self.v1:
                res = self.backend.batch_get_v1(b, idx)
                inc = 0
                for j in range(len(b)):
                    if not res[j]:
                        break
                    inc += 1
            else:
                pages = self.backend.batch_get(b, [self.pool.get_dummy_flat_data_page() for _ in b])
                inc = 0
                for j in range(len(b)):
                    if pages[j] is None:
                        break
                    self.pool.set_from_flat_data_page(idx[j * ps], pages[j])
                    inc += 1
            done += inc
            if inc < len(b):
                break
        return done

    def _backup(self, op):
        keys, ps, hi = op["keys"], self.pool.page_size, op["host_indices"]
        done = 0
        for i in range(0, len(keys), STORAGE_BATCH_SIZE):
            b = keys[i:i + STORAGE_BATCH_SIZE]
            idx = hi[i * ps:(i + len(b)) * ps]
            if self.v1:
                ok = all(self.backend.batch_set_v1(b, idx))
            else:
                ok = self.backend.batch_set(b, [self.pool.get_data_page(idx[j * ps]) for j in range(len(b))])
            if not ok:
                break
            done += len(b)
        return done

    def prefetch(self, keys, host_indices):
        op = {"keys": keys, "host_indices": host_indices, "done": threading.Event()}
        self.prefetch_q.put(op)
        return op

    def backup(self, keys, host_indices):
        op = {"keys": keys, "host_indices": host_indices, "done": threading.Event()}
        self.backup_q.put(op)
        return op

    @staticmethod
    def wait(op, timeout=60):
        if not op["done"].wait(timeout):
            raise TimeoutError("storage operation did not finish in %d s" % timeout)
        return op["result"]

    def stop(self):
        self.prefetch_q.put(None)
        self.backup_q.put(None)
        for t in self.threads:
            t.join(10)


class HugeMount:
    """A hugetlbfs mount of its own with pages reserved for it, when the
    machine allows (root, a kernel that grants 2 MiB pages and the
    mount); else path is None and why says so. A slab on the shm fallback
    pays, on these VMs, a slow first write through every fresh mapping
    of each 4 KiB page (0.4-0.9 GB/s); on hugetlbfs it does not. close()
    unmounts and gives the pages back."""

    def __init__(self, mib):
        self.path, self.why, self._added = None, "", 0
        nr = "/proc/sys/vm/nr_hugepages"
        want = (mib + 1) // 2 + 2
        try:
            before = int(open(nr).read())
            with open(nr, "w") as f:
                f.write(str(before + want))
            self._added = int(open(nr).read()) - before
            if self._added < want:
                self.close()
                self.why = "the kernel granted %d of %d 2 MiB pages" % (max(self._added, 0), want)
                return
            d = tempfile.mkdtemp(prefix="kvt-huge-")
            r = subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "none", d], capture_output=True, text=True)
            if r.returncode != 0:
                os.rmdir(d)
                self.close()
                self.why = "mount hugetlbfs: %s" % r.stderr.strip()
                return
            self.path = d
        except OSError as e:
            self.close()
            self.why = "reserve hugepages: %s" % e

    def close(self):
        if self.path:
            subprocess.run(["umount", self.path], capture_output=True)
            os.rmdir(self.path)
            self.path = None
        if self._added > 0:
            nr = "/proc/sys/vm/nr_hugepages"
            try:
                with open(nr, "w") as f:
                    f.write(str(max(int(open(nr).read()) - self._added, 0)))
            except OSError:
                pass
            self._added = 0


def store_yaml(kinds, slab_pages, l3_mib=64, mount=None, kind_bytes=KIND_BYTES, page_tokens=PAGE_TOKENS):
    payloads = "\n".join("    - {name: %s, page_bytes: %dKiB}" % (k, kind_bytes >> 10) for k in kinds)
    slab = slab_pages * len(kinds) * kind_bytes
    # NB: without a mount of the test's own, a directory that is never
    # hugetlbfs: the shm fallback on every host. With the default
    # /dev/hugepages mounted, the slab would round up to 2 MiB pages and
    # hold more than the tests count on (test_slab_full).
    mnt = ", mount: %s" % (mount if mount else '"{{DIR}}/not-hugetlbfs"')
    return """version: 1
model:
  page_tokens: %d
  payloads:
%s
tiers:
  - name: l2
    role: slab
    use: l2hugetlb
    config: {size: %d, fallback: shm, name: "kvtier-sglt-{{DIRHASH}}", stale: remove, populate: true%s}
  - name: l3
    role: store
    use: l3disk
    index: {use: lmdb, config: {dir: "{{DIR}}/store/index"}}
    config:
      disks: [{dir: "{{DIR}}/store/l3", budget: %dMiB}]
policy:
  evictor: lru
write_policy: write_through
ranks: {world_size: 1, rank: 0}
""" % (page_tokens, payloads, slab, mnt, l3_mib)


class Serve:
    """A real ``kvtier serve --doors store`` with a small store stack."""

    def __init__(self, binary, data, yaml_text, lease="2s"):
        self.binary, self.data = binary, data
        os.makedirs(data, exist_ok=True)
        self.cfg = os.path.join(data, "..", os.path.basename(data) + "-store.yaml")
        with open(self.cfg, "w") as f:
            f.write(yaml_text)
        self.sockdir = tempfile.mkdtemp(prefix="kvsg-")
        self.sock = os.path.join(self.sockdir, "s.sock")
        self.lease = lease
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([self.binary, "serve", "--doors", "store", "--store-config", self.cfg,
                                      "--data-dir", self.data, "--socket", self.sock, "--log-level", "info",
                                      "--store-lease", self.lease],
                                     stdout=subprocess.DEVNULL, stderr=self._log())
        wait_listening(self.proc, self.sock, 30)

    def _log(self):
        """serve's log, appended across restarts (DATA-serve.log)."""
        return open(self.data.rstrip("/") + "-serve.log", "ab")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.sockdir, ignore_errors=True)
