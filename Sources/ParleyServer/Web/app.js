// The Parley browser softphone: sign-in, one-to-one calls, rooms, devices, call history.
// Plain modules served by the Parley server; nothing is fetched from anywhere else.
import { Signaling, SignInRequired, ProtocolError } from './signaling.js';
import { Call } from './call.js';
import { LevelMeter, audioContext } from './audio.js';
import { drawQuality } from './graph.js';
import { MeshRoom, AudioBridgeRoom } from './rooms.js';

const $ = (id) => document.getElementById(id);
const base = location.origin;

// MARK: Words for people

const END_REASONS = {
  declined: (peer) => `${peer} declined the call.`,
  busy: (peer) => `${peer} is busy on another call.`,
  'no-answer': (peer, call) => call.direction === 'incoming' ? `You missed a call from ${peer}.` : `${peer} did not answer.`,
  cancelled: (peer) => `${peer} cancelled the call before you answered.`,
  hangup: (peer) => `${peer} hung up.`,
  'connection-lost': (peer) => `The connection to ${peer} was lost.`,
  'answered-elsewhere': () => 'You answered this call on another device.',
  'declined-elsewhere': () => 'You declined this call on another device.',
  'server-shutdown': () => 'The server stopped, which ended the call.',
  'server-lost-call': () => 'The server restarted without a record of this call, so it had to end.',
  'ice-failed': () => 'The call\'s network connection failed and could not be restored.',
  'dtls-failed': () => 'The call\'s connection could not be secured (its DTLS handshake failed).',
  local: () => 'Call ended.',
};

const CONNECTION_WORDS = {
  connecting: 'Connecting to the server…',
  unreachable: `Cannot reach the Parley server at ${base}. Is it running? Retrying…`,
  'server-unavailable': 'The server is not taking connections right now (it may be restarting). Retrying…',
  'connection-lost': 'Lost the connection to the server. Reconnecting…',
  'server-restarting': 'The server is restarting. Reconnecting…',
  'token-expired': 'Your sign-in expired; renewing it…',
  'token-rejected': 'The server did not accept your sign-in; renewing it…',
};

const ERROR_WORDS = {
  call_not_found: 'That call does not exist (or is not yours).',
  call_already_answered: 'This call was already answered on another device.',
  call_ended: 'That call has already ended.',
  call_not_connected: 'The call is not connected yet.',
  room_full: 'That room is full.',
  rate_limited: 'Too many requests; slow down a little.',
  unavailable: 'The server cannot do that right now.',
  timeout: 'The server did not answer in time. Check your connection.',
};

// Browsers give the microphone (and crypto.randomUUID) only to secure pages: HTTPS, or localhost.
const INSECURE_WORDS = `This page came over plain HTTP from ${location.host}: browsers let only secure pages use the microphone. Open Parley over HTTPS (or on localhost).`;

/** A random UUID; crypto.randomUUID exists only on secure pages, getRandomValues everywhere. */
function newId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const hex = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function words(error) {
  if (error instanceof ProtocolError) return error.message && error.code === 'bad_request' ? error.message : (ERROR_WORDS[error.code] ?? error.message);
  if (error?.name === 'NotAllowedError') return 'Parley may not use your microphone. Allow microphone access in the browser and try again.';
  if (error?.name === 'NotFoundError') return 'No microphone was found. Plug one in and try again.';
  return String(error?.message ?? error);
}

// MARK: The app

class App {
  constructor() {
    this.device = sessionStorage.getItem('parley.device') ?? `web-${newId().slice(0, 8)}`;
    sessionStorage.setItem('parley.device', this.device);
    this.call = undefined;         // the current call, incoming or connected
    this.ending = undefined;       // the last ended call, for its summary
    this.room = undefined;
    this.microphone = undefined;   // chosen deviceId
    this.speaker = undefined;
  }

  // Sign-in

  async signInByName(user) {
    let response;
    try {
      response = await fetch(base + '/v1/dev/tokens', { method: 'POST', headers: { 'content-type': 'application/json' },
                                                        body: JSON.stringify({ user }) });
    } catch {
      return this.notify(`Cannot reach the Parley server at ${base}. Is it running?`, true);
    }
    if (response.status === 404) return this.notify('This server does not hand out development tokens. Sign in with an access token.', true);
    if (!response.ok) return this.notify((await errorBody(response)) ?? `The server refused: HTTP ${response.status}.`, true);
    const { token } = await response.json();
    this.start({ user, token, mode: 'name' });
  }

