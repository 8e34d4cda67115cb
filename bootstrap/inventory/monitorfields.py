"""The monitor's settings, pure: cluster.monitor (Prometheus, the exporters) and its ports."""
from __future__ import annotations

import re
from typing import Any

from bootstrap.inventory.hostfields import _host_name
from bootstrap.inventory.portfields import _PORT_FIELDS, _check_fixed, _check_unprivileged
from bootstrap.inventory.values import Validator, _bool, _check_mapping, _described, _image, _int, _port, _string
from bootstrap.inventory.yamlfile import _Loc, _quote
from bootstrap.model import Monitor, Ports, Router

_RETENTION_RX = re.compile(r"[1-9][0-9]*(ms|s|m|h|d|w|y)")
_RETENTION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000,
                 "y": 365 * 86_400_000}
#: The longest retention: Prometheus refuses a duration past int64 nanoseconds (about 292 years)
#: and does not start; a century is already a typo.
MAX_RETENTION_YEARS = 100


def _retention(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    m = _RETENTION_RX.fullmatch(value)
    if not m:
        loc.fail(f"{_quote(value)} is not valid: a duration such as 15d, 12h or 2w")
    digits = value[:m.start(1)]
    if len(digits) > 20 or int(digits) * _RETENTION_MS[m.group(1)] > MAX_RETENTION_YEARS * _RETENTION_MS["y"]:
        loc.fail(f"{_quote(value)} is more than {MAX_RETENTION_YEARS} years (Prometheus would not start with it)")
    return value


_retention.accepts = f"a duration such as 15d, 12h or 2w, at most {MAX_RETENTION_YEARS}y"  # type: ignore[attr-defined]

_MONITOR_FIELDS: dict[str, Validator] = {
    "host": _described("the name of a host of the inventory", lambda v, loc: _host_name(v, loc)),
    "port": _port,
    "node_exporter_port": _port,
    "scrape_interval": _int(1, 3600),
    "retention": _retention,
    "image": _image,
    "node_exporter_image": _image,
    "dcgm": _bool,
    "dcgm_image": _image,
    "dcgm_port": _port,
}


def _monitor(value: Any, loc: _Loc, ports: Ports, router: Router | None) -> tuple[Monitor, _Loc | None]:
    """Prometheus' settings, and where its host was named (checked against the hosts later). Its
    ports must differ from every other port a host of this cluster listens on."""
    values, locs = _check_mapping(value, loc, _MONITOR_FIELDS) if value is not None else ({}, {})
    mon = Monitor(**values)
    for name in ("port", "node_exporter_port", "dcgm_port"):
        if name in values:
            _check_fixed(values[name], locs[name])
            _check_unprivileged(values[name], locs[name], "Prometheus' and the exporters' containers")
    taken = {getattr(ports, name): f"cluster.ports.{name}" for name in _PORT_FIELDS}
    if router is not None:
        taken.update({router.port: "cluster.router.port", router.metrics_port: "cluster.router.metrics_port"})
    for name in ("port", "node_exporter_port", *(("dcgm_port",) if mon.dcgm else ())):
        port = getattr(mon, name)
        if port in taken:
            locs.get(name, loc).fail(f"{port} is also {taken[port]}; the monitor's ports must differ"
                                     + ("" if name in values else f" (set {loc.field}.{name})"))
        taken[port] = f"{loc.field}.{name}"
    return mon, locs.get("host")
