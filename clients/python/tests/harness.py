"""The real operator binary in standalone mode with local built-in proxies,
each connecting out from its own loopback address, and a test site on
loopback that tells the proxies apart by peer address.

The operator leaves its local proxies running when it exits (by design: a
restart re-adopts them), so :meth:`Operator.stop` kills them by the pid
each instance recorded — checked against the recorded start time, so a
reused pid is never signalled.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

CRAWLER_TOKEN = "crawler-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
#: Every proxy's outgoing address comes from here (six addresses: .1-.6).
OUTGOING_NETWORK = "127.0.1.0/29"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, timeout: float, check: Callable[[], Any]) -> Any:
    """Polls ``check`` until it returns something truthy; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@dataclass
class ProxySpec:
    name: str
    attributes: Dict[str, str]


@dataclass
class PoolSpec:
    """A ProxyPool of local proxies; ``spec`` holds extra spec lines (YAML, two-space indented)."""

    name: str
    replicas: int
    spec: str = ""


class Operator:
    """``egress-proxies-operator standalone`` in ``root``."""

    def __init__(
        self,
        binary: str,
        root: Path,
        proxies: List[ProxySpec],
        *,
        max_leases_per_proxy: int = 2,
        cooldown: str = "1s",
        pools: List[PoolSpec] = [],
    ):
        self.binary = binary
        self.root = root
        self.proxies = proxies
        self.pools = pools
        self.api_port = free_port()
        self.health_port = free_port()
        self.url = f"http://127.0.0.1:{self.api_port}"
        self.max_leases_per_proxy = max_leases_per_proxy
        self.cooldown = cooldown
        self.process: Optional[subprocess.Popen[bytes]] = None
        self.log = root / "operator.log"

    def start(self, timeout: float = 90.0) -> None:
        (self.root / "proxies").mkdir(parents=True, exist_ok=True)
        (self.root / "providers.yaml").write_text(
            "providers:\n"
            "  - name: local\n"
            "    type: local\n"
            "    local:\n"
            "      implementation: builtin\n"
            "      destinations: {allow: [127.0.0.0/8]}\n"
            f"      outgoingAddresses: [{OUTGOING_NETWORK}]\n"
        )
        (self.root / "standalone.yaml").write_text(
            "providersConfig: providers.yaml\n"
            "manifests: proxies\n"
            "stateDir: state\n"
            f"healthProbeBindAddress: 127.0.0.1:{self.health_port}\n"
            f"discoveryBindAddress: 127.0.0.1:{self.api_port}\n"
            'metricsBindAddress: "0"\n'
            f"leaseCooldown: {self.cooldown}\n"
            "maxLeaseTtl: 10m\n"
            f"maxLeasesPerProxy: {self.max_leases_per_proxy}\n"
            "manifestPollInterval: 200ms\n"
        )
        for proxy in self.proxies:
            attributes = ", ".join(f"{k}: {v}" for k, v in proxy.attributes.items())
            (self.root / "proxies" / f"{proxy.name}.yaml").write_text(
                "apiVersion: crawl.example.com/v1alpha1\n"
                "kind: Proxy\n"
                f"metadata: {{name: {proxy.name}, namespace: crawl}}\n"
                "spec:\n"
                "  mode: Managed\n"
                "  provider: local\n"
                f"  attributes: {{{attributes}}}\n"
                f"  healthCheck: {{url: 'http://127.0.0.1:{self.health_port}/healthz', interval: 1s}}\n"
            )
        for pool in self.pools:
            (self.root / "proxies" / f"pool-{pool.name}.yaml").write_text(
                "apiVersion: crawl.example.com/v1alpha1\n"
                "kind: ProxyPool\n"
                f"metadata: {{name: {pool.name}, namespace: crawl}}\n"
                "spec:\n"
                f"  replicas: {pool.replicas}\n"
                f"{pool.spec}"
                "  template:\n"
                "    spec:\n"
                "      mode: Managed\n"
                "      provider: local\n"
                f"      healthCheck: {{url: 'http://127.0.0.1:{self.health_port}/healthz', interval: 1s}}\n"
            )
        env = dict(os.environ, DISCOVERY_TOKEN=CRAWLER_TOKEN, DISCOVERY_READ_TOKEN=READ_TOKEN)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "standalone", "--log-format", "text", "--config", str(self.root / "standalone.yaml")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        wanted = {p.name for p in self.proxies}

        def ready() -> bool:
            assert self.process is not None and self.process.poll() is None, self.log_tail()
            try:
                listed = self.get("/v1/proxies")
            except (OSError, urllib.error.URLError):
                return False
            ready = {p["name"] for p in listed if p["phase"] == "Ready" and p.get("healthy")}
            members = [n for n in ready if any(n.startswith(f"{pool.name}-") for pool in self.pools)]
            return ready - set(members) == wanted and len(members) == sum(p.replicas for p in self.pools)

        try:
            wait_for("every proxy Ready and healthy", timeout, ready)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.log_tail()}") from None

    def get(self, path: str, token: str = READ_TOKEN) -> Any:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    def active_leases(self) -> Dict[str, int]:
        return {p["name"]: p["activeLeases"] for p in self.get("/v1/proxies")}

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "operator log ends:\n" + "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return "no operator log"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        reap_local_proxies(self.root / "state")