  signInWithToken(token) {
    const claims = jwtClaims(token);
    if (!claims?.sub) return this.notify('That is not a Parley access token.', true);
    if (claims.exp && claims.exp * 1000 < Date.now()) return this.notify('That token has expired. Ask for a new one.', true);
    this.start({ user: claims.sub, token, mode: 'token' });
  }

  start({ user, token, mode }) {
    this.user = user;
    this.token = token;
    sessionStorage.setItem('parley.signin', JSON.stringify({ user, token, mode }));
    this.signaling = new Signaling({ base, device: this.device, token: (fresh) => this.freshToken(fresh, mode) });
    this.signaling.addEventListener('state', (e) => this.connectionChanged(e.detail));
    this.signaling.addEventListener('frame', (e) => this.frame(e.detail).catch((error) => console.warn('parley:', error)));
    this.signaling.addEventListener('reset', () => { this.sessionLost(); this.roomSessionLost(); });
    this.signaling.start();
    $('whoami').textContent = `${user} · ${this.device}`;
    $('signin').hidden = true;
    $('app').hidden = false;
    $('signout').hidden = false;
    $('dial-user').focus();
    this.clearNotice();
    this.refreshHistory();
  }

  async freshToken(fresh, mode) {
    const expired = (jwtClaims(this.token)?.exp ?? Infinity) * 1000 < Date.now() + 1000;
    if (!fresh && !expired) return this.token;
    if (mode !== 'name') throw new SignInRequired();
    const response = await fetch(base + '/v1/dev/tokens', { method: 'POST', headers: { 'content-type': 'application/json' },
                                                            body: JSON.stringify({ user: this.user }) });
    if (response.status === 404) throw new SignInRequired();
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    this.token = (await response.json()).token;
    sessionStorage.setItem('parley.signin', JSON.stringify({ user: this.user, token: this.token, mode }));
    return this.token;
  }

  signOut(message) {
    if (this.call) this.hangup();
    if (this.room) this.leaveRoom();
    this.signaling?.stop();
    this.signaling = undefined;
    sessionStorage.removeItem('parley.signin');
    $('app').hidden = true;
    $('signin').hidden = false;
    $('signout').hidden = true;
    $('whoami').textContent = '';
    this.setPill('offline', 'Signed out');
    if (message) this.notify(message, true); else this.clearNotice();
    $('signin-user').focus();
  }

  connectionChanged({ state, detail }) {
    const labels = { connecting: 'Connecting…', online: 'Online', reconnecting: 'Reconnecting…', offline: 'Offline' };
    this.setPill(state, labels[state]);
    if (state === 'online') {
      if (this.connectionNotice) { this.clearNotice(); this.connectionNotice = false; }
    } else if (state === 'offline') {
      if (detail === 'token-expired') this.signOut('Your sign-in has expired. Please sign in again.');
      else if (detail === 'replaced') this.notify('Parley was opened with this device in another tab or window; this one is now offline. Reload to use it here.', true);
    } else if (detail !== 'connecting' || state === 'reconnecting') {
      const seconds = this.signaling.retryAt ? Math.max(0, Math.round((this.signaling.retryAt - Date.now()) / 1000)) : 0;
      const text = CONNECTION_WORDS[detail] ?? CONNECTION_WORDS['connection-lost'];
      this.notify(seconds > 1 ? `${text} (in ${seconds} s)` : text, detail === 'unreachable');
      this.connectionNotice = true;
    }
  }

  setPill(state, text) {
    const pill = $('connection');
    pill.className = `pill ${state}`;
    pill.textContent = text;
  }

  notify(text, error = false) {
    const notice = $('notice');
    notice.textContent = text;
    notice.className = error ? 'error' : '';
    notice.hidden = false;
  }

  clearNotice() {
    $('notice').hidden = true;
    $('notice').textContent = '';
  }

  // Server frames

