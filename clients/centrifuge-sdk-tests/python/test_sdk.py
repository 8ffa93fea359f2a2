"""Herald's Centrifugo endpoint driven by the PyPI `centrifuge-python` SDK
(pinned in requirements.txt), against a real `herald serve` process on a
free port with a temp data dir and an HS256 key, so tokens are real:
in-order receive, publish, history, disconnect()/connect() and a kill -9
server restart each followed by a complete recovery, server-side
subscriptions, presence with join/leave, token refresh. Every scenario
runs on the JSON wire and again on the Protobuf one (`use_protobuf=True`,
where `data` is the stored JSON as bytes).

Run by scripts/test-centrifuge-sdks: `python test_sdk.py` (exit 0 = pass).
$HERALD_BIN names the binary (default target/debug/herald). Every wait is
bounded.
"""

import asyncio
import base64
import hashlib
import hmac
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from centrifuge import (
    Client,
    ClientEventHandler,
    ConnectingContext,
    DisconnectedContext,
    JoinContext,
    LeaveContext,
    PublicationContext,
    ServerPublicationContext,
    ServerSubscribedContext,
    ServerUnsubscribedContext,
    StreamPosition,
    SubscribedContext,
    SubscriptionEventHandler,
)

REPO = Path(__file__).resolve().parents[3]
API_KEY = "py-test-api-key-0123456789"
JWT_SECRET = "py-test-jwt-secret-0123456789abcdef0123"
WAIT = 20.0


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def token(sub: str, ttl: int = 3600, channels=("*",)) -> str:
    head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": sub, "exp": int(time.time()) + ttl, "channels": list(channels), "publish": ["*"]}
    body = b64url(json.dumps(claims).encode())
    sig = hmac.new(JWT_SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(sig)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Herald:
    """A `herald serve` process (default namespaces: `chat` is durable and
    open to client publishes)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="herald-py-")
        self.port = free_port()
        self.start()

    def start(self) -> None:
        """Starts the server on its port and data dir; returns once healthy."""
        binary = os.environ.get("HERALD_BIN", str(REPO / "target/debug/herald"))
        env = {**os.environ, "HERALD_API_KEYS": API_KEY, "HERALD_JWT_SECRET": JWT_SECRET, "HERALD_LOG": "warn"}
        env.pop("HERALD_DEV", None)
        args = [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", f"{self.dir}/data"]
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("herald did not start")
                time.sleep(0.05)

    def api(self, method: str, path: str, body=None) -> tuple:
        """An HTTP API call: (status, parsed body)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"authorization": f"Bearer {API_KEY}", "content-type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            return r.status, json.load(r)

    def publish(self, channel: str, data) -> dict:
        status, body = self.api("POST", f"/api/v1/channels/{channel}/messages", {"data": data})
        assert status == 201, status
        return body

    def kill(self) -> None:
        """kill -9: no shutdown, no goodbye to the clients."""
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Recorder(SubscriptionEventHandler):
    def __init__(self) -> None:
        self.pubs = []
        self.subscribed = []
        self.joins = []
        self.leaves = []

    async def on_publication(self, ctx: PublicationContext) -> None:
        self.pubs.append(ctx.pub)

    async def on_subscribed(self, ctx: SubscribedContext) -> None:
        self.subscribed.append(ctx)

    async def on_join(self, ctx: JoinContext) -> None:
        self.joins.append(ctx.info.user)

    async def on_leave(self, ctx: LeaveContext) -> None:
        self.leaves.append(ctx.info.user)


class Drops(ClientEventHandler):
    """A client's connection losses: `on_connecting` after the first connect
    is a reconnect, `on_disconnected` a stop."""

    def __init__(self) -> None:
        self.connected = False
        self.drops = []

    async def on_connected(self, ctx) -> None:
        self.connected = True

    async def on_connecting(self, ctx: ConnectingContext) -> None:
        if self.connected:
            self.drops.append(ctx)

    async def on_disconnected(self, ctx: DisconnectedContext) -> None:
        self.drops.append(ctx)


async def eventually(what: str, check) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.02)


