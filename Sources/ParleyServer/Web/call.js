// One one-to-one call: an RTCPeerConnection driven by perfect negotiation (the callee is polite
// and makes no offer before its first answer), ICE restarts when ICE fails or media stops
// arriving, quality sampling.
// Only the caller restarts ICE: the callee asks for a restart with `call.signal {restartIce: true}`,
// because a Linux peer (webrtcbin) cannot roll back an offer that crosses its own.
import { QualityMonitor, MediaArrivals, sampleFromStats, callQuality } from './quality.js';

const MAX_ICE_RESTARTS = 3;
const QUALITY_INTERVAL_MS = 1000;
const REPORT_INTERVAL_MS = 10000;
const HISTORY = 180;
const NO_MEDIA_AFTER_MS = 5000;   // as the SDK's CallManager.Configuration.noMediaAfter

/**
 * One RTCPeerConnection and its perfect negotiation: the call's, or, while the call rings, a
 * caller's path to one callee device that rang early (`device`: its signals name it). A path made
 * while ringing has no track to send: nothing is captured nor sent on it until `Call.connect`
 * gives it the local tracks, and what it receives is not played before then.
 */
class Path {
  constructor({ iceServers, polite, device, send, onTrack, onIce }) {
    this.pc = new RTCPeerConnection({ iceServers });
    this.polite = polite;
    this.device = device;
    this.send = send;
    this.makingOffer = false;
    this.ignoreOffer = false;
    this.answered = false;            // the polite side has sent its first answer
    this.pendingCandidates = [];
    this.remoteStream = new MediaStream();
    this.pc.ontrack = (event) => {
      this.remoteStream.addTrack(event.track);
      onTrack(this);
    };
    this.pc.onicecandidate = (event) => this.signal({ candidate: event.candidate ? event.candidate.toJSON() : null });
    this.pc.onnegotiationneeded = () => this.negotiate();
    this.pc.oniceconnectionstatechange = () => onIce(this);
  }

  get connected() { return ['connected', 'completed'].includes(this.pc.iceConnectionState); }

  signal(fields) {
    if (!this.closed) this.send(this.device ? { device: this.device, ...fields } : fields);
  }

  async negotiate() {
    if (this.closed) return;
    // The callee answers first; anything it wants to change waits for that answer.
    if (this.polite && !this.answered) return;
    try {
      this.makingOffer = true;
      await this.pc.setLocalDescription();
      this.signal({ description: { type: this.pc.localDescription.type, sdp: this.pc.localDescription.sdp } });
    } catch (error) {
      console.warn('parley: offer failed', error);
    } finally {
      this.makingOffer = false;
    }
  }

  /** A description or candidate from the far side. */
  async received({ description, candidate }) {
    const pc = this.pc;
    if (this.closed) return;
    if (description) {
      const collision = description.type === 'offer' && (this.makingOffer || pc.signalingState !== 'stable');
      this.ignoreOffer = !this.polite && collision;
      if (this.ignoreOffer) return;
      await pc.setRemoteDescription(description);
      // A path made while ringing had no track when the offer came: it answers able to send (this
      // client never means to only receive), so that the track it gets at the answer goes out
      // without another negotiation. Before any other wait: the track may come meanwhile.
      if (description.type === 'offer') {
        for (const transceiver of pc.getTransceivers()) {
          if (transceiver.direction === 'recvonly' && transceiver.receiver.track.kind === 'audio') transceiver.direction = 'sendrecv';
        }
      }
      for (const buffered of this.pendingCandidates.splice(0)) await this.addCandidate(buffered);
      if (description.type === 'offer') {
        await pc.setLocalDescription();
        this.signal({ description: { type: pc.localDescription.type, sdp: pc.localDescription.sdp } });
        // Back in stable, the browser fires negotiationneeded again if a change is still pending.
        if (this.polite) this.answered = true;
      }
    } else if (candidate !== undefined) {
      if (candidate === null) return;   // end of candidates: nothing to do in a browser
      if (!pc.remoteDescription) this.pendingCandidates.push(candidate);
      else await this.addCandidate(candidate);
    }
  }

