"""LLM-DataDist's cluster infos (``LLMClusterInfo``) and its configuration builder
(``LLMConfig``, which generates ``LLMDataDist.init``'s options)."""

from __future__ import annotations

import socket
from typing import Any, Dict, List, Optional, Tuple, Union, cast

from ._status import _type_error, _value_error
from ._types import LLMRole, _int, _ints, _U32

__all__ = ["LLMClusterInfo", "LLMConfig", "LlmConfig"]


def _ip_to_int(ip: Union[str, int]) -> Union[int, str]:
    if isinstance(ip, int) and not isinstance(ip, bool):
        return _int("ip", ip, 0, _U32)
    if not isinstance(ip, str):
        raise _type_error(f"ip must be a str or int, got {ip!r}")
    try:
        return int.from_bytes(socket.inet_aton(ip), byteorder="little")
    except OSError:
        try:
            socket.inet_pton(socket.AF_INET6, ip.strip("[]"))
        except OSError:
            raise _value_error(f"ip {ip!r} is not an IPv4 or IPv6 address") from None
        return ip.strip("[]")


def _ip_str(ip: Union[int, str]) -> str:
    if isinstance(ip, str):
        return f"[{ip}]"
    return socket.inet_ntoa(int(ip).to_bytes(4, byteorder="little"))


class LLMClusterInfo:
    """A remote cluster to link with: set ``remote_cluster_id``, then
    ``append_remote_ip_info(ip, port)`` with the peer's ``listen_ip_info``.
    ``append_local_ip_info`` is accepted (hixl picks the local address itself).
    hixl extension: with ``hixl.Directory``, ``remote_name`` (the peer's ``hixl.Name``) in
    place of its address."""

    def __init__(self) -> None:
        self._remote_name: Optional[str] = None
        self._remote_cluster_id: Optional[int] = None
        self._remote_role_type: Optional[Union[LLMRole, int]] = None
        self._local_ip_info_list: List[Tuple[Union[int, str], int]] = []
        self._remote_ip_info_list: List[Tuple[Union[int, str], int]] = []

    @property
    def remote_cluster_id(self) -> Optional[int]:
        """The remote cluster's id."""
        return self._remote_cluster_id

    @remote_cluster_id.setter
    def remote_cluster_id(self, value: int) -> None:
        self._remote_cluster_id = _int("remote_cluster_id", value)

    @property
    def remote_name(self) -> Optional[str]:
        """hixl extension: the name the remote cluster's engine publishes in the directory
        (``hixl.Name``); linked by it when set (this side needs ``hixl.Directory`` too)."""
        return self._remote_name

    @remote_name.setter
    def remote_name(self, value: str) -> None:
        if not isinstance(value, str) or not value or ":" in value or "/" in value:
            raise _value_error(f"remote_name = {value!r}: expected an engine name (no ':' "
                               "or '/')")
        self._remote_name = value

    @property
    def remote_role_type(self) -> Optional[Union[LLMRole, int]]:
        """The remote cluster's role (a label)."""
        return self._remote_role_type

    @remote_role_type.setter
    def remote_role_type(self, value: Union[LLMRole, int]) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(f"remote_role_type must be an LLMRole or int, got {value!r}")
        self._remote_role_type = value

    @property
    def local_ip_info_list(self) -> List[Tuple[Union[int, str], int]]:
        """Local ``(ip, port)`` pairs (IPv4 as a little-endian int, as in LLM-DataDist)."""
        return self._local_ip_info_list

    @property
    def remote_ip_info_list(self) -> List[Tuple[Union[int, str], int]]:
        """Remote ``(ip, port)`` pairs (IPv4 as a little-endian int, as in LLM-DataDist)."""
        return self._remote_ip_info_list

    def append_local_ip_info(self, ip: Union[str, int], port: int) -> None:
        """Adds a local address (accepted for compatibility; one at most is used)."""
        self._local_ip_info_list.append((_ip_to_int(ip), _int("port", port, 0, 65535)))

    def append_remote_ip_info(self, ip: Union[str, int], port: int) -> None:
        """Adds the remote cluster's listen address (one per cluster)."""
        self._remote_ip_info_list.append((_ip_to_int(ip), _int("port", port, 1, 65535)))

    def _cluster_id(self) -> int:
        if self._remote_cluster_id is None:
            raise _value_error("an LLMClusterInfo has no remote_cluster_id")
        return self._remote_cluster_id

    def _remote_addr(self) -> str:
        if self._remote_name is not None:
            return self._remote_name
        if not self._remote_ip_info_list:
            raise _value_error(
                f"cluster {self._remote_cluster_id}: no remote address; call "
                "append_remote_ip_info(ip, port) with the peer's listen_ip_info")
        ip, port = self._remote_ip_info_list[0]
        return f"{_ip_str(ip)}:{port}"

    def __repr__(self) -> str:
        return (f"LLMClusterInfo(remote_cluster_id={self._remote_cluster_id}, "
                f"remote_ip_info_list={self._remote_ip_info_list})")