  async frame(frame) {
    switch (frame.type) {
    case 'call.incoming': return this.incoming(frame);
    case 'call.ringing':
      if (this.call?.id === frame.call && this.call.state === 'outgoing') {
        this.callStatus('Ringing…');
        // A device that rings early gets its path now, silent until it answers.
        if (frame.early && this.call.connectsWhileRinging) this.call.connectEarly(frame.device, this.signaling.iceServers);
      }
      return;
    case 'call.accepted':
      if (this.call?.id === frame.call) {
        this.call.peer.device = frame.device;
        this.call.connect(this.call.stream, this.signaling.iceServers, frame.device);
      }
      return;
    case 'call.signal':
      if (this.call?.id === frame.call) await this.call.received(frame);
      return;
    case 'call.updated':
      if (this.call?.id === frame.call) this.call.updated(frame);
      return;
    case 'call.ended':
      if (this.call?.id === frame.call) this.ended(this.call, ['ice-failed', 'dtls-failed'].includes(frame.detail) ? frame.detail : frame.reason);
      return;
    default:
      if (frame.type.startsWith('room.')) this.room?.frame(frame);
    }
  }

  /**
   * The session was lost (resume refused, as after a server restart): ask the server what became of
   * the current call. `active` or `ringing`: it goes on (its media never went through the server).
   */
  async sessionLost() {
    const call = this.call;
    if (!call || call.state === 'ended') return;
    try {
      const ack = await this.signaling.request('call.state', { call: call.id });
      if (ack.state === 'ended') this.ended(call, ack.reason ?? 'connection-lost');
      else if (ack.recording === 'off') call.serverRecording('off');
    } catch (error) {
      // The server no longer knows the call (it restarted without its store): nobody can signal it.
      if (error.code === 'call_not_found') this.ended(call, 'server-lost-call');
      // Anything else (no answer in time) is asked again at the next new session.
    }
  }

  /**
   * A new session: the server's member list of the room may have started again (it restarted, or
   * the room's node went away). Joins again, naming the Janus participant this page is, which the
   * server keeps while Janus has it; a new admission means joining Janus again with it.
   */
  async roomSessionLost() {
    const room = this.room;
    if (!room) return;
    const fields = { room: room.name, display: this.user };
    if (room instanceof AudioBridgeRoom && room.id) fields.participant = room.id;
    let ack;
    room.rejoining = true;
    try {
      ack = await this.signaling.request('room.join', fields);
    } catch {
      // Still talking (unless the server took the admission back meanwhile): listed again at the next new session.
    } finally {
      room.rejoining = false;
    }
    if (this.room !== room || !(room instanceof AudioBridgeRoom)) return;
    if (ack ? ack.media?.janus?.participant === room.id : !room.kicked) return;
    // The server could not keep this page's admission: Janus again, with the new one its ack
    // brought (or, kicked with no ack, a new join).
    room.pc?.close();
    room.janus?.close();
    for (const track of room.stream.getTracks()) track.stop();
    this.room = undefined;
    await this.joinRoom(room.name, ack);
  }

  // Calls

  async startCall(to, video) {
    if (this.call) return this.notify('You are already in a call. Hang up first.', true);
    if (to === this.user) return this.notify('You cannot call yourself. Type someone else\'s user id.', true);
    this.clearNotice();
    audioContext();
    let stream;
    try {
      stream = await this.media(video);
    } catch (error) {
      return this.notify(words(error), true);
    }
    const call = new Call({ id: newId(), direction: 'outgoing', peer: { user: to }, media: { audio: true, video }, signaling: this.signaling });
    call.stream = stream;
    this.adopt(call);
    this.callStatus(`Calling ${to}…`);
    try {
      const ack = await this.signaling.request('call.invite', { call: call.id, to, media: { audio: true, video } });
      if (ack.devices === 0 && ack.pushed === 0) {
        this.signaling.request('call.hangup', { call: call.id }).catch(() => {});
        call.close('offline');
        this.showEnded(call, `${to} is not online right now: no device of theirs is signed in.`);
        return;
      }
      if (ack.devices === 0) this.callStatus(`Waking ${to}'s phone (push notification sent)…`);
    } catch (error) {
      call.close('error');
      this.showEnded(call, words(error));
    }
  }

