// Rooms. A room is a backend that keeps `participants` (device → {user, device, display,
// talking, muted, self}) and emits `changed`; the view draws any backend the same way, so the
// AudioBridge kind (server-side mixing on Janus) plugs in beside the mesh kind.
import { LevelMeter, play } from './audio.js';

const TALKING_DB = -45;

/** Mesh room: one peer connection per other member. The newcomer offers; the lower device id is polite. */
export class MeshRoom extends EventTarget {
  constructor({ name, signaling, self, stream }) {
    super();
    this.name = name;
    this.signaling = signaling;
    this.self = self;                         // {user, device, display}
    this.stream = stream;
    this.peers = new Map();                   // device → {pc, makingOffer, polite, pending, audio, meter}
    this.participants = new Map();
    this.muted = false;
  }

  static kind = 'mesh';

  /** After the `room.join` ack. */
  joined(ack) {
    this.participants.set(this.self.device, { ...this.self, self: true, talking: false, muted: false });
    for (const p of ack.participants) {
      this.participants.set(p.device, { ...p, talking: false, muted: false });
      this.peer(p.device, true);              // we are the newcomer: we offer
    }
    this.meterTimer = setInterval(() => this.meter(), 200);
    this.changed();
  }

  frame(frame) {
    if (frame.room !== this.name) return;
    switch (frame.type) {
    case 'room.participant.joined':
      this.participants.set(frame.device, { user: frame.user, device: frame.device, display: frame.display, talking: false, muted: false });
      this.changed();
      break;
    case 'room.participant.left':
      this.closePeer(frame.device);
      this.participants.delete(frame.device);
      this.changed();
      break;
    case 'room.signal':
      this.signalled(frame).catch((error) => console.warn('parley: room signal', error));
      break;
    }
  }

  peer(device, offering) {
    let peer = this.peers.get(device);
    if (peer) return peer;
    const pc = new RTCPeerConnection({ iceServers: this.signaling.iceServers });
    peer = { pc, makingOffer: false, ignoreOffer: false, polite: this.self.device < device, pending: [], offering };
    this.peers.set(device, peer);
    pc.onicecandidate = (e) => this.send(device, { candidate: e.candidate ? e.candidate.toJSON() : null });
    pc.ontrack = (e) => {
      peer.audio = play(e.streams[0] ?? new MediaStream([e.track]));
      peer.meter = new LevelMeter(peer.audio.srcObject);
    };
    pc.onnegotiationneeded = async () => {
      if (!peer.offering && !pc.remoteDescription) return;   // the newcomer makes the first offer
      try {
        peer.makingOffer = true;
        await pc.setLocalDescription();
        this.send(device, { description: { type: pc.localDescription.type, sdp: pc.localDescription.sdp } });
      } finally {
        peer.makingOffer = false;
      }
    };
    for (const track of this.stream.getTracks()) pc.addTrack(track, this.stream);
    return peer;
  }

  async signalled({ from, description, candidate }) {
    const peer = this.peer(from.device, false);
    const pc = peer.pc;
    if (description) {
      const collision = description.type === 'offer' && (peer.makingOffer || pc.signalingState !== 'stable');
      peer.ignoreOffer = !peer.polite && collision;
      if (peer.ignoreOffer) return;
      await pc.setRemoteDescription(description);
      for (const c of peer.pending.splice(0)) await pc.addIceCandidate(c).catch(() => {});
      if (description.type === 'offer') {
        await pc.setLocalDescription();
        this.send(from.device, { description: { type: pc.localDescription.type, sdp: pc.localDescription.sdp } });
      }
    } else if (candidate) {
      if (!pc.remoteDescription) peer.pending.push(candidate);
      else await pc.addIceCandidate(candidate).catch((e) => { if (!peer.ignoreOffer) console.warn(e); });
    }
  }

  send(device, fields) {
    this.signaling.request('room.signal', { room: this.name, to: device, ...fields }).catch(() => {});
  }

  meter() {
    let change = false;
    for (const [device, peer] of this.peers) {
      const p = this.participants.get(device);
      if (!p || !peer.meter) continue;
      const talking = peer.meter.levelDb() > TALKING_DB;
      if (talking !== p.talking) { p.talking = talking; change = true; }
    }
    if (change) this.changed();
  }

  setMuted(muted) {
    this.muted = muted;
    for (const track of this.stream.getAudioTracks()) track.enabled = !muted;
    this.participants.get(this.self.device).muted = muted;
    this.changed();
  }

  closePeer(device) {
    const peer = this.peers.get(device);
    if (!peer) return;
    peer.meter?.close();
    if (peer.audio) peer.audio.srcObject = null;
    peer.pc.close();
    this.peers.delete(device);
  }

  async leave() {
    clearInterval(this.meterTimer);
    for (const device of [...this.peers.keys()]) this.closePeer(device);
    for (const track of this.stream.getTracks()) track.stop();
    this.participants.clear();
    this.changed();
    await this.signaling.request('room.leave', { room: this.name }).catch(() => {});
  }

  changed() {
    this.dispatchEvent(new Event('changed'));
  }
}