class LLMConfig:
    """Builds :meth:`LLMDataDist.init`'s options (``generate_options()``).

    Properties and their option keys: ``device_id`` (``ge.exec.deviceId``), ``sync_kv_timeout``
    (``llm.SyncKvCacheWaitTime``, ms, default 1000), ``listen_ip_info``
    (``llm.listenIpInfo``, ``"ip:port"``; port 0 picks a free port, a hixl extension),
    ``enable_cache_manager``, ``enable_remote_cache_accessible``, ``enable_switch_role``,
    ``mem_pool_cfg``, ``host_mem_pool_cfg``, ``buf_pool_cfg``, ``rdma_traffic_class``,
    ``rdma_service_level``, ``local_comm_res``, ``link_total_time``, ``link_retry_count``,
    ``transfer_backend`` (``"hixl"``), ``global_resource_config``, and ``ge_options`` (extra
    options, e.g. hixl's ``{"hixl.Transport": "tcp"}`` or ``"fabric"``).
    """

    def __init__(self) -> None:
        self._options: Dict[str, str] = {}
        self._ge_options: Dict[str, str] = {}
        self._values: Dict[str, Any] = {}

    def _get(self, name: str, default: Any = None) -> Any:
        return self._values.get(name, default)

    def _set_bool(self, name: str, value: Any) -> None:
        if not isinstance(value, bool):
            raise _type_error(f"{name} must be a bool, got {value!r}")
        self._values[name] = value

    def _set_str(self, name: str, value: Any) -> None:
        if not isinstance(value, str):
            raise _type_error(f"{name} must be a str, got {value!r}")
        self._values[name] = value

    @property
    def ge_options(self) -> Dict[str, str]:
        """Extra options, passed through (``hixl.*`` keys configure the transfer engine)."""
        return self._ge_options

    @ge_options.setter
    def ge_options(self, value: Dict[str, str]) -> None:
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise _type_error(f"ge_options must be a Dict[str, str], got {value!r}")
        self._ge_options = value

    @property
    def device_id(self) -> Optional[Union[int, List[int]]]:
        """The device id (accepted; hixl moves host memory)."""
        return cast('Optional[Union[int, List[int]]]', self._get("device_id"))

    @device_id.setter
    def device_id(self, value: Union[int, List[int], Tuple[int, ...]]) -> None:
        if isinstance(value, (list, tuple)):
            self._values["device_id"] = _ints("device_id", value, 0, 2**31 - 1)
        else:
            self._values["device_id"] = _int("device_id", value, 0, 2**31 - 1)

    @property
    def sync_kv_timeout(self) -> Optional[Union[int, str]]:
        """Timeout of each pull/push in ms (``llm.SyncKvCacheWaitTime``)."""
        return cast('Optional[Union[int, str]]', self._get("sync_kv_timeout"))

    @sync_kv_timeout.setter
    def sync_kv_timeout(self, value: Union[int, str]) -> None:
        if isinstance(value, str):
            if not value.isdigit():
                raise _value_error(f"sync_kv_timeout {value!r} must be digits")
            _int("sync_kv_timeout", int(value), 1, 2**31 - 1)
        else:
            _int("sync_kv_timeout", value, 1, 2**31 - 1)
        self._values["sync_kv_timeout"] = value

    @property
    def listen_ip_info(self) -> str:
        """``"ip:port"`` this instance listens on (both sides listen in hixl)."""
        return cast('str', self._get("listen_ip_info", ""))

    @listen_ip_info.setter
    def listen_ip_info(self, value: str) -> None:
        self._set_str("listen_ip_info", value)

    for _name in ("enable_cache_manager", "enable_remote_cache_accessible",
                  "enable_switch_role"):
        locals()[_name] = property(
            (lambda n: lambda self: self._get(n, False))(_name),
            (lambda n: lambda self, v: self._set_bool(n, v))(_name),
            doc=f"``{_name}`` (accepted; hixl always behaves as if it were True).")
    for _name in ("mem_pool_cfg", "host_mem_pool_cfg", "buf_pool_cfg", "local_comm_res",
                  "transfer_backend", "global_resource_config", "deploy_res_path"):
        locals()[_name] = property(
            (lambda n: lambda self: self._get(n, ""))(_name),
            (lambda n: lambda self, v: self._set_str(n, v))(_name),
            doc=f"``{_name}`` (a string option).")
    del _name

    @property
    def rdma_traffic_class(self) -> Optional[int]:
        """RDMA traffic class (accepted; unused by the TCP and fabric transports)."""
        return cast('Optional[int]', self._get("rdma_traffic_class"))

    @rdma_traffic_class.setter
    def rdma_traffic_class(self, value: int) -> None:
        self._values["rdma_traffic_class"] = _int("rdma_traffic_class", value, 0, _U32)

    @property
    def rdma_service_level(self) -> Optional[int]:
        """RDMA service level (accepted; unused by the TCP and fabric transports)."""
        return cast('Optional[int]', self._get("rdma_service_level"))

    @rdma_service_level.setter
    def rdma_service_level(self, value: int) -> None:
        self._values["rdma_service_level"] = _int("rdma_service_level", value, 0, _U32)

    @property
    def link_total_time(self) -> int:
        """Seconds a link may take (accepted; ``link_clusters``' timeout applies)."""
        return cast('int', self._get("link_total_time", 0))

    @link_total_time.setter
    def link_total_time(self, value: int) -> None:
        self._values["link_total_time"] = _int("link_total_time", value, 0, _U32)

    @property
    def link_retry_count(self) -> int:
        """Link attempts, [1, 100] (accepted)."""
        return cast('int', self._get("link_retry_count", 1))

    @link_retry_count.setter
    def link_retry_count(self, value: int) -> None:
        self._values["link_retry_count"] = _int("link_retry_count", value, 1, 100)

    @property
    def options(self) -> Dict[str, str]:
        """The options generated so far."""
        return self._options

    def generate_options(self) -> Dict[str, str]:
        """The option dict for :meth:`LLMDataDist.init`."""
        o = self._options
        o.update(self._ge_options)
        v = self._values
        dev = v.get("device_id")
        if isinstance(dev, int):
            o["ge.exec.deviceId"] = str(dev)
        elif dev:
            o["ge.exec.deviceId"] = ";".join(str(d) for d in dev)
        if v.get("sync_kv_timeout") is not None:
            o["llm.SyncKvCacheWaitTime"] = str(v["sync_kv_timeout"])
        if v.get("listen_ip_info"):
            o["llm.listenIpInfo"] = v["listen_ip_info"]
        keyed = {
            "buf_pool_cfg": "llm.BufPoolCfg", "mem_pool_cfg": "llm.MemPoolConfig",
            "host_mem_pool_cfg": "llm.HostMemPoolConfig", "deploy_res_path": "llm.deployResPath",
        }
        for name, key in keyed.items():
            if v.get(name):
                o[key] = v[name]
        for name, key in (("enable_cache_manager", "llm.EnableCacheManager"),
                          ("enable_remote_cache_accessible", "llm.EnableRemoteCacheAccessible")):
            if name in v:
                o[key] = "1" if v[name] else "0"
        if v.get("enable_switch_role"):
            o["llm.EnableSwitchRole"] = "1"
        for name, key in (("link_total_time", "llm.LinkTotalTime"),
                          ("link_retry_count", "llm.LinkRetryCount"),
                          ("rdma_traffic_class", "llm.RdmaTrafficClass"),
                          ("rdma_service_level", "llm.RdmaServiceLevel"),
                          ("local_comm_res", "llm.LocalCommRes"),
                          ("transfer_backend", "llm.TransferBackend"),
                          ("global_resource_config", "llm.GlobalResourceConfig")):
            if name in v:
                o[key] = str(v[name])
        return o

    gen_options = generate_options


LlmConfig = LLMConfig
