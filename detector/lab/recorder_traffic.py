"""Traffic through the recorded ingress-nginx controller, and the healthy background noise.

``Ingress`` routes requests to pods the way ingress-nginx's Lua balancer does (connect
refused -> next endpoint, no endpoints -> 503) and logs its ``upstreaminfo`` access lines and
error lines; ``web_noise`` and ``monitoring`` add workloads that never fail.
https://kubernetes.github.io/ingress-nginx/user-guide/nginx-configuration/log-format/
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from detector.lab import recorder as r
from detector.lab import wordings as w
from detector.lab.recorder import Pod, Recorder

INGRESS_IP = "10.0.3.10"
AGENTS = ("OpenAI/Python 1.99.9", "python-requests/2.32.3", "curl/8.5.0")
BROWSER = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/134.0"
REFUSED = "connect() failed (111: Connection refused) while connecting to upstream"
CLOSED = "upstream prematurely closed connection while reading response header from upstream"
TIMED_OUT = (
    "upstream timed out (110: Operation timed out) while reading response header from upstream"
)
_WEB = ("checkout", "catalog", "search", "cart", "accounts", "payments", "reviews", "shipping")
_PAGES = (
    ("/", 200, 5321),
    ("/static/app.3f9c2b.js", 200, 48211),
    ("/api/session", 200, 312),
    ("/static/app.3f9c2b.js", 304, 0),
    ("/favicon.ico", 404, 153),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A backend's answer to one request: status, body bytes, seconds, nginx error if any."""

    status: int
    body: int
    seconds: float
    error: str = ""


Serve = Callable[[Pod, float, str], Outcome]


@dataclass(slots=True)
class Ingress:
    """The ingress-nginx controller pod; routes requests the way its Lua balancer does."""

    rec: Recorder
    pod: Pod
    conn: int = 184_000
    warned: dict[str, float] = field(default_factory=dict)
    who: tuple[str, str] | None = None  # (client address, user agent) of a retrying client
    length: int | None = None  # the next line's $request_length (None: drawn)

    def access(self, t: float, host: str, request: str, up: w.Upstream, out: Outcome) -> None:
        """Log one access line (stdout) and, on an upstream failure, its error line (stderr)."""
        rng = self.rec.rng
        client, agent = self.who or self._someone(request)
        post = request.startswith("POST")
        length = self.length or (rng.randrange(600, 9000) if post else rng.randrange(80, 400))
        line = w.ingress_access(
            self.rec.start + t,
            client,
            request,
            out.status,
            out.body,
            agent,
            length,
            out.seconds,
            up,
            self.rec.hex(32),
        )
        self.rec.log(self.pod, t, line, "stdout", "lb-access.jsonl")
        if out.error:
            self.conn += rng.randrange(1, 90)
            url = f"http://{up.addr.split(', ')[-1]}{request.split()[1]}"
            err = w.nginx_error(
                self.rec.start + t, self.conn, out.error, client, host, request, url
            )
            self.rec.log(self.pod, t + 1e-4, err, "stderr", "lb-access.jsonl")

    def route(
        self, t: float, pods: Sequence[Pod], upstream: str, host: str, request: str, serve: Serve
    ) -> Outcome:
        """Send one request to a random endpoint of ``pods``; log and return what it got."""
        eps = [p for p in pods if p.in_endpoints(t)]
        if not eps:  # no endpoints: ingress-nginx answers 503 itself
            self._no_endpoints(t, pods[0])
            out = Outcome(503, 190, 0.0)
            self.access(t, host, request, w.Upstream(upstream), out)
            return out
        pod = self.rec.rng.choice(eps)
        tried: list[tuple[str, str]] = []
        if pod.dead_since(t) is not None:  # connect() refused; nginx tries the next endpoint
            tried.append((pod.addr, "502"))
            alive = [p for p in eps if p.serving(t)]
            if not alive:
                out = Outcome(502, 150, 0.001, REFUSED)
                self.access(t, host, request, upstream_fields(upstream, tried, out), out)
                return out
            pod = self.rec.rng.choice(alive)
        out = serve(pod, t, request)
        tried.append((pod.addr, str(out.status) if out.status != 499 else "-"))
        self.access(t, host, request, upstream_fields(upstream, tried, out), out)
        return out

    def client(
        self, t: float, pods: Sequence[Pod], upstream: str, host: str, request: str, serve: Serve
    ) -> None:
        """Route one client request; like the OpenAI and httpx-retry clients, retry a 5xx twice."""
        self.who = self._someone(request)  # the retries come from the same client
        for attempt in range(3):
            if self.route(t, pods, upstream, host, request, serve).status < 500:
                break
            t += self.rec.rng.uniform(0.5, 1.0) * 2**attempt
        self.who = None

    def _someone(self, request: str) -> tuple[str, str]:
        """Return a random client address and user agent (an API client for a POST)."""
        rng = self.rec.rng
        agent = rng.choice(AGENTS) if request.startswith("POST") else BROWSER
        return f"203.0.113.{rng.randrange(2, 250)}", agent

    def cut(self, t: float, pod: Pod, upstream: str, host: str, request: str, n: int) -> None:
        """Log ``n`` requests queued in ``pod`` when its process died at ``t``: 502, closed."""
        for i in range(n):
            out = Outcome(502, 150, self.rec.rng.uniform(2.0, 40.0), CLOSED)
            fields = upstream_fields(upstream, [(pod.addr, "502")], out)
            self.access(t + 0.002 * (i + 1), host, request, fields, out)

    def _no_endpoints(self, t: float, pod: Pod) -> None:
        """Log the controller's warning about a Service without endpoints, every 10 s at most."""
        service = f"{pod.namespace}/{pod.app}"
        if t - self.warned.get(service, -99.0) >= 10.0:
            self.warned[service] = t
            msg = f'Service "{service}" does not have any active Endpoint.'
            line = w.klog_warning(self.rec.start + t, "controller.go:1214", msg)
            self.rec.log(self.pod, t - 1e-4, line, "stderr", "lb-access.jsonl")