  incoming(frame) {
    if (this.call?.id === frame.call) return;
    if (this.call) {
      // One call at a time in the browser: a second caller hears busy.
      this.signaling.request('call.decline', { call: frame.call, reason: 'busy' }).catch(() => {});
      return;
    }
    const name = frame.from.name ? `${frame.from.name} (${frame.from.user})` : frame.from.user;
    const call = new Call({ id: frame.call, direction: 'incoming', peer: { ...frame.from, name }, media: frame.media, signaling: this.signaling });
    this.adopt(call);
    // An audio call connects while it rings: nothing is captured, sent or played before the answer.
    if (call.connectsWhileRinging) call.prepare(this.signaling.iceServers);
    this.signaling.request('call.ringing', call.connectsWhileRinging ? { call: call.id, early: true } : { call: call.id }).catch(() => {});
    $('incoming-text').textContent = `${name} is calling you${frame.media.video ? ' (video)' : ''}.`;
    $('incoming').hidden = false;
    $('accept').focus();
  }

  async accept() {
    const call = this.call;
    if (!call || call.state !== 'incoming') return;
    $('incoming').hidden = true;
    audioContext();
    let stream;
    try {
      stream = await this.media(call.media.video);
    } catch (error) {
      this.signaling.request('call.decline', { call: call.id }).catch(() => {});
      call.close('error');
      return this.showEnded(call, words(error));
    }
    call.stream = stream;
    $('call').hidden = false;
    this.callStatus('Answering…');
    try {
      await this.signaling.request('call.accept', { call: call.id });
    } catch (error) {
      for (const track of stream.getTracks()) track.stop();
      call.close('error');
      return this.showEnded(call, words(error));
    }
    call.connect(stream, this.signaling.iceServers);
    $('hangup').focus();
  }

  decline() {
    const call = this.call;
    if (!call || call.state !== 'incoming') return;
    this.signaling.request('call.decline', { call: call.id, reason: 'declined' }).catch(() => {});
    call.close('declined-here');
    this.showEnded(call, `You declined the call from ${call.peer.name}.`);
  }

  hangup(reason) {
    const call = this.call;
    if (!call) return;
    if (call.state === 'incoming') return this.decline();
    this.signaling?.request('call.hangup', reason ? { call: call.id, reason } : { call: call.id }).catch(() => {});
    this.ended(call, reason ?? 'local');
  }

  ended(call, reason) {
    if (call.state === 'ended' && this.call !== call) return;
    call.close(reason);
    const peer = call.peer.name ?? call.peer.user;
    const summary = call.connectedAt ? ` (${clock((call.endedAt - call.connectedAt) / 1000)}${call.quality ? `, MOS ${call.quality.mos.toFixed(2)}` : ''})` : '';
    this.showEnded(call, (END_REASONS[reason] ?? END_REASONS.local)(peer, call) + summary);
  }

  showEnded(call, text) {
    if (this.call === call) this.call = undefined;
    this.ending = call;
    this.remoteMeter?.close();
    this.remoteMeter = undefined;
    clearInterval(this.callTimer);
    $('remote-audio').srcObject = null;
    $('incoming').hidden = true;
    $('call').hidden = true;
    $('videos').hidden = true;
    this.notify(text, !['local', 'hangup'].includes(call.endReason));
    $('dial-user').focus();
    setTimeout(() => this.refreshHistory(), 500);
  }

  /** Shows a call in the page and follows its events. */
  adopt(call) {
    this.call = call;
    $('call-peer').textContent = call.peer.name ?? call.peer.user;
    $('call-remote').textContent = '';
    $('call-timer').textContent = '0:00';
    for (const id of ['mute', 'hold', 'record']) $(id).setAttribute('aria-pressed', 'false');
    $('record').textContent = 'Record';
    $('recording-indicator').hidden = true;
    $('recording-request').hidden = true;
    $('recording-status').textContent = '';
    if (call.direction === 'outgoing') { $('call').hidden = false; $('hangup').focus(); }
    call.addEventListener('state', () => this.callStateChanged(call));
    call.addEventListener('remote-stream', (e) => this.remoteStream(call, e.detail));
    call.addEventListener('quality', () => drawQuality($('quality'), call.history));
    call.addEventListener('updated', (e) => this.remoteUpdated(call, e.detail));
    call.addEventListener('receiving', () => this.remoteUpdated(call, call.remote));
    call.addEventListener('recording', (e) => this.recordingChanged(call, e.detail));
    call.addEventListener('recorded', (e) => this.recorded(call, e.detail));
    call.addEventListener('failed', () => this.hangup('ice-failed'));
    if (call.stream && call.media.video) $('local-video').srcObject = call.stream;
  }

