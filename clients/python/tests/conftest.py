"""Puts clients/python on sys.path, so the tests import the kvtier package
from this checkout without installing it, and builds kvtier once for the
tests that run ``kvtier serve``."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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
