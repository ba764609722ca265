"""The basics of go-sockaddr's template functions for `{{ sockaddr "..." }}`:
the address lookups a Nomad template uses to find the host's IPs
(GetPrivateIP, GetPrivateIPs, GetPublicIP, GetPublicIPs, GetInterfaceIP,
GetInterfaceIPs, GetAllInterfaces' addresses). go-sockaddr's filter
pipelines (`| include ... | attr ...`) are refused by name."""

from __future__ import annotations

import ipaddress
import shlex
import socket

import psutil

from corral.domain.template.exec import FuncError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# go-sockaddr's private ranges: RFC 1918, RFC 6598 (shared), RFC 6890 bits.
_PRIVATE = [
    ipaddress.ip_network(n)
    for n in ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
]


def _addresses(family: int | None = socket.AF_INET) -> list[tuple[str, IPAddress]]:
    stats = psutil.net_if_stats()
    out: list[tuple[str, IPAddress]] = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        st = stats.get(name)
        if st is not None and not st.isup:
            continue
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if family is not None and a.family != family:
                continue
            try:
                ip = ipaddress.ip_address(a.address.split("%")[0])
            except ValueError:
                continue
            out.append((name, ip))
    return out


def _is_private(ip: IPAddress) -> bool:
    return any(ip in net for net in _PRIVATE if net.version == ip.version)


def _private() -> list[str]:
    return [str(ip) for _, ip in _addresses() if _is_private(ip) and not ip.is_loopback]


def _public() -> list[str]:
    return [
        str(ip)
        for _, ip in _addresses()
        if not _is_private(ip) and ip.is_global and not ip.is_loopback
    ]


def _interface(name: str) -> list[str]:
    known = psutil.net_if_addrs()
    if name not in known:
        raise FuncError(f"unable to find interface {name}")
    return [str(ip) for iface, ip in _addresses() if iface == name]


def evaluate(expression: str) -> str:
    try:
        words = shlex.split(expression)
    except ValueError as exc:
        raise FuncError(f"unable to parse template {expression!r}: {exc}") from None
    if not words:
        raise FuncError("unable to parse template: empty expression")
    if "|" in words:
        raise FuncError(
            "sockaddr: filter pipelines (| include, | attr, ...) are not supported by Corral"
        )
    fn, args = words[0], words[1:]
    if fn == "GetPrivateIP" and not args:
        found = _private()
        return found[0] if found else ""
    if fn == "GetPrivateIPs" and not args:
        return " ".join(_private())
    if fn == "GetPublicIP" and not args:
        found = _public()
        return found[0] if found else ""
    if fn == "GetPublicIPs" and not args:
        return " ".join(_public())
    if fn == "GetInterfaceIP" and len(args) == 1:
        found = _interface(args[0])
        return found[0] if found else ""
    if fn == "GetInterfaceIPs" and len(args) == 1:
        return " ".join(_interface(args[0]))
    if fn == "GetAllInterfaces" and not args:
        return " ".join(str(ip) for _, ip in _addresses(None))
    raise FuncError(f"sockaddr: {fn} is not supported by Corral")