  callStateChanged(call) {
    if (call !== this.call) return;
    const words = { connecting: 'Connecting…', active: 'Connected', reconnecting: 'Connection unstable — reconnecting…' };
    if (words[call.state]) this.callStatus(words[call.state]);
    if (call.state === 'active' && !this.callTimer) {
      this.callTimer = setInterval(() => { $('call-timer').textContent = clock((Date.now() - call.connectedAt) / 1000); }, 1000);
    }
    if (call.state === 'connecting' && call.media.video) {
      $('videos').hidden = false;
      $('local-video').srcObject = call.stream;
    }
  }

  remoteStream(call, stream) {
    const audio = $('remote-audio');
    if (audio.srcObject !== stream) {
      audio.srcObject = stream;
      if (this.speaker && audio.setSinkId) audio.setSinkId(this.speaker).catch(() => {});
      audio.play().catch(() => {});
    }
    if (stream.getVideoTracks().length) $('remote-video').srcObject = stream;
    if (!this.remoteMeter && stream.getAudioTracks().length) {
      this.remoteMeter = new LevelMeter(stream);
      const meter = setInterval(() => {
        if (!this.remoteMeter) return clearInterval(meter);
        $('call-level').value = this.remoteMeter.levelDb();
      }, 100);
    }
  }

  remoteUpdated(call, remote) {
    const peer = call.peer.name ?? call.peer.user;
    const parts = [];
    if (remote.held) parts.push(`${peer} put you on hold.`);
    else if (remote.muted) parts.push(`${peer} muted their microphone.`);
    if (!call.receiving) parts.push(`No audio is arriving from ${peer}.`);
    $('call-remote').textContent = parts.join(' ');
  }

  recordingChanged(call, { state, here, change }) {
    if (call !== this.call && call !== this.ending) return;
    const peer = call.peer.name ?? call.peer.user;
    $('recording-indicator').hidden = state !== 'on';
    $('recording-indicator').textContent = here ? '● Recording (you are recording)' : `● Recording (${peer} is recording)`;
    $('recording-request').hidden = state !== 'asked';
    $('recording-request-text').textContent = `${peer} asks to record this call.`;
    $('record').setAttribute('aria-pressed', String(state === 'on' || state === 'asking'));
    $('record').textContent = state === 'on' ? 'Stop recording' : state === 'asking' ? 'Cancel request' : 'Record';
    const words = {
      'requested-here': `Asking ${peer} to let you record…`, 'declined-there': `${peer} declined: the call is not recorded.`,
      'accepted-there': `${peer} agreed: recording.`, 'accepted-here': `You agreed: ${peer} is recording this call.`,
      'declined-here': 'You declined: the call is not recorded.', 'stopped-here': 'Recording stopped.',
      'stopped-there': `${peer} stopped the recording.`, failed: 'Recording failed.',
    };
    $('recording-status').textContent = words[change] ?? '';
    if (state === 'asked') $('recording-allow').focus();
  }

  /** Every recording made here stays offered for download, each in its own file. */
  recorded(call, { url, seconds, type }) {
    const link = document.createElement('a');
    const number = $('recording-files').children.length + 1;
    link.href = url;
    link.download = `parley-call-${call.id.slice(0, 8)}-${number}.${type.includes('ogg') ? 'ogg' : 'webm'}`;
    link.textContent = `Recording of the call with ${call.peer.name ?? call.peer.user} (${seconds.toFixed(1)} s)`;
    const item = document.createElement('li');
    item.append(link);
    $('recording-files').append(item);
    $('recordings').hidden = false;
  }