class Wire:
    """JSON or Protobuf: how `data` reads and is published."""

    def __init__(self, protobuf: bool) -> None:
        self.protobuf = protobuf
        self.name = "protobuf" if protobuf else "json"

    def data(self, d):
        return json.loads(d) if self.protobuf else d

    def payload(self, v):
        return json.dumps(v).encode() if self.protobuf else v


class ServerSide(ClientEventHandler):
    """A client's server-side subscriptions and their publications."""

    def __init__(self) -> None:
        self.subscribed = []
        self.pubs = []

    async def on_subscribed(self, ctx: ServerSubscribedContext) -> None:
        self.subscribed.append(ctx)

    async def on_publication(self, ctx: ServerPublicationContext) -> None:
        self.pubs.append((ctx.channel, ctx.pub))


async def server_side(herald: Herald, wire: Wire) -> None:
    """A channel of the token's `channels` is subscribed on connect and
    recovered on reconnect with nothing missing or doubled."""
    url = f"ws://127.0.0.1:{herald.port}/connection/websocket"
    channel = f"chat:py-ss-{wire.name}"
    tok = token("py-ss", channels=(channel, "chat:*"))

    async def get_token() -> str:
        return tok

    events = ServerSide()
    client = Client(url, events=events, token=tok, get_token=get_token, use_protobuf=wire.protobuf,
                    min_reconnect_delay=0.05, max_reconnect_delay=0.3)
    await client.connect()
    await eventually("server-side subscribed", lambda: [s.channel for s in events.subscribed] == [channel])
    for i in range(1, 4):
        herald.publish(channel, i)
    await eventually("3 publications", lambda: len(events.pubs) >= 3)
    await client.disconnect()
    for i in range(4, 7):
        herald.publish(channel, i)
    await client.connect()
    await eventually("recovered", lambda: len(events.subscribed) >= 2)
    assert events.subscribed[-1].recovered and events.subscribed[-1].was_recovering, events.subscribed[-1]
    await eventually("6 publications", lambda: len(events.pubs) >= 6)
    assert [(c, p.offset) for c, p in events.pubs] == [(channel, i) for i in range(1, 7)], events.pubs
    assert [wire.data(p.data) for _, p in events.pubs] == list(range(1, 7))
    await client.disconnect()


class Backend(ServerSide):
    """Server-side subscriptions and their ends, and the connection's
    states, for the backend's actions."""

    def __init__(self) -> None:
        super().__init__()
        self.unsubscribed = []
        self.connects = 0
        self.connecting = []
        self.disconnected = []

    async def on_unsubscribed(self, ctx: ServerUnsubscribedContext) -> None:
        self.unsubscribed.append(ctx)

    async def on_connected(self, ctx) -> None:
        self.connects += 1

    async def on_connecting(self, ctx: ConnectingContext) -> None:
        self.connecting.append(ctx.code)

    async def on_disconnected(self, ctx: DisconnectedContext) -> None:
        self.disconnected.append(ctx.code)


async def backend_actions(herald: Herald, wire: Wire) -> None:
    """The backend subscribes a connected user from a position and
    unsubscribes it (server-side subscription events), disconnects it with
    reconnect (the SDK reconnects) and bans it (the SDK stops)."""
    url = f"ws://127.0.0.1:{herald.port}/connection/websocket"
    user = f"py-api-{wire.name}"
    channel = f"chat:py-api-{wire.name}"
    # A pattern grants permissions only: no server-side subscription of its own.
    tok = token(user, channels=("chat:py-none-*",))

    async def get_token() -> str:
        return tok

    for i in range(1, 3):
        herald.publish(channel, i)
    events = Backend()
    client = Client(url, events=events, token=tok, get_token=get_token, use_protobuf=wire.protobuf,
                    min_reconnect_delay=0.05, max_reconnect_delay=0.3)
    await client.connect()
    await eventually("connected", lambda: events.connects == 1)
    status, _ = herald.api("POST", f"/api/v1/users/{user}/subscriptions", {"channel": channel, "since": {"seq": 1}})
    assert status == 202, status
    await eventually("subscribed by the backend", lambda: [s.channel for s in events.subscribed] == [channel])
    herald.publish(channel, 3)
    await eventually("from after seq 1, then live", lambda: len(events.pubs) >= 2)
    assert [p.offset for _, p in events.pubs] == [2, 3], events.pubs
    herald.api("DELETE", f"/api/v1/users/{user}/subscriptions/{channel}")
    await eventually("unsubscribed by the backend", lambda: [u.channel for u in events.unsubscribed] == [channel])
    herald.api("POST", f"/api/v1/users/{user}/disconnect", {"reconnect": True})
    await eventually("reconnected", lambda: events.connects == 2)
    assert 3011 in events.connecting, events.connecting
    herald.api("POST", f"/api/v1/users/{user}/disconnect", {"reconnect": False, "ban_seconds": 60})
    await eventually("stopped", lambda: events.disconnected)
    assert events.disconnected[0] == 3503, events.disconnected
    await client.disconnect()


