"""kvtier._storeclient's release_async: the releases a get sends without
waiting go through one worker thread a process, in order, each with its
own timeout; a failing one is logged and never raised; when too many wait
(serve not answering) the next is dropped, not queued without bound."""

import logging
import threading
import time

import grpc
import pytest

from kvtier import _storeclient as sc


class Req:
    def __init__(self, lease):
        self.lease = lease


class Stub:
    """A fault-injection stand-in for the generated StoreStub: its
    Release records the calls (thread, lease, timeout), raises for the
    leases in fail, and blocks while gate is cleared."""

    class _Err(grpc.RpcError):
        pass

    def __init__(self, fail=(), gate=None):
        self.calls, self.fail, self.gate = [], set(fail), gate
        self.done = threading.Event()
        self.want = 0

    def Release(self, req, timeout=None):  # noqa: N802 (gRPC's name)
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append((threading.current_thread().name, req.lease, timeout))
        if len(self.calls) >= self.want:
            self.done.set()
        if req.lease in self.fail:
            raise Stub._Err("injected")
        if req.lease < 0:
            raise RuntimeError("unexpected")


@pytest.fixture(autouse=True)
def fresh_worker(monkeypatch):
    # A worker and queue of this test's own (a fresh "process" to release_async).
    monkeypatch.setattr(sc, "_rel_queue", None)
    monkeypatch.setattr(sc, "_rel_pid", None)


def test_one_thread_in_order(caplog):
    st = Stub(fail={3})
    st.want = 6
    before = threading.active_count()
    with caplog.at_level(logging.INFO, logger=sc.logger.name):
        for lease in (1, 2, 3, -4, 5, 6):
            sc.release_async(st, Req(lease), 2.5)
        assert st.done.wait(10), st.calls
    assert [c[1] for c in st.calls] == [1, 2, 3, -4, 5, 6]
    assert {c[0] for c in st.calls} == {"kvtier-release"}
    assert {c[2] for c in st.calls} == {2.5}
    assert threading.active_count() <= before + 1
    text = caplog.text
    assert "release of lease 3" in text and "release of lease -4" in text


def test_full_queue_drops(caplog, monkeypatch):
    monkeypatch.setattr(sc, "_REL_PENDING_MAX", 4)
    gate = threading.Event()
    st = Stub(gate=gate)
    with caplog.at_level(logging.INFO, logger=sc.logger.name):
        # One in the worker's hands (blocked on the gate), 4 waiting, the rest dropped.
        sc.release_async(st, Req(0), 1)
        for _ in range(100):
            if sc._rel_queue.qsize() == 0:
                break
            time.sleep(0.01)
        for lease in range(1, 8):
            sc.release_async(st, Req(lease), 1)
        st.want = 5
        gate.set()
        assert st.done.wait(10), st.calls
    assert [c[1] for c in st.calls] == [0, 1, 2, 3, 4]
    assert "release of lease 5 dropped" in caplog.text and "release of lease 7 dropped" in caplog.text
