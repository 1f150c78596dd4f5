"""The network settings both framework connectors take, under one set of names: which address
a worker advertises (and listens on), which NIC, which fixed port, which RDMA devices, and
whether peers are found by name through the directory. ``hixl.vllm`` reads them from
``kv_connector_extra_config``, ``hixl.sglang`` from ``HIXL_SGLANG_<NAME>`` environment
variables (``interface`` is ``HIXL_SGLANG_INTERFACE``).

=================  ====================================================================
``transport``      ``auto`` (default), ``tcp``, ``fabric``, ``verbs`` (``hixl.Transport``)
``host``           the address to advertise and listen on
``interface``      a NIC whose address to advertise (e.g. ``eth0``), in place of ``host``
``port``           a fixed data port: rank *r* of a server listens on ``port + r``
                   (default 0: any free port)
``verbs_devices``  RDMA devices, comma-separated rails (``hixl.VerbsDevices``)
``verbs_gid_index`` the GID index (``hixl.VerbsGidIndex``; default: hixl picks a RoCE v2
                   IPv4 GID)
``directory``      ``etcd://host:port[,...]``: workers publish themselves by name and peers
                   link by name, not by address (``hixl.Directory``)
``name``           the name prefix a worker publishes under (default: the framework's
                   engine or server id); rank *r* is ``<name>-<role>-<r>``
``secret``         a shared secret: links are authenticated (``hixl.AuthSecret``)
=================  ====================================================================

Without ``host`` or ``interface`` the address is the framework's (``VLLM_HOST_IP``, SGLang's
own), else the address of the interface that routes towards the directory or the default
route, else this host's only non-loopback address, else ``127.0.0.1`` (one host).

A loopback address is never advertised to a peer on another host: a side that advertises a
routable address refuses a peer that advertises a loopback one, naming both (the usual cause is
a prefill started without its address on a machine with several).
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, Optional

from . import _hixl
from ._errors import HixlError

__all__ = ["NAMES", "check_peer_address", "engine_options", "interface_address",
           "listen_port", "local_addresses", "pick_host", "validate"]

#: The setting names, the same in both connectors.
NAMES = ("transport", "host", "interface", "port", "verbs_devices", "verbs_gid_index",
         "directory", "name", "secret")

TRANSPORTS = ("auto", "tcp", "fabric", "verbs")


def _int(where: str, key: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{where}{key} = {v!r}: expected an integer {lo}..{hi}")
    return v


def validate(where: str, s: Mapping[str, Any],
             spell: Callable[[str], str] = lambda n: n) -> Dict[str, Any]:
    """The settings of ``s`` among `NAMES`, checked and normalised. Errors name the source
    (``where``: ``hixl.vllm``) and the setting as the user wrote it (``spell(name)``:
    ``HIXL_SGLANG_PORT`` for ``port``). Unknown names are the caller's to refuse (each
    connector has settings of its own beside these)."""
    sp = spell
    where = f"{where}: " if where else ""
    out: Dict[str, Any] = {}
    t = s.get("transport", "auto") or "auto"
    if t not in TRANSPORTS:
        raise ValueError(f"{where}{sp('transport')} = {t!r}: expected auto, tcp, fabric or "
                         "verbs")
    out["transport"] = t
    host, iface = s.get("host"), s.get("interface")
    if host and iface:
        raise ValueError(f"{where}{sp('host')} = {host!r} and {sp('interface')} = {iface!r}: "
                         "give one")
    if host:
        try:
            ipaddress.ip_address(str(host))
        except ValueError:
            raise ValueError(f"{where}{sp('host')} = {host!r}: expected an IP address "
                             f"(a NIC goes in {sp('interface')})") from None
        out["host"] = str(host)
    if iface:
        if not isinstance(iface, str) or iface not in {n for _, n in socket.if_nameindex()}:
            names = sorted(n for _, n in socket.if_nameindex())
            raise ValueError(f"{where}{sp('interface')} = {iface!r}: no such interface here "
                             f"(this host has {names})")
        out["interface"] = iface
    out["port"] = _int(where, sp("port"), s.get("port", 0) or 0, 0, 65535)
    devs = s.get("verbs_devices")
    if devs:
        out["verbs_devices"] = ",".join(devs) if isinstance(devs, (list, tuple)) else str(devs)
    gid = s.get("verbs_gid_index")
    if gid not in (None, ""):
        out["verbs_gid_index"] = _int(where, sp("verbs_gid_index"), gid, 0, 255)
    d = s.get("directory")
    if d:
        if not str(d).startswith("etcd://"):
            raise ValueError(f"{where}{sp('directory')} = {d!r}: expected "
                             "etcd://host:port[,...]")
        out["directory"] = str(d)
    name = s.get("name")
    if name:
        if not out.get("directory"):
            raise ValueError(f"{where}{sp('name')} = {name!r} needs a directory (etcd://...)")
        out["name"] = str(name)
    if s.get("secret"):
        out["secret"] = str(s["secret"])
    return out


def engine_options(s: Mapping[str, Any]) -> Dict[str, str]:
    """hixl option keys of validated settings (the engine checks the values again and names
    a bad one)."""
    o: Dict[str, str] = {}
    if s.get("transport", "auto") != "auto":
        o["hixl.Transport"] = s["transport"]
    for k, key in (("verbs_devices", "hixl.VerbsDevices"), ("verbs_gid_index",
                   "hixl.VerbsGidIndex"), ("directory", "hixl.Directory"),
                   ("secret", "hixl.AuthSecret")):
        if s.get(k) not in (None, ""):
            o[key] = str(s[k])
    return o


def listen_port(s: Mapping[str, Any], rank: int) -> int:
    """The data port rank ``rank`` listens on: ``port + rank``, or 0 (any) without ``port``."""
    base = int(s.get("port") or 0)
    if not base:
        return 0
    if base + rank > 65535:
        raise ValueError(f"port = {base}: rank {rank} would listen on {base + rank}, "
                         "past 65535")
    return base + rank


def local_addresses() -> Dict[str, List[str]]:
    """This host's addresses by interface, of the interfaces that are up (link-local IPv6
    left out); from the native getifaddrs walk ``hixl doctor`` uses."""
    out: Dict[str, List[str]] = {}
    for name, addr, _mtu in _hixl.interfaces():
        try:
            with open(f"/sys/class/net/{name}/flags") as f:
                if not int(f.read(), 16) & 1:  # IFF_UP
                    continue
        except (OSError, ValueError):
            continue
        if ipaddress.ip_address(addr).is_link_local:
            continue
        out.setdefault(name, []).append(addr)
    return out


def interface_address(iface: str) -> str:
    """The (first IPv4, else IPv6) address of ``iface``; an error names the interface."""
    addrs = local_addresses()
    if iface not in addrs:
        raise ValueError(f"interface = {iface!r}: not up on this host (up: {sorted(addrs)})")
    if not addrs[iface]:
        raise ValueError(f"interface = {iface!r} has no address")
    return addrs[iface][0]


def _route_source(towards: str) -> Optional[str]:
    """The local address the kernel routes from towards ``towards`` (no packet is sent)."""
    try:
        return _hixl.route_source(towards)
    except HixlError:
        return None


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def pick_host(s: Mapping[str, Any], framework_host: Optional[str] = None) -> str:
    """The address a worker advertises: ``host``, else ``interface``'s address, else
    ``framework_host`` (``VLLM_HOST_IP``, SGLang's), else detected (see the module)."""
    if s.get("host"):
        return str(s["host"])
    if s.get("interface"):
        return interface_address(str(s["interface"]))
    if framework_host:
        return framework_host
    towards = []
    for ep in str(s.get("directory") or "").removeprefix("etcd://").split(","):
        hostpart = urllib.parse.urlsplit("//" + ep).hostname if ep else None
        if hostpart:
            towards.append(hostpart)
    towards += ["192.0.0.8", "2001:4860:4860::8888"]  # any routable: only the route counts
    for t in towards:
        src = _route_source(t)
        if src and not _is_loopback(src) and src not in ("0.0.0.0", "::"):
            return src
    routable = [a for addrs in local_addresses().values() for a in addrs
                if not _is_loopback(a) and not a.startswith("fe80")]
    if len(routable) == 1:
        return routable[0]
    return "127.0.0.1"


def check_peer_address(local: str, peer: str, who: str) -> None:
    """Refuses a loopback address advertised by a peer while this side advertises a
    routable one: they are on different hosts (or the peer is misconfigured), and the
    loopback address would reach this host, not the peer."""
    if _is_loopback(peer) and not _is_loopback(local):
        raise ValueError(
            f"{who} advertises the loopback address {peer}, but this side advertises {local}: "
            f"a loopback address cannot reach another host. Give the {who} its routable "
            "address (host or interface in the connector's settings, or VLLM_HOST_IP)")
