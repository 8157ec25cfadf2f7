"""A JupyterLab server for tests, started as ``make lab`` starts it (the same contents manager),
on loopback, on a free port, with a token of our own; its settings and runtime files and the
results of this run live in a temporary folder; the server and its kernels are killed at the
end whatever happens."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

# What `make lab` passes (tests/test_lab_pairing.py checks the Makefile passes it too).
CONTENTS_MANAGER = "--ServerApp.contents_manager_class=decodelab.lab.PairedContentsManager"
START_TIMEOUT_S = 120


@dataclass(frozen=True)
class Lab:
    port: int
    token: str

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        """One call of the server's REST API (``/api/...``), JSON in and out."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url(f"api/{path}"), data=data, method=method,
            headers={"Authorization": f"token {self.token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            return json.loads(resp.read() or b"{}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _up(port: int, token: str) -> bool:
    url = f"http://127.0.0.1:{port}/api/status?token={token}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200 and "started" in json.loads(resp.read())
    except OSError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    """End the server and its kernels (one process group, started by this test)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)


@contextmanager
def running_lab(root: Path, tmp: Path):
    """JupyterLab serving ``root``; yields a :class:`Lab`."""
    token = secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp / "config"),
               JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
               DECODELAB_LOCAL=str(tmp / "local"), DECODELAB_FIGURES=str(tmp / "figures"))
    log = tmp / "lab.log"
    for _ in range(3):  # a port taken between probe and bind, or a slow first start: retry
        port = _free_port()
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={root}", CONTENTS_MANAGER,
               "--LabApp.expose_app_in_browser=True",
               "--LabApp.news_url=None", "--LabApp.extension_manager=readonly",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        proc = subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _up(port, token):
                try:
                    yield Lab(port, token)
                finally:
                    _stop(proc)
                return
            time.sleep(0.5)
        _stop(proc)
    pytest.fail(f"JupyterLab did not start: {log.read_text()[-3000:]}")