async def run(herald: Herald, wire: Wire) -> None:
    url = f"ws://127.0.0.1:{herald.port}/connection/websocket"
    channel = f"chat:py-{wire.name}"

    async def get_token() -> str:
        return token("py-user")

    client = Client(url, events=ClientEventHandler(), token=token("py-user"), get_token=get_token,
                    use_protobuf=wire.protobuf, min_reconnect_delay=0.05, max_reconnect_delay=0.3)
    rec = Recorder()
    sub = client.new_subscription(channel, events=rec)
    await client.connect()
    await sub.subscribe()
    await eventually("subscribed", lambda: len(rec.subscribed) == 1)
    assert rec.subscribed[0].recoverable and rec.subscribed[0].positioned

    # Receive in order, data as published, Herald's id in the tags.
    ids = [herald.publish(channel, {"i": i, "text": f"a\nb{i}"})["id"] for i in range(1, 6)]
    await eventually("5 publications", lambda: len(rec.pubs) >= 5)
    assert [p.offset for p in rec.pubs] == [1, 2, 3, 4, 5], [p.offset for p in rec.pubs]
    assert [wire.data(p.data) for p in rec.pubs] == [{"i": i, "text": f"a\nb{i}"} for i in range(1, 6)]
    assert [p.tags["herald_id"] for p in rec.pubs] == ids

    # Publish from the SDK.
    await sub.publish(wire.payload({"from": "python"}))
    await eventually("own publication", lambda: len(rec.pubs) >= 6)
    assert rec.pubs[5].offset == 6 and wire.data(rec.pubs[5].data) == {"from": "python"}

    # History with a limit and a position.
    epoch = rec.subscribed[0].stream_position.epoch
    hist = await sub.history(limit=2, since=StreamPosition(offset=3, epoch=epoch))
    assert [p.offset for p in hist.publications] == [4, 5], hist

    # disconnect(), missed messages, connect(): recovered, nothing lost or doubled.
    await client.disconnect()
    for i in range(7, 12):
        herald.publish(channel, i)
    await client.connect()
    await eventually("resubscribed", lambda: len(rec.subscribed) >= 2)
    assert rec.subscribed[-1].recovered and rec.subscribed[-1].was_recovering, rec.subscribed[-1]
    herald.publish(channel, 12)
    await eventually("12 publications", lambda: len(rec.pubs) >= 12)
    assert [p.offset for p in rec.pubs] == list(range(1, 13)), [p.offset for p in rec.pubs]

    await client.disconnect()