  toggleRecording() {
    const call = this.call;
    if (!call?.live) return;
    if (call.recording.state === 'off') call.requestRecording();
    else if (call.recording.state === 'asking' || call.recording.state === 'on') call.stopRecording();
  }

  answerRecording(consent) {
    this.call?.answerRecording(consent);
  }

  callStatus(text) {
    $('call-status').textContent = text;
  }

  toggleMute() {
    if (!this.call?.live) return;
    this.call.setMuted(!this.call.muted);
    $('mute').setAttribute('aria-pressed', String(this.call.muted));
    $('mute').textContent = this.call.muted ? 'Unmute' : 'Mute';
  }

  toggleHold() {
    if (!this.call?.live) return;
    this.call.setHeld(!this.call.held);
    $('hold').setAttribute('aria-pressed', String(this.call.held));
    $('hold').textContent = this.call.held ? 'Resume' : 'Hold';
    $('remote-audio').muted = this.call.held;
  }

  // Media and devices

  async media(video) {
    if (!navigator.mediaDevices) throw new Error(INSECURE_WORDS);
    const audio = this.microphone ? { deviceId: { exact: this.microphone } } : true;
    const stream = await navigator.mediaDevices.getUserMedia({ audio, video: !!video });
    this.listDevices();
    return stream;
  }

  async listDevices() {
    let devices = [];
    try { devices = await navigator.mediaDevices.enumerateDevices(); } catch { return; }
    const fill = (select, kind, chosen) => {
      const options = devices.filter((d) => d.kind === kind);
      select.replaceChildren(...(options.length ? options : [{ deviceId: '', label: 'Default' }]).map((d, i) => {
        const option = new Option(d.label || `${kind === 'audioinput' ? 'Microphone' : 'Speaker'} ${i + 1}`, d.deviceId);
        option.selected = d.deviceId === chosen;
        return option;
      }));
    };
    fill($('microphone'), 'audioinput', this.microphone);
    fill($('speaker'), 'audiooutput', this.speaker);
  }

  async chooseMicrophone(deviceId) {
    this.microphone = deviceId || undefined;
    if (!this.call?.live) return;
    try {
      const stream = await navigator.mediaDevices.getUserMedia({ audio: { deviceId: { exact: deviceId } } });
      await this.call.replaceTrack(stream.getAudioTracks()[0]);
    } catch (error) {
      this.notify(`Could not switch the microphone: ${words(error)}`, true);
    }
  }

  async chooseSpeaker(deviceId) {
    this.speaker = deviceId || undefined;
    const audio = $('remote-audio');
    if (!audio.setSinkId) return this.notify('This browser cannot choose a speaker.', true);
    await audio.setSinkId(deviceId).catch((error) => this.notify(`Could not switch the speaker: ${words(error)}`, true));
  }

  // History

  async refreshHistory() {
    if (!this.signaling) return;
    let list;
    try {
      const response = await fetch(base + '/v1/calls?limit=20', { headers: { authorization: `Bearer ${this.token}` } });
      if (!response.ok) return;
      list = await response.json();
    } catch {
      return;
    }
    $('history-rows').replaceChildren(...list.calls.map((c) => {
      const outgoing = c.caller === this.user;
      const missed = !outgoing && !c.answeredAt;
      const cells = [new Date(c.createdAt).toLocaleString(), outgoing ? c.callee : c.caller,
                     (outgoing ? 'outgoing' : 'incoming') + (c.recordings?.length ? ', recorded' : ''), missed ? 'missed' : (c.reason ?? 'ongoing'),
                     c.duration !== undefined ? clock(c.duration) : '', c.quality ? c.quality.mos.toFixed(2) : ''];
      const row = document.createElement('tr');
      for (const text of cells) row.insertCell().textContent = text;
      return row;
    }));
  }

  // Rooms