  async addCandidate(candidate) {
    try {
      await this.pc.addIceCandidate(candidate);
    } catch (error) {
      if (!this.ignoreOffer) console.warn('parley: candidate refused', error);
    }
  }

  close() {
    this.closed = true;
    this.pc.close();
  }
}

/**
 * States: outgoing → (ringing) → connecting → active ⇄ reconnecting → ended;
 *         incoming → connecting → active … → ended.
 * Events: `state`, `remote-stream` (MediaStream), `quality` (report), `updated` (far side's mute/hold),
 *         `receiving` (whether the far side's audio arrives: false after five seconds without a packet),
 *         `recording` ({state, here, change}), `recorded` ({blob, url, seconds, type}).
 *
 * Recording with consent (protocol.md): `requestRecording()` asks the far side; only its
 * `accepted` starts the recorder here (both voices mixed, by MediaRecorder); either side stops it.
 * States: off → asking → on(here) → off; off → asked → on(there) → off.
 */
export class Call extends EventTarget {
  constructor({ id, direction, peer, media, signaling }) {
    super();
    this.id = id;
    this.direction = direction;       // 'outgoing' | 'incoming'
    this.peer = peer;                 // {user, device?, name?}
    this.media = media;               // {audio, video}
    this.signaling = signaling;
    this.polite = direction === 'incoming';
    this.state = direction;
    this.muted = false;
    this.held = false;
    this.remote = { muted: false, held: false, video: media.video };
    this.history = [];                // quality reports over time, newest last
    this.receiving = true;            // whether the far side's packets arrive (once connected)
    this.iceRestarts = 0;
    this.path = undefined;            // the call's peer connection and its negotiation
    this.early = new Map();           // outgoing, while ringing: a path to each device that rang early
    this.recording = { state: 'off', here: false, change: undefined };
  }

  get pc() { return this.path?.pc; }
  /** Answered, with a peer connection of its own: mute, hold, recording and device changes apply. */
  get live() { return !!this.path && !['incoming', 'outgoing', 'ended'].includes(this.state); }
  get remoteStream() { return this.path?.remoteStream; }

  /** Whether this call connects while it rings (protocol.md, "Connecting while ringing"): audio calls only. */
  get connectsWhileRinging() { return !this.media.video; }

  makePath(iceServers, device) {
    return new Path({
      iceServers, polite: this.polite, device,
      send: (fields) => this.signal(fields),
      onTrack: (path) => this.trackArrived(path),
      onIce: (path) => { if (path === this.path) this.iceChanged(); },
    });
  }

  /**
   * Incoming, while it rings: the peer connection, made now with nothing to send (the microphone
   * is asked for at the answer), answers the caller's offer, so that ICE and DTLS are done before
   * the answer. Nothing it receives is played before `connect`.
   */
  prepare(iceServers) {
    if (this.path || this.state !== 'incoming') return;
    this.path = this.makePath(iceServers);
  }

  /** Outgoing: `device` rang early; a path to it, offering to receive and (from the answer on) send audio. */
  connectEarly(device, iceServers) {
    if (this.state !== 'outgoing' || !device) return;
    // Rung early again (its session began anew): the old path leads nowhere.
    this.early.get(device)?.close();
    const path = this.makePath(iceServers, device);
    this.early.set(device, path);
    path.pc.addTransceiver('audio', { direction: 'sendrecv' });
  }

  /**
   * The call's media starts: the callee once the server took its accept, the caller on
   * `call.accepted` (from `device`, the answering one). A path made while ringing becomes the
   * call's (the caller closes the others) and gets the local tracks; otherwise one is made now,
   * with them, and the caller's offer follows on its own.
   */
  connect(stream, iceServers, device) {
    this.stream = stream;
    if (this.direction === 'outgoing') {
      this.path = this.early.get(device);
      this.early.delete(device);
      for (const other of this.early.values()) other.close();
      this.early.clear();
    }
    this.path ??= this.makePath(iceServers);
    this.startSending(stream);
    this.setState(this.path.connected ? 'active' : 'connecting');
    if (this.path.connected) this.connectedAt ??= Date.now();
    // What arrived while ringing plays from now on.
    if (this.remoteStream.getTracks().length) this.dispatchEvent(new CustomEvent('remote-stream', { detail: this.remoteStream }));
    this.statsTimer = setInterval(() => this.sample(), QUALITY_INTERVAL_MS);
    this.reportTimer = setInterval(() => this.report(), REPORT_INTERVAL_MS);
    this.monitor = new QualityMonitor();
    if (this.pc.iceConnectionState === 'failed') this.restartIce();
  }

