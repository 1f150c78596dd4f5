"""The directory side of `Engine` (``hixl.Directory``, ``hixl.Name``): the live engines the
directory lists, and this engine's own entry. ``Engine.connect_named`` links by name."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from . import _hixl


class DirectoryMixin:
    """Directory queries of an `Engine`; ``self._native`` is the engine's native half."""

    _native: _hixl.Engine

    def directory_entries(self) -> List[Dict[str, Any]]:
        """Every live engine in the directory, from the engine's watched cache: dicts with
        ``name``, ``incarnation``, ``addrs``, ``transports``, ``table_digest``, ``wire``.
        Empty without ``hixl.Directory``."""
        return list(self._native.directory_entries())

    def publication(self) -> Optional[Dict[str, Any]]:
        """This engine's own entry, with ``state``: ``live``, ``retrying: <why>`` (etcd is
        away; links are unaffected) or ``lost: <holder>``; ``None`` if it publishes none."""
        return self._native.publication()