  /** Joins a room: `room.join`, then its media. `given`: the ack of a `room.join` already made. */
  async joinRoom(name, given) {
    if (this.room) return this.notify(`You are in room ${this.room.name}. Leave it first.`, true);
    audioContext();
    let stream;
    try {
      stream = await this.media(false);
    } catch (error) {
      return this.notify(words(error), true);
    }
    let ack = given;
    try {
      ack ??= await this.signaling.request('room.join', { room: name, display: this.user });
    } catch (error) {
      for (const track of stream.getTracks()) track.stop();
      return this.notify(words(error), true);
    }
    const Kind = { mesh: MeshRoom, audiobridge: AudioBridgeRoom }[ack.media?.mode];
    if (!Kind) {
      for (const track of stream.getTracks()) track.stop();
      await this.signaling.request('room.leave', { room: name }).catch(() => {});
      return this.notify(`Room ${name} carries audio in a way this page does not know (${ack.media?.mode}).`, true);
    }
    const room = new Kind({ name, signaling: this.signaling, self: { user: this.user, device: this.device, display: this.user }, stream });
    this.room = room;
    room.addEventListener('changed', () => this.drawRoom());
    room.addEventListener('ended', (e) => { this.notify(e.detail, true); this.leaveRoom(); });
    room.addEventListener('lost', () => this.rejoinRoom(name));
    $('room-title').textContent = name;
    $('room-kind').textContent = room instanceof AudioBridgeRoom ? '(mixed on the voice server)' : '(peer-to-peer mesh)';
    $('room').hidden = false;
    try {
      await room.joined(ack);
    } catch (error) {
      this.room = undefined;
      $('room').hidden = true;
      await room.leave();
      return this.notify(`Could not join the voice room: ${words(error)}`, true);
    }
    $('room-leave').focus();
  }

  /** The voice server went away: join again (the server hands out a new token), with backoff. */
  async rejoinRoom(name) {
    const old = this.room;
    if (!old) return;
    this.room = undefined;
    this.notify('Lost the voice server; joining the room again…');
    old.pc?.close();
    for (let attempt = 0; attempt < 8 && !this.room; attempt++) {
      await new Promise((r) => setTimeout(r, Math.min(5000, 500 * 2 ** attempt)));
      await this.joinRoom(name);
    }
    if (this.room) this.clearNotice();
  }

  async leaveRoom() {
    const room = this.room;
    if (!room) return;
    this.room = undefined;
    $('room').hidden = true;
    await room.leave();
    $('room-name').focus();
  }

  toggleRoomMute() {
    if (!this.room) return;
    this.room.setMuted(!this.room.muted);
    $('room-mute').setAttribute('aria-pressed', String(this.room.muted));
    $('room-mute').textContent = this.room.muted ? 'Unmute' : 'Mute';
  }

  drawRoom() {
    const room = this.room;
    if (!room) return;
    $('room-people').replaceChildren(...[...room.participants.values()].map((p) => {
      const item = document.createElement('li');
      item.textContent = `${p.display || p.user}${p.self ? ' (you)' : ''}`;
      item.dataset.device = p.device;
      item.classList.toggle('talking', p.talking);
      item.classList.toggle('muted', p.muted);
      return item;
    }));
  }

  /** For tests: decodes the last recording and measures each tone's amplitude in every tenth of a second. */
  async analyseRecording(frequencies) {
    const recorded = (this.call ?? this.ending)?.recorded;
    if (!recorded) return undefined;
    const context = new OfflineAudioContext(1, 48000, 48000);
    const audio = await context.decodeAudioData(await recorded.blob.arrayBuffer());
    const samples = audio.getChannelData(0);
    const tenth = Math.round(audio.sampleRate / 10);
    const windows = [];
    for (let start = 0; start + tenth <= samples.length; start += tenth) {
      windows.push(frequencies.map((hz) => {
        const k = 2 * Math.cos(2 * Math.PI * hz / audio.sampleRate);
        let s1 = 0, s2 = 0;
        for (let i = start; i < start + tenth; i++) { const s0 = samples[i] + k * s1 - s2; s2 = s1; s1 = s0; }
        return 2 * Math.sqrt(Math.max(0, s1 * s1 + s2 * s2 - k * s1 * s2)) / tenth;
      }));
    }
    return { seconds: audio.duration, channels: audio.numberOfChannels, windows };
  }