  /**
   * The local tracks go out: on the path's senders that have none yet (made while ringing: no new
   * negotiation), else added (a new path's offer, or the answer to the caller's, carries them).
   */
  startSending(stream) {
    this.applyLocalTracks();
    for (const track of stream.getTracks()) {
      const free = this.pc.getTransceivers().find((t) => !t.stopped && !t.sender.track && t.receiver.track.kind === track.kind);
      if (free) free.sender.replaceTrack(track).catch((error) => console.warn('parley: a track could not be sent', error));
      else this.pc.addTrack(track, stream);
    }
  }

  trackArrived(path) {
    // Played once the call is answered, from the path that became the call's.
    if (path !== this.path || this.state === 'incoming' || this.state === 'outgoing') return;
    this.dispatchEvent(new CustomEvent('remote-stream', { detail: this.remoteStream }));
  }

  /** A `call.signal` from the far side (`from.device`: which callee device, to a caller while it rings). */
  async received({ description, candidate, restartIce, from }) {
    if (this.state === 'ended') return;
    const device = from?.device;
    const path = this.early.get(device) ?? this.path;
    // (A late signal from a device whose path was closed at the answer goes nowhere.)
    if (!path || (path.device && device && path.device !== device)) return;
    await path.received({ description, candidate });
    // The callee asks; the browser runs the restart once any offer in flight is answered (on a path
    // still ringing, at once: the call's restart budget is for the call).
    if (restartIce && !this.polite) {
      if (path === this.path) this.restartIce();
      else path.pc.restartIce();
    }
  }

  signal(fields) {
    if (this.state === 'ended') return;
    this.signaling.request('call.signal', { call: this.id, ...fields }).catch((error) => {
      if (error.code !== 'call_ended') console.warn('parley: signal failed', error);
    });
  }

  iceChanged() {
    const ice = this.pc.iceConnectionState;
    // While ringing, a callee's path connects without the call: the answer finds it ready.
    if (this.state === 'incoming') return;
    if (ice === 'connected' || ice === 'completed') {
      this.iceRestarts = 0;
      if (!this.connectedAt) this.connectedAt = Date.now();
      this.setState('active');
    } else if (ice === 'disconnected') {
      if (this.state === 'active') this.setState('reconnecting');
    } else if (ice === 'failed') {
      if (this.state === 'active') this.setState('reconnecting');
      this.restartIce();
    }
  }

  /**
   * Restarts ICE (after it failed, or after the network changed); gives up after three tries. The
   * caller restarts; the callee asks the caller to, once it has answered (before that, its first
   * answer gathers afresh anyway).
   */
  restartIce() {
    if (!this.pc || this.state === 'ended') return;
    if (this.polite && !this.path.answered) return;
    if (this.iceRestarts >= MAX_ICE_RESTARTS) {
      this.dispatchEvent(new CustomEvent('failed', { detail: 'ice-failed' }));
      return;
    }
    this.iceRestarts += 1;
    if (this.polite) this.signal({ restartIce: true });
    else this.pc.restartIce();
  }

  setMuted(muted) {
    this.muted = muted;
    this.applyLocalTracks();
    this.update({ muted });
  }

  setHeld(held) {
    this.held = held;
    this.applyLocalTracks();
    this.update({ held });
  }

  applyLocalTracks() {
    for (const track of this.stream?.getAudioTracks() ?? []) track.enabled = !this.muted && !this.held;
    for (const track of this.stream?.getVideoTracks() ?? []) track.enabled = !this.held;
  }

