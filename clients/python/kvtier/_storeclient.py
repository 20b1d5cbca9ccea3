"""What the page-store clients (kvtier.sglang, kvtier.vllm,
kvtier.vllm_tier) share: the default socket, serve's slab files mapped
into the client's process, and batches of copies that also take each
page's CRC32C (the native library, kvtier.native)."""

import ctypes
import logging
import mmap
import os
import queue
import threading

import grpc
import numpy as np

from kvtier import native as _native

logger = logging.getLogger(__name__)


def default_socket():
    """$KVTIER_SOCKET, else serve's default: $XDG_STATE_HOME/kvtier/kvtier.sock
    (~/.local/state when unset)."""
    s = os.environ.get("KVTIER_SOCKET")
    if s:
        return s
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "kvtier", "kvtier.sock")


def whole_number(v):
    """v as an int >= 0 when it holds one (an int, a string of one, a float
    with no fraction; not a bool: JSON and a command line give any of
    them), else None: a setting's parse, the caller names the key."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        return int(v) if v.is_integer() and v >= 0 else None
    if isinstance(v, (int, str)):
        try:
            n = int(v)
        except ValueError:
            return None
        return n if n >= 0 else None
    return None


def dtype_name(dt):
    """A torch dtype's name as the namespace carries it ("bfloat16")."""
    return str(dt).replace("torch.", "")


def address(buf):
    """The address of a writable, C-contiguous buffer. The export taken to
    read it ends here, so the owner may release or close it later."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class MappedSlab:
    """serve's slab files (a RegisterReply's slab geometry), mapped shared
    read-write, with each file's base address and size.

    Copies through it hold it (acquire/release); a new registration
    retires the old one, which is unmapped when the last copy through it
    ends. ``error`` is the exception class raised for a geometry that
    does not match the files. Subclasses build a view of each map in
    ``wrap`` (a torch tensor, say); ``tensors`` holds them."""

    def __init__(self, geometry, error=ValueError):
        self.maps, self.addrs, self.sizes, self.tensors = [], [], [], []
        self._mu = threading.Lock()
        self._users, self._retired = 0, False
        try:
            for i, f in enumerate(geometry.files):
                if f.id != i or f.size <= 0:
                    raise error("slab file %d: id %d, size %d" % (i, f.id, f.size))
                fd = os.open(f.path, os.O_RDWR)
                try:
                    have = os.fstat(fd).st_size
                    if have < f.size:
                        raise error("slab file %s has %d bytes, serve says %d" % (f.path, have, f.size))
                    # NB: no MAP_POPULATE: CPython's mmap() holds the GIL
                    # while the kernel fills the page tables, and that
                    # stalled every thread of the engine (its forward, its
                    # scheduler) for 0.4 s a GiB. A strided numpy read of
                    # a byte a page fills them with the GIL released.
                    m = mmap.mmap(fd, f.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    os.close(fd)
                self.maps.append(m)
                np.frombuffer(m, dtype=np.uint8)[::mmap.PAGESIZE].max()
                self.addrs.append(address(m))
                self.sizes.append(f.size)
                self.tensors.append(self.wrap(m))
        except Exception:
            self.close()
            raise

    def wrap(self, m):
        """A view of map m kept in ``tensors`` (none by default)."""
        return None

    def check(self, span, length):
        """The span's address; ValueError unless it lies in a slab file and
        has the kind's length."""
        if span.slab >= len(self.addrs):
            raise ValueError("span names slab file %d of %d" % (span.slab, len(self.addrs)))
        if span.length != length or span.offset + span.length > self.sizes[span.slab]:
            raise ValueError("span [%d, +%d) of slab file %d (%d bytes), want %d bytes" % (
                span.offset, span.length, span.slab, self.sizes[span.slab], length))
        return self.addrs[span.slab] + span.offset

    def acquire(self):
        """Holds the maps for a copy; False when they are already unmapped
        (retired, and the last copy ended)."""
        with self._mu:
            if self._retired and self._users == 0:
                return False
            self._users += 1
            return True

    def release(self):
        with self._mu:
            self._users -= 1
            done = self._retired and self._users == 0
        if done:
            self.close()

    def retire(self):
        """Unmaps once no copy runs through it (serve restarted: the old
        slab's memory is freed only when every map of it is gone)."""
        with self._mu:
            self._retired = True
            done = self._users == 0
        if done:
            self.close()

    def close(self):
        self.tensors, self.addrs = [], []
        for m in self.maps:
            try:
                m.close()
            except BufferError:
                pass  # a tensor over it still lives; the map goes with it
        self.maps = []


