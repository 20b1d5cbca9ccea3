"""Puts clients/python on sys.path, so the tests import the kvtier package
from this checkout without installing it, and builds kvtier once for the
tests that run ``kvtier serve``; puts tests/standin (a stand-in SGLang
interface) on sys.path."""

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
def kvtier_bin():
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not on PATH: cannot build kvtier serve for the client tests")
    d = tempfile.mkdtemp(prefix="kvtier-py-")
    out = os.path.join(d, "kvtier")
    subprocess.run([go, "build", "-o", out, "./cmd/kvtier"], cwd=REPO, check=True)
    yield out
    shutil.rmtree(d, ignore_errors=True)


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
