"""The gateway in front of the simulated endpoint, as the nginx actuator drives it.

The detector's real nginx actuator (``detector.actuators.nginx``) writes its two include files
here, checks the configuration and reloads; ``NginxStandIn`` is the nginx: its configuration
check and reload are ``true`` (always fine), and ``limit()`` reads the include files back as
the aggregate limit the model enforces (``detector.sim.traffic.Gateway``): ``limit_req``'s
rate and burst, ``limit_conn``'s requests in progress, and the admission rule's
``client_max_body_size``. It reads exactly the directives the actuator writes
(``detector.actuators.nginx.config.render_http`` / ``render_location`` /
``render_admission``); anything else is ignored, as nginx would refuse it. The main
configuration it writes is the wiring an operator adds once (module docstring of
``detector.actuators.nginx.config``).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from detector.config import NginxGatewaySettings
from detector.sim.traffic import GatewayLimit

_ZONE = re.compile(r"^limit_req_zone \S+ zone=(\w+):\S+ rate=(\d+)r/([sm]);$", re.MULTILINE)
_REQ = re.compile(r"^limit_req zone=(\w+)(?: burst=(\d+))?( nodelay)?;$", re.MULTILINE)
_CONN = re.compile(r"^limit_conn (\w+) (\d+);$", re.MULTILINE)
_BODY = re.compile(r"^client_max_body_size (\d+)([kKmM]?);$", re.MULTILINE)
_UNIT = {"": 1, "k": 1024, "m": 1024**2}
_MAIN = """events {{}}
http {{
    include {http};
    server {{
        listen 8080;
        location / {{
            include {location};
            include {admission};
            proxy_pass http://127.0.0.1:8000;
        }}
    }}
}}
"""


@dataclass
class NginxStandIn:
    """The nginx of the simulation, its files in ``folder`` (created with no limit in force)."""

    folder: Path
    _seen: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in (self.http_include, self.location_include, self.admission_include):
            path.write_text("# no limit in force\n", encoding="utf-8")
        main = _MAIN.format(
            http=self.http_include,
            location=self.location_include,
            admission=self.admission_include,
        )
        self.conf_path.write_text(main, encoding="utf-8")
        self._seen = self._text()

    @property
    def conf_path(self) -> Path:
        """Return the main configuration's path."""
        return self.folder / "nginx.conf"

    @property
    def http_include(self) -> Path:
        """Return the http-context include's path."""
        return self.folder / "detector-http.conf"

    @property
    def location_include(self) -> Path:
        """Return the location include's path."""
        return self.folder / "detector-location.conf"

    @property
    def admission_include(self) -> Path:
        """Return the admission rule's include (location context)."""
        return self.folder / "detector-admission.conf"

    def settings(self) -> NginxGatewaySettings:
        """Return the settings that point the nginx actuator here."""
        return NginxGatewaySettings(
            conf_path=self.conf_path,
            http_include=self.http_include,
            location_include=self.location_include,
            admission_include=self.admission_include,
            nginx_bin=shutil.which("true") or "true",
        )

    def changed(self) -> bool:
        """Return True once after each change of the include files."""
        text = self._text()
        if text == self._seen:
            return False
        self._seen = text
        return True

    def limit(self) -> GatewayLimit | None:
        """Return the limit the include files put in force (None: none)."""
        http = self.http_include.read_text(encoding="utf-8")
        location = self.location_include.read_text(encoding="utf-8")
        admission = self.admission_include.read_text(encoding="utf-8")
        zones = {z: float(n) / (60.0 if unit == "m" else 1.0) for z, n, unit in _ZONE.findall(http)}
        body = _BODY.search(admission)
        max_body = int(body.group(1)) * _UNIT[body.group(2).lower()] if body else None
        req = _REQ.search(location)
        if req is None or req.group(1) not in zones:
            return None if max_body is None else GatewayLimit(max_body_bytes=max_body)
        conn = _CONN.search(location)
        return GatewayLimit(
            rps=zones[req.group(1)],
            burst=int(req.group(2) or 0),
            connections=int(conn.group(2)) if conn is not None else None,
            max_body_bytes=max_body,
            nodelay=req.group(3) is not None,
        )

    def _text(self) -> str:
        return "".join(
            p.read_text(encoding="utf-8")
            for p in (self.http_include, self.location_include, self.admission_include)
        )
