// Rooms. A room is a backend that keeps `participants` (device → {user, device, display,
// talking, muted, self}) and emits `changed`; the view draws any backend the same way, so the
// AudioBridge kind (server-side mixing on Janus) plugs in beside the mesh kind.
import { LevelMeter, play } from './audio.js';
import { JanusSession } from './janus.js';

const TALKING_DB = -45;

/** The end of leaving, for any room: the microphone off, nobody listed, the server told. */
async function leftRoom(room) {
  for (const track of room.stream.getTracks()) track.stop();
  room.participants.clear();
  room.changed();
  await room.signaling.request('room.leave', { room: room.name }).catch(() => {});
}

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
    this.meterTimer = setInterval(() => this.measureTalking(), 200);
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

  measureTalking() {
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
    await leftRoom(this);
  }

  changed() {
    this.dispatchEvent(new Event('changed'));
  }
}

/**
 * AudioBridge room: one peer connection to Janus, which mixes everyone; who talks comes from
 * Janus's talking events (the browser sends audio levels, RFC 6464, with every packet).
 */
export class AudioBridgeRoom extends EventTarget {
  constructor({ name, signaling, self, stream }) {
    super();
    this.name = name;
    this.signaling = signaling;
    this.self = self;
    this.stream = stream;
    this.participants = new Map();     // Janus participant id → {user?, display, talking, muted, self}
    this.muted = false;
  }

  static kind = 'audiobridge';

  /** After the `room.join` ack: joins on Janus with the server's token. */
  async joined(ack) {
    const ticket = ack.media.janus;
    this.janus = await JanusSession.open(ticket.url);
    this.janus.onclose = (reason) => this.dispatchEvent(new CustomEvent('lost', { detail: reason }));
    this.handle = await this.janus.attach('janus.plugin.audiobridge', (frame) => this.event(frame));
    const joinBody = { request: 'join', room: ticket.room, display: this.self.display, token: ticket.token };
    if (ticket.participant) joinBody.id = ticket.participant;
    const answer = await this.handle.message(joinBody);
    const data = answer.plugindata.data;
    this.id = data.id;
    this.participants.set(this.id, { display: this.self.display, device: this.self.device, self: true, talking: false, muted: false });
    this.update(data.participants ?? []);

    const pc = new RTCPeerConnection({ iceServers: this.signaling.iceServers });
    this.pc = pc;
    for (const track of this.stream.getAudioTracks()) pc.addTrack(track, this.stream);
    pc.ontrack = (e) => { this.audio = play(e.streams[0] ?? new MediaStream([e.track])); this.meter = new LevelMeter(this.audio.srcObject); };
    pc.onicecandidate = (e) => this.handle.trickle(e.candidate ? e.candidate.toJSON() : null).catch(() => {});
    await pc.setLocalDescription(await pc.createOffer());
    const configured = await this.handle.message({ request: 'configure', muted: false }, { type: 'offer', sdp: pc.localDescription.sdp });
    await pc.setRemoteDescription(configured.jsep);
    this.changed();
  }

  event(frame) {
    const data = frame.plugindata?.data;
    if (frame.janus === 'hangup') return;
    if (!data) return;
    switch (data.audiobridge) {
    case 'joined':
    case 'event':
      if (data.participants) this.update(data.participants);
      if (data.leaving !== undefined) { this.participants.delete(data.leaving); this.changed(); }
      if (data.kicked !== undefined) {
        // A kick of this page while it joins again on a new session is the server replacing its
        // admission (`roomSessionLost` joins Janus again), not a removal.
        if (data.kicked === this.id) {
          if (this.rejoining) this.kicked = true;
          else this.dispatchEvent(new CustomEvent('ended', { detail: 'You were removed from the room.' }));
        }
        else { this.participants.delete(data.kicked); this.changed(); }
      }
      break;
    case 'talking':
    case 'stopped-talking': {
      const p = this.participants.get(data.id);
      if (p) { p.talking = data.audiobridge === 'talking'; this.changed(); }
      break;
    }
    case 'destroyed':
      this.dispatchEvent(new CustomEvent('ended', { detail: 'The room was closed.' }));
      break;
    }
  }

  update(list) {
    for (const entry of list) {
      const known = this.participants.get(entry.id);
      this.participants.set(entry.id, { display: entry.display ?? String(entry.id), user: entry.display, device: String(entry.id),
                                        self: entry.id === this.id, talking: known?.talking ?? false, muted: !!entry.muted });
    }
    this.changed();
  }

  async setMuted(muted) {
    this.muted = muted;
    for (const track of this.stream.getAudioTracks()) track.enabled = !muted;
    const me = this.participants.get(this.id);
    if (me) me.muted = muted;
    this.changed();
    await this.handle?.message({ request: 'configure', muted }).catch(() => {});
  }

  async leave() {
    await this.handle?.message({ request: 'leave' }).catch(() => {});
    await this.handle?.hangup().catch(() => {});
    this.pc?.close();
    this.meter?.close();
    if (this.audio) this.audio.srcObject = null;
    await this.janus?.close();
    await leftRoom(this);
  }

  changed() {
    this.dispatchEvent(new Event('changed'));
  }
}
