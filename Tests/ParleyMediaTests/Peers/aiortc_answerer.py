"""A third-party WebRTC peer for Parley's tests: aiortc answers an offer and is the DTLS client.

aiortc's DTLS client offers only ECDHE-ECDSA cipher suites (RFC 8827's mandatory one and its
kin), so it completes a handshake only with a peer whose certificate is ECDSA. It sends a sine tone
and records what it hears.

Protocol, one JSON object per line:
  stdin:  {"offer": SDP}, then {"candidate": C, "sdpMid": M, "sdpMLineIndex": I} for each of the
          offerer's candidates, then {"candidate": null} when it has no more
  stdout: {"answer": SDP} (candidates included), then {"dtls": STATE} on each change of the DTLS
          transport's state, then {"done": true} once it has recorded for --seconds after DTLS
          connected (or {"done": false, "why": …} if it never did)
"""

import argparse
import array
import asyncio
import fractions
import json
import math
import sys

import aioice.ice
import av
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRecorder
from aiortc.sdp import candidate_from_sdp

# The tests run in a network namespace with only loopback up, and aioice leaves 127.0.0.1 out of
# its host candidates: loopback is where both peers are here.
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []

RATE = 48000
FRAME = 960  # 20 ms


class Tone(MediaStreamTrack):
    kind = "audio"

    def __init__(self, hertz):
        super().__init__()
        self.hertz = hertz
        self.sent = 0
        self.start = None

    async def recv(self):
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        wait = self.start + self.sent / RATE - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        samples = array.array("h", (int(0.3 * 32767 * math.sin(2 * math.pi * self.hertz * (self.sent + i) / RATE)) for i in range(FRAME)))
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(samples.tobytes())
        frame.sample_rate = RATE
        frame.pts = self.sent
        frame.time_base = fractions.Fraction(1, RATE)
        self.sent += FRAME
        return frame


def say(**message):
    print(json.dumps(message), flush=True)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tone", type=float, default=660)
    parser.add_argument("--record", required=True)
    parser.add_argument("--seconds", type=float, default=3)
    arguments = parser.parse_args()

    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    async def read():
        line = await reader.readline()
        if not line:
            raise SystemExit("stdin closed")
        return json.loads(line)

    offer = (await read())["offer"]
    candidates = []
    while True:
        message = await read()
        if message.get("candidate") is None:
            break
        candidates.append(message)

    # No ICE servers: aiortc's default is a public STUN server, and the tests and benchmarks send
    # nothing beyond loopback and their own namespaces.
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    recorder = MediaRecorder(arguments.record)
    connected = asyncio.Event()

    @pc.on("track")
    def on_track(track):
        if track.kind == "audio":
            recorder.addTrack(track)

    await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    for message in candidates:
        candidate = candidate_from_sdp(message["candidate"].removeprefix("candidate:"))
        candidate.sdpMid = message.get("sdpMid")
        candidate.sdpMLineIndex = message.get("sdpMLineIndex")
        await pc.addIceCandidate(candidate)
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.sender.replaceTrack(Tone(arguments.tone))
            transceiver.direction = "sendrecv"

    answer = await pc.createAnswer()
    await pc.setLocalDescription(answer)

    dtls = pc.getTransceivers()[0].sender.transport

    @dtls.on("statechange")
    def on_dtls_state():
        say(dtls=dtls.state)
        if dtls.state == "connected":
            connected.set()

    say(answer=pc.localDescription.sdp)
    await recorder.start()
    try:
        await asyncio.wait_for(connected.wait(), timeout=15)
    except asyncio.TimeoutError:
        say(done=False, why=f"DTLS did not connect (its state: {dtls.state})")
        await recorder.stop()
        await pc.close()
        return
    await asyncio.sleep(arguments.seconds)
    await recorder.stop()
    await pc.close()
    say(done=True)


asyncio.run(main())