def upstream_fields(name: str, tried: list[tuple[str, str]], out: Outcome) -> w.Upstream:
    """Build the upstream fields of an access line; earlier tries sent and got nothing."""
    lengths = ["0"] * (len(tried) - 1) + [str(out.body if out.status < 500 else 0)]
    times = ["0.000"] * (len(tried) - 1) + [f"{out.seconds:.3f}"]
    addrs = ", ".join(a for a, _ in tried)
    return w.Upstream(
        name, addrs, ", ".join(lengths), ", ".join(times), ", ".join(s for _, s in tried)
    )


def ingress(rec: Recorder) -> Ingress:
    """Create the ingress-nginx controller pod whose log is ``lb-access.jsonl``."""
    owner = f"ingress-nginx-controller-{rec.suffix(10)}"
    image = "registry.k8s.io/ingress-nginx/controller:v1.12.1"
    return Ingress(
        rec, rec.pod("ingress-nginx", owner, "cpu-node-01", INGRESS_IP, "controller", image)
    )


# --- healthy noise shared by the scenarios ----------------------------------------------


def web_noise(rec: Recorder, lb: Ingress, end: float, scale: int, rate: float) -> None:
    """Add healthy web Deployments behind the same ingress, and their own nginx lines."""
    names = ["web-frontend"] + [f"{_WEB[k % len(_WEB)]}-{k // len(_WEB)}" for k in range(scale - 1)]
    for k, name in enumerate(names):
        ips = [f"10.0.{20 + k % 200}.{11 + k // 200 * 2 + i}" for i in range(2)]
        pods = r.deployment(
            rec, "default", name, 2, "nginx", "docker.io/library/nginx:1.27.4", 80, ips
        )
        for i, pod in enumerate(pods):
            pod.node, pod.starts = f"cpu-node-0{1 + (k + i) % 3}", [-600.0]  # up for a while
        host = "www.example.com" if k == 0 else f"{name}.example.com"
        serve = _web_serve(rec)
        for t in r.arrivals(rec.rng, 0.0, end, lambda _t: rate):
            path = rec.rng.choice(_PAGES)[0]
            lb.route(t, pods, f"default-{name}-80", host, f"GET {path}", serve)


def _web_serve(rec: Recorder) -> Serve:
    """Return a web pod's handler: a page status and its nginx access line."""

    def serve(pod: Pod, t: float, request: str) -> Outcome:
        _, status, size = next((p for p in _PAGES if p[0] == request[4:]), _PAGES[0])
        if status == 200 and size > 1000 and rec.rng.random() < 0.3:
            status, size = 304, 0
        line = w.nginx_combined(rec.start + t, INGRESS_IP, request, status, size, BROWSER, "-")
        rec.log(pod, t - 0.001, line)
        return Outcome(status, size, rec.rng.uniform(0.001, 0.04))

    return serve


def monitoring(rec: Recorder, end: float) -> None:
    """Add a Prometheus server's periodic TSDB lines (a workload that never fails)."""
    owner, image = f"prometheus-server-{rec.suffix(10)}", "quay.io/prometheus/prometheus:v3.2.1"
    pod = rec.pod("monitoring", owner, "cpu-node-02", "10.0.4.9", "prometheus-server", image)
    t = 31.0
    while t < end:
        msg = f'"Head GC completed" caller=truncateMemory duration={rec.rng.uniform(20, 90):.3f}ms'
        rec.log(pod, t, w.prometheus_log(rec.start + t, "head.go:1353", msg))
        t += 120.0
