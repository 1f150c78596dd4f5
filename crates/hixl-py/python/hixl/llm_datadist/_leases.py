"""``CacheManager``'s request-scoped leases (a hixl extension)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from ._status import _type_error, _value_error
from ._manager import _Manager, _kw
from ._types import BlocksCacheKey, Cache, EndedLease, LeaseGrant, _grant, _int, _ints


class _Leases(_Manager):
    """Leases: granting blocks to a puller, ending them, pulling leased blocks."""

    def lease_blocks(self, request_id: int, caches: Sequence[Cache], blocks: Sequence[int],
                     ttl_ms: int = 30000, lease_id: Optional[int] = None,
                     generation: Optional[int] = None) -> LeaseGrant:
        """hixl extension, on the owner (prefill): leases ``blocks`` (the same block ids in
        each of ``caches``) of request ``request_id`` to the peer that will pull them, for
        ``ttl_ms`` without progress (1 ms to one day; a longer one is refused with
        ``LLM_PARAM_INVALID``: end a lease early with :meth:`end_lease`). Hand the grant to that peer (``grant.to_dict()``); its
        :meth:`pull_leased_blocks` calls are checked against the lease before a byte moves.
        Until the lease ends (:meth:`lease_events`) its blocks cannot be leased again,
        overwritten by ``copy_blocks``/``swap_blocks``, or their cache unregistered
        (``LLM_LEASE_HELD``).

        ``lease_id`` and ``generation`` (both or neither, each nonzero) create the lease under
        a grant minted ahead by a coordinator that hands it out before this process runs
        again, as ``hixl.vllm``'s scheduler does: the minter keeps ids unique and generations
        random. Until the lease exists a pull with that grant is refused and moves nothing."""
        self._check()
        if not isinstance(caches, (list, tuple)):
            raise _type_error(f"caches must be a list of Cache, got {caches!r}")
        ids = [self._registered(f"caches[{i}]", c).cache_id for i, c in enumerate(caches)]
        if (lease_id is None) != (generation is None):
            raise _value_error(f"lease_id ({lease_id!r}) and generation ({generation!r}) go "
                               "together")
        minted = None if lease_id is None or generation is None else (
            _int("lease_id", lease_id, 1), _int("generation", generation, 1))
        js = self._native.lease_blocks(_int("request_id", request_id), ids,
                                       _ints("blocks", blocks), _int("ttl_ms", ttl_ms, 1),
                                       minted)
        return LeaseGrant.from_json(js)

    def end_lease(self, lease: Union[int, LeaseGrant]) -> None:
        """hixl extension, on the owner: ends a lease it granted (the request was aborted). No
        new pull of it is admitted (``LLM_LEASE_ENDED``, nothing moves); it is reported ended
        (``REVOKED``) once pulls in flight are done. ``LLM_LEASE_ENDED`` if not live."""
        self._check()
        lid = lease.lease_id if isinstance(lease, LeaseGrant) else _int("lease", lease)
        self._native.end_lease(lid)

    def lease_events(self, timeout_in_millis: int = 0) -> List[EndedLease]:
        """hixl extension, on the owner: the leases that ended since the last call, waiting up
        to ``timeout_in_millis`` for the first. Their blocks may be freed and reused."""
        self._check()
        ms = _int("timeout_in_millis", timeout_in_millis, 0, 2**63 - 1)
        return [EndedLease(*e) for e in self._native.lease_events(ms or None)]

    def live_leases(self) -> int:
        """hixl extension, on the owner: how many leases it granted are live."""
        self._check()
        return self._native.live_leases()

    def pull_leased_blocks(self, grant: Union[LeaseGrant, Dict[str, Any], str],
                           src_cache_key: BlocksCacheKey, dst_cache: Cache,
                           src_blocks: Optional[Sequence[int]] = None,
                           dst_blocks: Sequence[int] = (), done: bool = False,
                           **kwargs: Any) -> None:
        """hixl extension, on the puller (decode): pulls leased blocks ``src_blocks`` (default:
        all the grant's) of the owner's blocks cache into ``dst_blocks`` (default: the same
        ids). The owner admits the pull only while the lease is live (else
        ``LLM_LEASE_ENDED`` and nothing moves) and keeps the blocks unreused until it is done.
        With ``done`` the lease ends after a successful pull. Keyword arguments and partial
        failures as :meth:`pull_blocks`."""
        self._check()
        g = _grant(grant)
        if not isinstance(src_cache_key, BlocksCacheKey):
            raise _type_error(f"src_cache_key must be a BlocksCacheKey, got {src_cache_key!r}")
        dst = self._registered("dst_cache", dst_cache)
        ext = _kw("pull_leased_blocks", kwargs)
        sb = list(g.blocks) if src_blocks is None else _ints("src_blocks", src_blocks)
        db = _ints("dst_blocks", dst_blocks) or list(sb)
        if not isinstance(done, bool):
            raise _type_error(f"done must be a bool, got {done!r}")
        self._native.pull_leased_blocks(g.to_json(), src_cache_key._tuple(), dst.cache_id,
                                        sb, db, ext, done)

    def lease_done(self, grant: Union[LeaseGrant, Dict[str, Any], str]) -> None:
        """hixl extension, on the puller: tells the owner the leased blocks are needed no more
        (the lease ends ``DONE``). ``LLM_LEASE_ENDED`` if not live."""
        self._check()
        self._native.lease_done(_grant(grant).to_json())

    def renew_lease(self, grant: Union[LeaseGrant, Dict[str, Any], str]) -> None:
        """hixl extension, on the puller: extends the lease by its TTL (a heartbeat while the
        blocks are still needed but not pulled yet)."""
        self._check()
        self._native.renew_lease(_grant(grant).to_json())
