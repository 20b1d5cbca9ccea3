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