def native_sums():
    """Whether the clients carry each page's CRC32C (docs/store-api.md,
    "Checksums carried by the client"): the native library is loaded
    (kvtier.native) and $KVTIER_CLIENT_SUMS is not "0". Without it the
    clients copy with memmove and serve takes and checks the sums."""
    return _native.available() and os.environ.get("KVTIER_CLIENT_SUMS", "1") != "0"


class PieceBatch:
    """A batch of copies (dst address, src address, bytes, group) run by
    one native call (the GIL released throughout) that also returns the
    CRC32C of each group's source bytes, taken in the order the pieces
    were added: a page kind's pieces go in the order of its slab bytes."""

    def __init__(self):
        self.dst, self.src, self.len, self.group = [], [], [], []

    def __len__(self):
        return len(self.dst)

    def add(self, dst, src, n, group):
        self.dst.append(dst)
        self.src.append(src)
        self.len.append(n)
        self.group.append(group)

    def truncate(self, n):
        """Drops the pieces added after the first n (a page that failed
        half way through adding its own)."""
        del self.dst[n:], self.src[n:], self.len[n:], self.group[n:]

    def run(self, ngroups):
        """Copies every piece; the list of ngroups CRC32C (0 for a group
        with no piece)."""
        return _native.copy_pages(self.dst, self.src, self.len, self.group, ngroups)


def check_hit(page, nkinds):
    """ValueError unless a BatchGet HIT carries one span per payload kind
    and no sums or one per kind (docs/store-api.md)."""
    if len(page.spans) != nkinds:
        raise ValueError("%d spans, want %d" % (len(page.spans), nkinds))
    if len(page.sums) not in (0, nkinds):
        raise ValueError("%d sums, want %d" % (len(page.sums), nkinds))


# Releases sent without waiting go through one worker thread a process:
# gRPC's future() starts a thread of its own for a call while none of the
# channel's is running (1-1.5 ms a call here, once a get).
_REL_PENDING_MAX = 4096
_rel_lock = threading.Lock()
_rel_queue = None
_rel_pid = None


def _release_worker(q):
    while True:
        stub, request, timeout = q.get()
        try:
            stub.Release(request, timeout=timeout)
        except (grpc.RpcError, ValueError) as e:  # serve away, or the channel closed meanwhile
            logger.info("kvtier: release of lease %d: %s (its pins end with the lease)", request.lease, e)
        except Exception as e:  # noqa: BLE001 (the worker outlives any one release)
            logger.warning("kvtier: release of lease %d: %r (its pins end with the lease)", request.lease, e)


def release_async(stub, request, timeout):
    """Sends a ReleaseRequest without waiting for its reply: for a get
    whose every hit the client checked itself, nothing in the reply is
    needed. The process's release thread sends it (in order, each with
    its own timeout); a failure is logged, and the pins then end with
    the lease, as they do for a release dropped because 4096 are
    already waiting (serve not answering)."""
    global _rel_queue, _rel_pid
    with _rel_lock:
        if _rel_queue is None or _rel_pid != os.getpid():  # first use, or a forked child
            _rel_queue, _rel_pid = queue.Queue(maxsize=_REL_PENDING_MAX), os.getpid()
            threading.Thread(target=_release_worker, args=(_rel_queue,), name="kvtier-release", daemon=True).start()
        q = _rel_queue
    try:
        q.put_nowait((stub, request, timeout))
    except queue.Full:
        logger.info("kvtier: release of lease %d dropped: %d releases waiting (its pins end with the lease)",
                    request.lease, _REL_PENDING_MAX)