  update(fields) {
    if (!this.live) return;
    this.signaling.request('call.update', { call: this.id, ...fields }).catch(() => {});
  }

  /** The far side's `call.updated`. */
  updated(frame) {
    if (frame.recording !== undefined) return this.recordingStep(frame.recording);
    for (const key of ['muted', 'held', 'video']) if (frame[key] !== undefined) this.remote[key] = frame[key];
    this.dispatchEvent(new CustomEvent('updated', { detail: this.remote }));
  }

  // Recording with consent

  /** Asks the far side to let this page record the call. */
  requestRecording() {
    if (!this.live || this.recording.state !== 'off') return;
    this.moveRecording('asking', false, 'requested-here');
    this.sendRecording('requested', () => this.recording.state === 'asking' && this.moveRecording('off', false, 'failed'));
  }

  /** Answers the far side's request. */
  answerRecording(consent) {
    if (this.recording.state !== 'asked') return;
    if (consent) this.moveRecording('on', false, 'accepted-here');
    else this.moveRecording('off', false, 'declined-here');
    this.sendRecording(consent ? 'accepted' : 'declined', () => {
      if (consent && this.recording.state === 'on' && !this.recording.here) this.moveRecording('off', false, 'failed');
    });
  }

  /** Stops the recording (either side may), or withdraws a request. */
  stopRecording() {
    const { state } = this.recording;
    if (state !== 'asking' && state !== 'on') return;
    this.sendRecording('stopped');
    this.finishRecorder();
    this.moveRecording('off', false, 'stopped-here');
  }

  /** The far side's step. */
  recordingStep(step) {
    const { state, here } = this.recording;
    if (step === 'requested' && (state === 'off' || state === 'asking')) this.moveRecording('asked', false, 'requested-there');
    else if (step === 'accepted' && state === 'asking') {
      this.moveRecording('on', true, 'accepted-there');
      this.startRecorder();
    } else if (step === 'declined' && state === 'asking') this.moveRecording('off', false, 'declined-there');
    else if (step === 'stopped' && (state === 'on' || state === 'asked' || state === 'asking')) {
      if (state === 'on' && here) this.finishRecorder();
      this.moveRecording('off', false, 'stopped-there');
    }
  }

  /** Sends a step; `onRefused` runs when the server refuses it (not when no answer came: it may have taken it). */
  /** After a new session: a request or recording the (restarted) server no longer holds is over. */
  serverRecording(state) {
    if (state !== 'off' || this.recording.state === 'off') return;
    if (this.recording.state === 'on' && this.recording.here) this.finishRecorder();
    this.moveRecording('off', false, 'failed');
  }

  sendRecording(step, onRefused = () => {}) {
    this.signaling.request('call.update', { call: this.id, recording: step }).catch((error) => { if (error?.code && error.code !== 'timeout') onRefused(error); });
  }

  moveRecording(state, here, change) {
    this.recording = { state, here, change };
    this.dispatchEvent(new CustomEvent('recording', { detail: this.recording }));
  }

