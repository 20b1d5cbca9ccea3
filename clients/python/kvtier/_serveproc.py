"""Running ``kvtier serve`` as a subprocess: what the package's benchmarks
and the tests share (not part of the client API)."""

import os
import shutil
import socket
import subprocess
import time


def kvtier_binary(arg, tmp, repo):
    """The kvtier binary: arg when given, else ``kvtier`` on PATH, else one
    built from the checkout at repo into tmp."""
    if arg:
        return arg
    found = shutil.which("kvtier")
    if found:
        return found
    out = os.path.join(tmp, "kvtier")
    subprocess.run(["go", "build", "-o", out, "./cmd/kvtier"], cwd=repo, check=True)
    return out


def wait_listening(proc, sock, timeout=60.0, log=None):
    """Returns once serve (process proc) accepts connections on the unix
    socket sock. RuntimeError when it exits first (naming its log, when
    given) or does not listen within timeout seconds; the caller stops it."""
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError("kvtier serve exited with %d before it listened%s" % (
                proc.returncode, " (log %s)" % log if log else ""))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock)
            return
        except OSError:
            if time.time() > deadline:
                raise RuntimeError("kvtier serve did not listen within %g s" % timeout) from None
            time.sleep(0.02)
        finally:
            s.close()
