"""A small prefill/decode proxy for ``vllm serve`` instances using ``hixl.vllm`` (or any vLLM
KV connector that hands its transfer parameters back in ``kv_transfer_params``, as
NixlConnector does): it makes two OpenAI-compatible servers look like one.

    python -m hixl.vllm.proxy --port 8000 \\
        --prefill http://10.0.0.1:8100 --decode http://10.0.0.2:8200

For each ``POST /v1/completions`` or ``/v1/chat/completions``:

1. the request goes to a prefill server with ``kv_transfer_params = {"do_remote_decode":
   true}``, ``max_tokens = 1`` and no streaming: the prefill computes the prompt's KV, keeps it
   under a hixl lease and answers with the transfer parameters (its workers' hixl addresses
   and the lease grant);
2. the original request goes to a decode server with those ``kv_transfer_params``: the decode
   pulls the KV and generates; its answer (streamed or not) is what the client gets.

A prefill that fails answers the client with its own status and body; a prefill that hands
back no transfer parameters (the connector refused the request: its log says why) leaves
the decode to compute the prompt itself. Several ``--prefill`` / ``--decode`` URLs are used
round robin. ``GET /health`` is healthy when every server is; ``GET /v1/models`` is the
decode's. Needs ``aiohttp`` (a dependency of vLLM's)."""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import logging
from typing import Any, Dict, List

from aiohttp import ClientError, ClientSession, ClientTimeout, web  # type: ignore

log = logging.getLogger("hixl.vllm.proxy")

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def prefill_body(body: Dict[str, Any]) -> Dict[str, Any]:
    """The prefill's copy of a client request: the prompt only, its KV kept for a decode."""
    p = copy.deepcopy(body)
    p["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
    p["stream"] = False
    p.pop("stream_options", None)
    p["max_tokens"] = 1
    if "max_completion_tokens" in p:
        p["max_completion_tokens"] = 1
    return p


class Proxy:
    def __init__(self, prefill: List[str], decode: List[str], timeout_s: float) -> None:
        self.prefill, self.decode = prefill, decode
        self._p = itertools.cycle(prefill)
        self._d = itertools.cycle(decode)
        self.timeout = ClientTimeout(total=timeout_s)
        self.session: Any = None

    async def start(self, _app: Any) -> None:
        self.session = ClientSession(timeout=self.timeout)

    async def stop(self, _app: Any) -> None:
        if self.session is not None:
            await self.session.close()

    @staticmethod
    def _headers(req: web.Request) -> Dict[str, str]:
        return {k: v for k, v in req.headers.items() if k.lower() not in _HOP}

    async def generate(self, req: web.Request) -> web.StreamResponse:
        try:
            body = await req.json()
        except json.JSONDecodeError as e:
            return web.json_response({"error": f"the request body is not JSON: {e}"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "the request body is not a JSON object"},
                                     status=400)
        headers = self._headers(req)
        p_url = next(self._p) + req.path
        try:
            async with self.session.post(p_url, json=prefill_body(body),
                                         headers=headers) as r:
                raw = await r.read()
                if r.status != 200:
                    log.warning("prefill %s answered %d: %s", p_url, r.status, raw[:500])
                    return web.Response(status=r.status, body=raw,
                                        content_type=r.content_type or "application/json")
        except (ClientError, asyncio.TimeoutError) as e:
            return self._unreachable("prefill", p_url, e)
        try:
            params = json.loads(raw).get("kv_transfer_params")
        except (json.JSONDecodeError, AttributeError):
            params = None
        d_body = dict(body)
        if params:
            d_body["kv_transfer_params"] = params
        else:
            log.warning("prefill %s handed back no kv_transfer_params: the decode computes "
                        "the prompt", p_url)
        d_url = next(self._d) + req.path
        out = None
        try:
            async with self.session.post(d_url, json=d_body, headers=headers) as r:
                out = web.StreamResponse(status=r.status, headers={
                    "Content-Type": r.headers.get("Content-Type", "application/json")})
                await out.prepare(req)
                async for chunk in r.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (ClientError, asyncio.TimeoutError) as e:
            if out is None:
                return self._unreachable("decode", d_url, e)
            # the answer had begun: the client sees it end early
            log.warning("decode %s failed mid-answer: %s", d_url, e)
            raise

    @staticmethod
    def _unreachable(side: str, url: str, e: BaseException) -> web.Response:
        why = f"{side} {url}: {type(e).__name__}: {e}"
        log.warning("%s", why)
        return web.json_response({"error": {"message": why, "type": "upstream_error",
                                            "code": 502}}, status=502)

    async def health(self, _req: web.Request) -> web.Response:
        bad = []
        for url in self.prefill + self.decode:
            try:
                async with self.session.get(url + "/health") as r:
                    if r.status != 200:
                        bad.append(f"{url}: {r.status}")
            except Exception as e:  # any failure to reach it is unhealthy
                bad.append(f"{url}: {e}")
        if bad:
            return web.json_response({"unhealthy": bad}, status=503)
        return web.json_response({"ok": True})

    async def models(self, _req: web.Request) -> web.Response:
        async with self.session.get(self.decode[0] + "/v1/models") as r:
            return web.Response(status=r.status, body=await r.read(),
                                content_type="application/json")


def app(prefill: List[str], decode: List[str], timeout_s: float = 600.0) -> web.Application:
    """The proxy as an aiohttp application (``aiohttp.web.run_app(app(...))``)."""
    strip = [u.rstrip("/") for u in prefill], [u.rstrip("/") for u in decode]
    for what, urls in zip(("--prefill", "--decode"), strip):
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"{what} {urls}: give one or more http:// URLs")
    p = Proxy(strip[0], strip[1], timeout_s)
    a = web.Application()
    a.on_startup.append(p.start)
    a.on_cleanup.append(p.stop)
    a.router.add_post("/v1/completions", p.generate)
    a.router.add_post("/v1/chat/completions", p.generate)
    a.router.add_get("/health", p.health)
    a.router.add_get("/v1/models", p.models)
    return a


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m hixl.vllm.proxy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", nargs="+", required=True, metavar="URL")
    ap.add_argument("--decode", nargs="+", required=True, metavar="URL")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per upstream request")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        application = app(a.prefill, a.decode, a.timeout_s)
    except ValueError as e:
        ap.error(str(e))
    web.run_app(application, host=a.host, port=a.port, print=lambda s: log.info("%s", s))


if __name__ == "__main__":
    main()