async def restart(herald: Herald, wire: Wire) -> None:
    """A server restart (kill -9), messages published after it: the SDK
    reconnects and recovers them, nothing missing or doubled."""
    url = f"ws://127.0.0.1:{herald.port}/connection/websocket"
    channel = f"chat:py-restart-{wire.name}"
    client = Client(url, events=ClientEventHandler(), token=token("py-restart"), use_protobuf=wire.protobuf,
                    min_reconnect_delay=0.05, max_reconnect_delay=0.3)
    rec = Recorder()
    sub = client.new_subscription(channel, events=rec)
    await client.connect()
    await sub.subscribe()
    await eventually("subscribed", lambda: len(rec.subscribed) == 1)
    for i in range(1, 4):
        herald.publish(channel, i)
    await eventually("3 publications", lambda: len(rec.pubs) >= 3)
    herald.kill()
    herald.start()
    for i in range(4, 7):
        herald.publish(channel, i)
    await eventually("resubscribed", lambda: len(rec.subscribed) >= 2)
    assert rec.subscribed[-1].recovered, rec.subscribed[-1]
    herald.publish(channel, 7)
    await eventually("7 publications", lambda: len(rec.pubs) >= 7)
    assert [p.offset for p in rec.pubs] == list(range(1, 8)), [p.offset for p in rec.pubs]
    assert [wire.data(p.data) for p in rec.pubs] == list(range(1, 8))
    await client.disconnect()


async def presence(herald: Herald, wire: Wire) -> None:
    """A room: join, presence, presence stats, leave."""
    url = f"ws://127.0.0.1:{herald.port}/connection/websocket"
    room = f"room:py-{wire.name}"
    status, _ = herald.api("PUT", f"/api/v1/rooms/{room}", {"host": "host"})
    assert status == 201, status
    clients = []
    for user in ("py-alice", "py-bob"):
        clients.append(Client(url, events=ClientEventHandler(), token=token(user), use_protobuf=wire.protobuf))
    a, b = clients
    rec_a, rec_b = Recorder(), Recorder()
    sub_a = a.new_subscription(room, events=rec_a, join_leave=True)
    sub_b = b.new_subscription(room, events=rec_b)
    await a.connect()
    await sub_a.subscribe()
    await eventually("alice subscribed", lambda: len(rec_a.subscribed) == 1)
    await b.connect()
    await sub_b.subscribe()
    await eventually("bob subscribed", lambda: len(rec_b.subscribed) == 1)
    await eventually("bob joined", lambda: "py-bob" in rec_a.joins)
    present = await sub_a.presence()
    assert sorted(i.user for i in present.clients.values()) == ["py-alice", "py-bob"], present
    stats = await sub_a.presence_stats()
    assert (stats.num_clients, stats.num_users) == (2, 2), stats
    await sub_b.unsubscribe()
    await eventually("bob left", lambda: "py-bob" in rec_a.leaves)
    for c in clients:
        await c.disconnect()


async def refresh(herald: Herald, wire: Wire) -> None:
    """Tokens that live 2 s, refreshed through get_token: the connection
    stays up and keeps receiving."""
    url = f"ws://127.0.0.1:{herald.port}/connection/websocket"
    channel = f"chat:py-refresh-{wire.name}"
    fetched = []

    async def get_token() -> str:
        fetched.append(1)
        return token("py-refresh", ttl=2)

    drops = Drops()
    client = Client(url, events=drops, token=token("py-refresh", ttl=2), get_token=get_token,
                    use_protobuf=wire.protobuf)
    rec = Recorder()
    sub = client.new_subscription(channel, events=rec)
    await client.connect()
    await sub.subscribe()
    await eventually("subscribed", lambda: len(rec.subscribed) == 1)
    await eventually("two refreshes", lambda: len(fetched) >= 2)
    herald.publish(channel, "still here")
    await eventually("a publication after the refreshes", lambda: len(rec.pubs) == 1)
    assert wire.data(rec.pubs[0].data) == "still here"
    assert drops.drops == [], f"the connection dropped: {drops.drops}"
    await client.disconnect()


def main() -> int:
    herald = Herald()
    try:
        for wire in (Wire(False), Wire(True)):
            asyncio.run(asyncio.wait_for(run(herald, wire), timeout=120))
            asyncio.run(asyncio.wait_for(server_side(herald, wire), timeout=120))
            asyncio.run(asyncio.wait_for(restart(herald, wire), timeout=120))
            asyncio.run(asyncio.wait_for(presence(herald, wire), timeout=120))
            asyncio.run(asyncio.wait_for(refresh(herald, wire), timeout=120))
            asyncio.run(asyncio.wait_for(backend_actions(herald, wire), timeout=120))
            print(f"centrifuge-python ({wire.name}): ok")
    finally:
        herald.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
