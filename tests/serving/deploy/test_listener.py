"""A replica's own listener (serving.deploy.listener), without Ray: uvicorn on a socket that
every replica binds with SO_REUSEPORT, drained before the replica stops.

Each test runs its listeners on one event loop (ReplicaListener starts on the running loop)
and reaches them with a real HTTP client, httpx, over loopback.
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from serving.deploy.listener import ReplicaListener
from tests.serving.deploy.served import free_port

HOST = "127.0.0.1"
CHUNKS = 5
WAIT_S = 10.0  # anything the listener does here takes milliseconds


def named_app(name: str) -> Starlette:
    """GET / answers name; GET /stream sends one chunk, then the rest once `release` is set."""
    release = asyncio.Event()

    async def hello(request):
        return PlainTextResponse(name)

    async def chunks():
        yield b"0\n"
        await release.wait()
        for i in range(1, CHUNKS):
            yield f"{i}\n".encode()

    async def stream(request):
        return StreamingResponse(chunks(), media_type="text/plain")

    app = Starlette(routes=[Route("/", hello), Route("/stream", stream)])
    app.state.release = release
    return app


async def fresh_connection_get(url: str) -> httpx.Response:
    """GET url on a connection of its own, so that the kernel picks a listener for it."""
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        return await client.get(url)


async def until_answering(url: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            await fresh_connection_get(url)
            return
        except httpx.ConnectError:
            assert time.monotonic() < deadline, f"nothing listens on {url}"
            await asyncio.sleep(0.02)


def test_two_listeners_share_a_port_and_both_serve():
    port = free_port()
    url = f"http://{HOST}:{port}/"

    async def main() -> set[str]:
        listeners = [ReplicaListener(named_app(n), HOST, port, drain_s=1) for n in "ab"]
        try:
            await until_answering(url)
            seen: set[str] = set()
            for _ in range(200):  # the kernel hashes each connection to one listener
                seen.add((await fresh_connection_get(url)).text)
                if len(seen) == 2:
                    break
            return seen
        finally:
            for listener in listeners:
                await listener.drain()

    assert asyncio.run(main()) == {"a", "b"}


def test_drain_finishes_a_stream_in_flight_and_refuses_new_connections():
    port = free_port()
    base = f"http://{HOST}:{port}"

    async def main() -> None:
        app = named_app("a")
        listener = ReplicaListener(app, HOST, port, drain_s=WAIT_S)
        await until_answering(f"{base}/")
        async with httpx.AsyncClient(timeout=WAIT_S) as client:
            async with client.stream("GET", f"{base}/stream") as answer:
                lines = answer.aiter_lines()
                assert await anext(lines) == "0"  # mid-stream
                draining = asyncio.create_task(listener.drain())
                deadline = time.monotonic() + WAIT_S
                while True:  # the listening socket closes at once
                    try:
                        await fresh_connection_get(f"{base}/")
                    except httpx.ConnectError:
                        break
                    assert time.monotonic() < deadline, "a draining listener still accepts"
                    await asyncio.sleep(0.02)
                assert not draining.done(), "drain returned with a stream in flight"
                app.state.release.set()
                rest = [line async for line in lines]
            assert rest == [str(i) for i in range(1, CHUNKS)]
        await asyncio.wait_for(draining, WAIT_S)

    asyncio.run(main())


def test_drain_cuts_a_stream_still_open_after_drain_s():
    port = free_port()
    base = f"http://{HOST}:{port}"

    async def main() -> None:
        listener = ReplicaListener(named_app("a"), HOST, port, drain_s=0.5)
        await until_answering(f"{base}/")
        client = httpx.AsyncClient(timeout=WAIT_S)
        async with client, client.stream("GET", f"{base}/stream") as answer:
            lines = answer.aiter_lines()
            assert await anext(lines) == "0"
            started = time.monotonic()
            await asyncio.wait_for(listener.drain(), WAIT_S)  # never released
            assert time.monotonic() - started < WAIT_S / 2
            with pytest.raises(httpx.RemoteProtocolError):  # cut, not ended
                _ = [line async for line in lines]

    asyncio.run(main())


def test_a_port_held_without_reuseport_names_host_port_and_proxy_location():
    with socket.socket() as plain:  # as a Ray Serve HTTP proxy, or any other server, holds it
        plain.bind((HOST, 0))
        plain.listen()
        port = plain.getsockname()[1]

        async def main() -> None:
            ReplicaListener(named_app("a"), HOST, port, drain_s=1)

        with pytest.raises(OSError) as failed:
            asyncio.run(main())
    message = str(failed.value)
    assert f"{HOST}:{port}" in message and "proxy_location: Disabled" in message, message


def test_the_client_is_the_tcp_peer_whatever_a_forwarded_header_says():
    """The gate limits key guesses per client: a header must not let one caller be many."""
    port = free_port()

    async def peer(request):
        return PlainTextResponse(request.client.host)

    async def main() -> str:
        app = Starlette(routes=[Route("/", peer)])
        listener = ReplicaListener(app, HOST, port, drain_s=1)
        try:
            await until_answering(f"http://{HOST}:{port}/")
            async with httpx.AsyncClient(timeout=WAIT_S) as client:
                answer = await client.get(
                    f"http://{HOST}:{port}/", headers={"x-forwarded-for": "203.0.113.7"}
                )
            return answer.text
        finally:
            await listener.drain()

    assert asyncio.run(main()) == HOST


def test_an_address_this_machine_lacks_is_named_without_the_proxy_hint():
    with pytest.raises(OSError) as failed:
        ReplicaListener(named_app("a"), "192.0.2.1", free_port(), drain_s=1)  # TEST-NET-1
    assert "192.0.2.1" in str(failed.value)
    assert "proxy_location" not in str(failed.value)
