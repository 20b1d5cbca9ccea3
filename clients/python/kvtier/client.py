"""Session client of ``kvtier serve``'s engine API (kvtier.engine.v1; the
call sequence is docs/engine-api.md).

One :class:`Client` per engine rank, owned by that rank's scheduler; it
makes one :meth:`Client.step` call per scheduler step. It watches the
server's ``boot_id``: when serve restarted, or is unreachable, the step
returns a :class:`StepResult` with ``restarted`` or ``unavailable`` set and
no results — everything is a miss — and the client registers again on a
later call once serve answers.
"""

import grpc

from kvtier.engine.v1 import engine_pb2 as pb
from kvtier.engine.v1 import engine_pb2_grpc as pbg

HASH_SIZE = 32

NAMESPACE_FIELDS = ("model", "kv_layout", "dtype", "page_tokens", "page_bytes", "shard", "salt")


def pack_hashes(hashes):
    """Returns the 32-byte page hashes as one bytes value (pages x 32)."""
    out = bytearray()
    for i, h in enumerate(hashes):
        if len(h) != HASH_SIZE:
            raise ValueError("hash %d has %d bytes, want %d" % (i, len(h), HASH_SIZE))
        out += h
    return bytes(out)


def unpack_hashes(b):
    """Splits pages x 32 bytes into a list of hashes."""
    if len(b) % HASH_SIZE:
        raise ValueError("%d bytes of hashes is not a multiple of %d" % (len(b), HASH_SIZE))
    return [bytes(b[i:i + HASH_SIZE]) for i in range(0, len(b), HASH_SIZE)]


def make_namespace(ns):
    """Builds the Namespace message from a dict, refusing unknown fields,
    a missing model and page geometry that is not positive integers."""
    if not isinstance(ns, dict):
        raise TypeError("namespace: a dict, got %s" % type(ns).__name__)
    unknown = sorted(set(ns) - set(NAMESPACE_FIELDS))
    if unknown:
        raise ValueError("namespace: unknown field %r (fields: %s)" % (unknown[0], ", ".join(NAMESPACE_FIELDS)))
    if not ns.get("model"):
        raise ValueError("namespace.model: required")
    pt = ns.get("page_tokens")
    if not isinstance(pt, int) or pt <= 0:
        raise ValueError("namespace.page_tokens: a positive integer, got %r" % (pt,))
    pbs = ns.get("page_bytes")
    if not isinstance(pbs, (list, tuple)) or not pbs or not all(isinstance(x, int) and x > 0 for x in pbs):
        raise ValueError("namespace.page_bytes: a non-empty list of positive integers, got %r" % (pbs,))
    return pb.Namespace(model=ns["model"], kv_layout=ns.get("kv_layout", ""), dtype=ns.get("dtype", ""),
                        page_tokens=pt, page_bytes=list(pbs), shard=ns.get("shard", 0), salt=ns.get("salt", ""))


class StepResult:
    """One step's outcome: the reply, or why there is none."""

    def __init__(self, reply=None, restarted=False, unavailable=False, error=None):
        self.reply = reply
        self.restarted = restarted
        self.unavailable = unavailable
        self.error = error

    @property
    def ok(self):
        return self.reply is not None


def health(socket_path, timeout=10.0):
    """Asks serve for its health (boot id, ranks, page geometry)."""
    with grpc.insecure_channel("unix:" + socket_path) as ch:
        return pbg.EngineStub(ch).Health(pb.HealthRequest(), timeout=timeout, wait_for_ready=True)


class Client:
    """A session of one engine rank with kvtier serve."""

    def __init__(self, socket_path, engine_id, rank, world_size, namespace, timeout=10.0):
        if not (0 <= rank < world_size):
            raise ValueError("rank %d of world size %d" % (rank, world_size))
        self.namespace = make_namespace(namespace)
        self.socket_path = socket_path
        self.engine_id, self.rank, self.world_size = engine_id, rank, world_size
        self.timeout = timeout
        self._channel = grpc.insecure_channel("unix:" + socket_path,
                                              options=[("grpc.max_receive_message_length", 256 << 20),
                                                       ("grpc.max_send_message_length", 256 << 20),
                                                       # serve restarting: reconnect within a second
                                                       ("grpc.initial_reconnect_backoff_ms", 100),
                                                       ("grpc.min_reconnect_backoff_ms", 100),
                                                       ("grpc.max_reconnect_backoff_ms", 1000)])
        self._stub = pbg.EngineStub(self._channel)
        self.info = None
        self._step = 0
        self._lost = True
        self.register(wait=True)

    def register(self, wait=False):
        """Opens a session; returns True when serve answered."""
        try:
            self.info = self._stub.Register(pb.RegisterRequest(
                engine_id=self.engine_id, rank=self.rank, world_size=self.world_size,
                namespace=self.namespace, protocol_versions=[1]), timeout=self.timeout, wait_for_ready=wait)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._lost = True
                return False
            raise
        self._step, self._lost = 0, False
        return True

    @property
    def boot_id(self):
        return self.info.boot_id if self.info else ""

    def step(self, completions=(), lookups=(), stores=(), finished=(), aborted=(), frontier=b""):
        """Sends one scheduler step. lookups and stores are (req_id,
        [hashes]) pairs, finished and aborted request ids, completions
        (plan, ok) pairs or (plan, ok, sums) triples: sums, for a
        TO_SLAB plan that ran whole, the CRC-32C of each item's slab bytes
        after the copy in item order (kvtier.checksum.plan_sums), or None
        (not given; the tiers compute their own). With the engine as the group transport
        (``info.group_transport == "engine"``), frontier is the reduction
        of the contributions the ranks' last replies carried
        (kvtier.group.reduce_contributions; none on a session's first
        step). Returns a StepResult."""
        if self._lost:
            if self.register():
                return StepResult(restarted=True)
            return StepResult(unavailable=True)
        self._step += 1
        q = pb.StepRequest(session=self.info.session, boot_id=self.info.boot_id, step=self._step, frontier=frontier)
        for c in completions:
            plan, ok = c[0], bool(c[1])
            sums = c[2] if len(c) > 2 else None
            if ok and sums:
                q.completions.add(plan=plan, ok=True, sums=sums)
            else:
                q.completions.add(plan=plan, ok=ok)
        for rid, hs in lookups:
            q.lookups.add(req_id=rid, pages=len(hs), hashes=pack_hashes(hs))
        for rid, hs in stores:
            q.stores.add(req_id=rid, pages=len(hs), hashes=pack_hashes(hs))
        for rid in finished:
            q.finished.add(req_id=rid)
        for rid in aborted:
            q.aborted.add(req_id=rid)
        try:
            reply = self._stub.Step(q, timeout=self.timeout)
        except grpc.RpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self._lost = True
                return StepResult(unavailable=True, error=e.details())
            raise
        whole = reply.errors and reply.errors[0].item in ("session", "boot_id")
        if reply.boot_id != self.info.boot_id or whole:
            self._lost = True
            if self.register():
                return StepResult(restarted=True)
            return StepResult(unavailable=True)
        return StepResult(reply=reply)

    def ping(self):
        self._stub.Ping(pb.PingRequest(), timeout=self.timeout)

    def health(self):
        return self._stub.Health(pb.HealthRequest(), timeout=self.timeout)

    def close(self):
        """Ends the session (an already ended one is fine) and the channel."""
        try:
            if self.info is not None and not self._lost:
                self._stub.Close(pb.CloseRequest(session=self.info.session, boot_id=self.info.boot_id), timeout=self.timeout)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION):
                raise
        finally:
            self._channel.close()
