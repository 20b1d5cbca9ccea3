"""Puts clients/python on sys.path, so the tests import the kvtier package
from this checkout without installing it, and builds kvtier once for the
tests that run ``kvtier serve``; puts tests/standin (a stand-in SGLang
interface) on sys.path. Builds kvtier's native copy + CRC-32C library
(kvtier/_native/kvtiercopy.c) once per session into the same temp dir and
exports KVTIER_NATIVE_LIB, so kvtier.native loads this checkout's build;
the ``native_lib`` fixture skips (with the reason) where there is no cc."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A stand-in for SGLang's hicache_storage interface (SGLang is not
# installed here); kvtier.sglang imports it as sglang.srt.mem_cache.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin"))


@pytest.fixture(scope="session")
def _session_dir():
    """The session's temp dir for what the tests build (kvtier, the
    native library)."""
    d = tempfile.mkdtemp(prefix="kvtier-py-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def kvtier_bin(_session_dir):
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not on PATH: cannot build kvtier serve for the client tests")
    out = os.path.join(_session_dir, "kvtier")
    subprocess.run([go, "build", "-o", out, "./cmd/kvtier"], cwd=REPO, check=True)
    yield out


NATIVE_SRC = os.path.join(REPO, "clients", "python", "kvtier", "_native", "kvtiercopy.c")


@pytest.fixture(scope="session", autouse=True)
def _native_build(_session_dir):
    """Builds libkvtiercopy.so with cc once per session and exports
    KVTIER_NATIVE_LIB before any test runs (autouse: every test that
    reaches kvtier.native loads this build, not a stale one). Yields the
    library's path, or None where there is no cc. A failed build fails
    the tests that use ``native_lib``, not the others."""
    cc = shutil.which("cc")
    if cc is None:
        yield None
        return
    out = os.path.join(_session_dir, "libkvtiercopy.so")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-o", out, NATIVE_SRC],
                       capture_output=True, text=True)
    if r.returncode != 0:
        yield RuntimeError("cc %s failed (exit %d): %s" % (NATIVE_SRC, r.returncode, r.stderr))
        return
    old = os.environ.get("KVTIER_NATIVE_LIB")
    os.environ["KVTIER_NATIVE_LIB"] = out
    yield out
    if old is None:
        os.environ.pop("KVTIER_NATIVE_LIB", None)
    else:
        os.environ["KVTIER_NATIVE_LIB"] = old


@pytest.fixture(scope="session")
def native_lib(_native_build):
    """The path of this session's libkvtiercopy.so; skips without cc."""
    if _native_build is None:
        pytest.skip("cc is not on PATH: cannot build kvtier's native library (kvtiercopy.c)")
    if isinstance(_native_build, Exception):
        raise _native_build
    return _native_build


@pytest.fixture(autouse=True)
def _drop_tmp_path(request):
    """Removes a test's tmp_path once the test and its other fixtures are
    done (this fixture is set up first, so it is torn down last): the
    tests start ``kvtier serve`` with data dirs of hundreds of MiB (L3
    slabs are written out in full), and pytest would keep them all until
    the session ends, then keep the last three sessions' on disk."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is not None:
        shutil.rmtree(str(tmp), ignore_errors=True)
