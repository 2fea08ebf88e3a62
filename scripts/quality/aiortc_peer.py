#!/usr/bin/env python3
"""The aiortc callee of `scripts/bench-setup.sh`: a third-party WebRTC stack answering a Parley call.

Speaks signaling protocol v1 (docs/protocol.md) over WebSocket as any client would: a development
token, `hello`, then for the first `call.incoming`: `call.ringing` and `--ring` seconds of ringing
(none: it answers at once), `call.accept`, the caller's offer answered with every candidate in the
answer (aiortc gathers before it answers), the caller's trickled candidates added as they come. It
sends a 440 Hz tone and plays nothing. It prints `ready` once the server welcomed it, and when the
call has ended one JSON line, {"timeline": …}, the call's moments in Unix milliseconds as the other
ends of the benchmark write them: started (call.incoming), answered, iceConnected, firstAudio (the
first frame decoded from the caller). Runs in the project's aiortc environment (.build-python).
"""

import argparse
import asyncio
import json
import sys
import time
import urllib.request

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer
from aiortc.sdp import candidate_from_sdp
from websockets.asyncio.client import connect


def unix_ms():
    return time.time() * 1000


def token(server, user):
    """A development token; the wire may lose the first tries."""
    request = urllib.request.Request(f"{server}/v1/dev/tokens", data=json.dumps({"user": user}).encode(),
                                     headers={"content-type": "application/json"})
    for _ in range(60):
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.load(response)["token"]
        except OSError:
            time.sleep(0.5)
    sys.exit(f"aiortc_peer: no token from {server}")


class Callee:
    def __init__(self, socket, ring):
        self.socket, self.ring = socket, ring
        self.call, self.pc, self.pending = None, None, []
        self.timeline, self.ended = {}, asyncio.Event()
        self.next_id = 0

    async def send(self, kind, **fields):
        self.next_id += 1
        await self.socket.send(json.dumps({"type": kind, "id": f"a{self.next_id}", **fields}))

    async def incoming(self, message):
        self.call = message["call"]
        self.timeline["started"] = unix_ms()
        if self.ring > 0:
            await self.send("call.ringing", call=self.call)
            await asyncio.sleep(self.ring)
        self.timeline["answered"] = unix_ms()
        # No ICE servers: aiortc's default is a public STUN server, and the tests and benchmarks send
        # nothing beyond loopback and their own namespaces.
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTrack(MediaPlayer("sine=frequency=440:sample_rate=48000", format="lavfi").audio)

        @self.pc.on("track")
        def on_track(track):
            asyncio.ensure_future(self.listen(track))

        @self.pc.on("iceconnectionstatechange")
        def on_ice():
            if self.pc.iceConnectionState == "completed":
                self.timeline.setdefault("iceConnected", unix_ms())

        await self.send("call.accept", call=self.call)

    async def listen(self, track):
        try:
            await track.recv()
            self.timeline.setdefault("firstAudio", unix_ms())
            while True:
                await track.recv()
        except Exception:
            pass  # the track ended with the call

    async def signal(self, message):
        if self.pc is None or message.get("call") != self.call:
            return
        description = message.get("description")
        if description and description["type"] == "offer":
            await self.pc.setRemoteDescription(RTCSessionDescription(description["sdp"], "offer"))
            for candidate in self.pending:
                await self.pc.addIceCandidate(candidate)
            self.pending = []
            await self.pc.setLocalDescription(await self.pc.createAnswer())
            local = self.pc.localDescription
            await self.send("call.signal", call=self.call, description={"type": local.type, "sdp": local.sdp})
        elif message.get("candidate"):
            c = message["candidate"]
            line = c["candidate"].removeprefix("candidate:")
            if not line:
                return
            candidate = candidate_from_sdp(line)
            candidate.sdpMid, candidate.sdpMLineIndex = c.get("sdpMid"), c.get("sdpMLineIndex")
            if self.pc.remoteDescription:
                await self.pc.addIceCandidate(candidate)
            else:
                self.pending.append(candidate)

    async def end(self):
        if self.pc:
            await self.pc.close()
        self.timeline["ended"] = unix_ms()
        self.ended.set()


async def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="the Parley server's HTTP URL")
    parser.add_argument("--user", required=True)
    parser.add_argument("--device", default="aiortc")
    parser.add_argument("--ring", type=float, default=0, help="seconds to ring before answering (0: at once)")
    parser.add_argument("--timeout", type=float, default=120, help="give up after this many seconds")
    args = parser.parse_args()

    url = args.server.replace("http", "ws", 1) + "/v1/signal?access_token=" + token(args.server, args.user)
    async with connect(url, subprotocols=["parley.v1"]) as socket:
        callee = Callee(socket, args.ring)
        await callee.send("hello", device=args.device, client={"name": "parley-setup-aiortc", "version": "1", "platform": "linux"})

        async def receive():
            async for text in socket:
                message = json.loads(text)
                kind = message.get("type")
                if kind == "welcome":
                    print("ready", flush=True)
                elif kind == "call.incoming" and callee.call is None:
                    await callee.incoming(message)
                elif kind == "call.signal":
                    await callee.signal(message)
                elif kind == "call.ended" and message.get("call") == callee.call:
                    await callee.end()
                    return

        # An error in a message, or no end in time, ends the script with its traceback (and no
        # timeline): the benchmark shows the last lines of what it printed.
        try:
            await asyncio.wait_for(receive(), args.timeout)
        finally:
            if not callee.ended.is_set():
                await callee.end()
    print(json.dumps({"timeline": callee.timeline}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