def _start_ticks(pid: int) -> Optional[Tuple[str, int]]:
    """A process's state and start time (``/proc/<pid>/stat`` fields 3 and 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(") ", 1)[1].split()
    return rest[0], int(rest[19])


def reap_local_proxies(state: Path, timeout: float = 10.0) -> None:
    """SIGKILLs the process group of every local proxy recorded under
    ``state`` that is still the recorded process, and waits until each is gone."""
    alive: List[int] = []
    for record in state.glob("local/*/instances/*/process.json"):
        identity = json.loads(record.read_text())
        now = _start_ticks(identity["pid"])
        if now is None or now[0] == "Z" or now[1] != identity["startTicks"]:
            continue
        try:
            os.killpg(identity["pid"], signal.SIGKILL)
        except ProcessLookupError:
            continue
        alive.append(identity["pid"])

    def gone() -> bool:
        return all((_start_ticks(pid) or ("Z", 0))[0] == "Z" for pid in alive)

    wait_for("the local proxies to die", timeout, gone)


@dataclass
class Hit:
    peer: str
    path: str
    status: int


@dataclass
class Site:
    """A small site on a loopback address: ``/`` links to ``/page/1`` …
    ``/page/<pages>``; ``/whoami`` answers the peer address. With
    ``block_first_peer`` the first peer address that asks for a page is
    blocked from then on (403 "Access denied"). Every request is recorded."""

    host: str
    pages: int = 12
    block_first_peer: bool = False
    blocked: Set[str] = field(default_factory=set)
    hits: List[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: Optional[http.server.ThreadingHTTPServer] = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{self.host}:{self.server.server_address[1]}"

    def start(self) -> Site:
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                peer = self.client_address[0]
                with site.lock:
                    if site.block_first_peer and not site.blocked and self.path.startswith("/page/"):
                        site.blocked.add(peer)
                    status, body = site.answer(peer, self.path)
                    site.hits.append(Hit(peer, self.path, status))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def answer(self, peer: str, path: str) -> Tuple[int, str]:
        if peer in self.blocked:
            return 403, "<html><body>Access denied</body></html>"
        if path == "/whoami":
            return 200, peer
        if path == "/":
            links = "".join(f'<a href="/page/{i}">page {i}</a>\n' for i in range(1, self.pages + 1))
            return 200, f"<html><body>{links}</body></html>"
        if path.startswith("/page/"):
            return 200, f"<html><body><h1>{path[6:]}</h1></body></html>"
        return 404, "not found"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