  /** Both voices, mixed in Web Audio, into MediaRecorder (Ogg/Opus where it can, else WebM/Opus). */
  async startRecorder() {
    let context;
    try {
      context = new AudioContext();
      // Started by a network event, not a click: autoplay rules may leave it suspended (and the file silent).
      await context.resume();
      if (context.state !== 'running') throw new Error('audio is suspended');
      const destination = context.createMediaStreamDestination();
      this.recordingMix = { context, destination };
      for (const stream of [this.stream, this.remoteStream]) {
        if (stream?.getAudioTracks().length) context.createMediaStreamSource(new MediaStream(stream.getAudioTracks())).connect(destination);
      }
      const type = ['audio/ogg;codecs=opus', 'audio/webm;codecs=opus'].find((t) => MediaRecorder.isTypeSupported(t));
      const recorder = new MediaRecorder(destination.stream, type ? { mimeType: type } : undefined);
      const chunks = [];
      const startedAt = Date.now();
      recorder.ondataavailable = (event) => { if (event.data.size) chunks.push(event.data); };
      recorder.onstop = () => {
        context.close();
        if (this.recordingMix?.context === context) this.recordingMix = undefined;
        const blob = new Blob(chunks, { type: recorder.mimeType });
        const detail = { blob, url: URL.createObjectURL(blob), type: recorder.mimeType, seconds: (Date.now() - startedAt) / 1000 };
        this.recorded = detail;
        this.dispatchEvent(new CustomEvent('recorded', { detail }));
      };
      // One blob at the stop: a timeslice (1 s) left a dip in the page's own voice at its boundaries.
      recorder.start();
      this.recorder = recorder;
      // Stopped (or the call ended) while the audio started: stop at once.
      if (this.recording.state !== 'on' || !this.recording.here || this.state === 'ended') this.finishRecorder();
    } catch (error) {
      context?.close();
      this.recordingMix = undefined;
      if (this.recording.state === 'on' && this.recording.here) {
        this.sendRecording('stopped');
        this.moveRecording('off', false, 'failed');
      }
    }
  }

  finishRecorder() {
    if (this.recorder?.state === 'recording') this.recorder.stop();
    this.recorder = undefined;
  }

  /** Swaps the microphone (or camera) without renegotiating. */
  async replaceTrack(track) {
    const sender = this.pc?.getSenders().find((s) => s.track?.kind === track.kind);
    if (sender) await sender.replaceTrack(track);
    const old = this.stream.getTracks().find((t) => t.kind === track.kind);
    if (old) { this.stream.removeTrack(old); old.stop(); }
    this.stream.addTrack(track);
    this.applyLocalTracks();
    // A recording in progress follows the new microphone.
    if (track.kind === 'audio' && this.recordingMix) {
      const { context, destination } = this.recordingMix;
      context.createMediaStreamSource(new MediaStream([track])).connect(destination);
    }
  }

  async sample() {
    if (!this.pc || this.state === 'ended') return;
    const stats = await this.pc.getStats();
    const sample = sampleFromStats(stats);
    if (this.state === 'active' || this.state === 'reconnecting') {
      this.arrivals ??= new MediaArrivals(NO_MEDIA_AFTER_MS);
      const receiving = this.arrivals.add(sample);
      if (receiving !== undefined) this.receivingChanged(receiving);
    }
    const report = this.monitor.add(sample);
    if (!report) return;
    report.at = Date.now();
    this.quality = report;
    this.history.push(report);
    if (this.history.length > HISTORY) this.history.shift();
    this.dispatchEvent(new CustomEvent('quality', { detail: report }));
  }

  /**
   * The far side's packets stopped (or came back). Stopped, the path may be dead while ICE does not
   * know: Chrome moves to another pair by itself when it is the controlling side, but the far side
   * may go on sending on the dead one (libnice moves only to a pair of higher priority without a
   * restart), and a dead pair's consent takes 30 s to fail. So ICE restarts (the callee asks).
   */
  receivingChanged(receiving) {
    this.receiving = receiving;
    this.dispatchEvent(new CustomEvent('receiving', { detail: receiving }));
    if (!receiving) this.restartIce();
  }

  report() {
    if (!this.quality) return;
    this.signaling.request('call.report', { call: this.id, quality: callQuality(this.quality) }).catch(() => {});
  }

  /** Ends the call here: stops media and timers. Telling the server is the caller's business. */
  close(reason, detail) {
    if (this.state === 'ended') return;
    if (this.pc && this.quality) this.report();
    if (this.recording.state !== 'off') {
      this.finishRecorder();
      this.moveRecording('off', false, 'call-ended');
    }
    clearInterval(this.statsTimer);
    clearInterval(this.reportTimer);
    this.path?.close();
    this.path = undefined;
    for (const path of this.early.values()) path.close();
    this.early.clear();
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    this.endReason = reason;
    this.endDetail = detail;
    this.endedAt = Date.now();
    this.setState('ended');
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.dispatchEvent(new CustomEvent('state', { detail: state }));
  }
}