  // For tests and the curious: a snapshot of what the page shows.
  snapshot() {
    const call = this.call ?? this.ending;
    return {
      user: this.user, device: this.device,
      connection: this.signaling?.state ?? 'offline', connectionDetail: this.signaling?.detail,
      session: this.signaling?.session,
      notice: $('notice').hidden ? '' : $('notice').textContent,
      call: call && { id: call.id, state: call.state, direction: call.direction, peer: call.peer.user, endReason: call.endReason,
                      qualitySamples: call.history.length, ice: call.pc?.iceConnectionState, receiving: call.receiving, quality: call.quality, remote: call.remote, muted: call.muted, held: call.held,
                      recording: call.recording, recorded: call.recorded && { seconds: call.recorded.seconds, type: call.recorded.type, bytes: call.recorded.blob.size } },
      recordingIndicator: $('recording-indicator').hidden ? '' : $('recording-indicator').textContent,
      recordingRequest: $('recording-request').hidden ? '' : $('recording-request-text').textContent,
      remoteFrequency: this.remoteMeter?.dominantFrequency(),
      remoteLevelDb: this.remoteMeter?.levelDb(),
      room: this.room && { name: this.room.name, kind: this.room.constructor.kind, participants: [...this.room.participants.values()],
                           frequency: this.room.meter?.dominantFrequency() },
    };
  }
}

function clock(seconds) {
  const s = Math.max(0, Math.round(seconds));
  return `${Math.floor(s / 60)}:${String(s % 60).padStart(2, '0')}`;
}

function jwtClaims(token) {
  try {
    const payload = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    return JSON.parse(atob(payload));
  } catch {
    return undefined;
  }
}

async function errorBody(response) {
  try { return (await response.json()).error?.message; } catch { return undefined; }
}

// MARK: Wiring

const app = new App();
window.parley = app;

$('signin-form').addEventListener('submit', (e) => { e.preventDefault(); app.signInByName($('signin-user').value.trim()); });
$('token-form').addEventListener('submit', (e) => { e.preventDefault(); app.signInWithToken($('token-input').value.trim()); });
$('signout').addEventListener('click', () => app.signOut());
$('dial-form').addEventListener('submit', (e) => { e.preventDefault(); app.startCall($('dial-user').value.trim(), $('dial-video').checked); });
$('accept').addEventListener('click', () => app.accept());
$('decline').addEventListener('click', () => app.decline());
$('hangup').addEventListener('click', () => app.hangup());
$('mute').addEventListener('click', () => app.toggleMute());
$('hold').addEventListener('click', () => app.toggleHold());
$('record').addEventListener('click', () => app.toggleRecording());
$('recording-allow').addEventListener('click', () => app.answerRecording(true));
$('recording-refuse').addEventListener('click', () => app.answerRecording(false));
$('microphone').addEventListener('change', (e) => app.chooseMicrophone(e.target.value));
$('speaker').addEventListener('change', (e) => app.chooseSpeaker(e.target.value));
$('history-refresh').addEventListener('click', () => app.refreshHistory());
$('room-form').addEventListener('submit', (e) => { e.preventDefault(); app.joinRoom($('room-name').value.trim()); });
$('room-leave').addEventListener('click', () => app.leaveRoom());
$('room-mute').addEventListener('click', () => app.toggleRoomMute());

// Keyboard: M mutes, H holds, Escape hangs up or declines; not while typing in a field.
document.addEventListener('keydown', (e) => {
  if (e.target.matches('input, textarea, select') || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === 'Escape' && app.call) { e.preventDefault(); app.hangup(); }
  else if ((e.key === 'm' || e.key === 'M') && app.call?.live) { e.preventDefault(); app.toggleMute(); }
  else if ((e.key === 'h' || e.key === 'H') && app.call?.live) { e.preventDefault(); app.toggleHold(); }
  else if ((e.key === 'r' || e.key === 'R') && app.call?.live) { e.preventDefault(); app.toggleRecording(); }
});
window.addEventListener('resize', () => { if (app.call) drawQuality($('quality'), app.call.history); });
window.addEventListener('beforeunload', () => { if (app.call) app.hangup(); });

if (!window.isSecureContext) app.notify(INSECURE_WORDS, true);
const saved = JSON.parse(sessionStorage.getItem('parley.signin') ?? 'null');
if (saved?.user && saved?.token) app.start(saved);
else app.setPill('offline', 'Signed out');
