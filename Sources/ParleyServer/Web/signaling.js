// The signaling protocol v1 (docs/protocol.md) for browsers: hello and resume, per-session seq
// with client acks, heartbeat, requests answered by ack or error, an outbox re-sent under the
// same ids after a reconnect (the server answers a repeated id once), backoff with full jitter.

export class ProtocolError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

/** Thrown by a token provider when it cannot give a token (the user must sign in again). */
export class SignInRequired extends Error {}

const CLIENT = { name: 'parley-web', version: '0.1.0', platform: 'web' };

/**
 * Events: `state` ({state, detail}) with state one of connecting, online, reconnecting, offline;
 * `welcome` (the welcome frame); `reset` (the session was lost: calls need `call.state`);
 * `frame` (every other server frame, once, in order).
 */
export class Signaling extends EventTarget {
  constructor({ base, device, token, requestTimeoutMs = 15000, connectTimeoutMs = 10000 }) {
    super();
    this.base = base;                 // the server's HTTP origin (the page's own)
    this.device = device;
    this.token = token;               // async (fresh: boolean) => token string
    this.requestTimeoutMs = requestTimeoutMs;
    this.connectTimeoutMs = connectTimeoutMs;
    this.state = 'offline';
    this.session = undefined;
    this.lastSeq = 0;
    this.lastAckSent = 0;
    this.heartbeat = 20;
    this.pending = new Map();         // id → {frame, resolve, reject, timer}
    this.nextId = 1;
    this.attempt = 0;
    this.stopped = true;
    this.freshToken = false;
    this.iceServers = [];
    this.onOnline = () => { if (this.state === 'reconnecting') this.connectNow(); };
  }

  start() {
    this.stopped = false;
    window.addEventListener('online', this.onOnline);
    this.connect();
  }

  stop() {
    this.stopped = true;
    window.removeEventListener('online', this.onOnline);
    clearTimeout(this.retryTimer);
    this.teardown(1000);
    for (const entry of this.pending.values()) {
      clearTimeout(entry.timer);
      entry.reject(new ProtocolError('unavailable', 'Signed out.'));
    }
    this.pending.clear();
    this.setState('offline', 'signed-out');
  }

  /** Sends a request; resolves with its ack, rejects with a ProtocolError. Survives reconnects. */
  request(type, fields = {}) {
    const id = `w${Date.now().toString(36)}-${this.nextId++}`;
    const frame = JSON.stringify({ type, id, ...fields });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new ProtocolError('timeout', 'The server did not answer in time.'));
      }, this.requestTimeoutMs);
      this.pending.set(id, { frame, resolve, reject, timer });
      if (this.state === 'online') this.ws.send(frame);
    });
  }

  /** Sends a frame that needs no answer, if online. */
  send(frame) {
    if (this.state === 'online') this.ws.send(JSON.stringify(frame));
  }

  /** Closes the connection as a network loss would; the client reconnects and resumes. */
  drop() {
    if (this.ws) this.ws.close(4000, 'dropped');
  }

  connectNow() {
    clearTimeout(this.retryTimer);
    this.attempt = 0;
    this.connect();
  }

  async connect() {
    if (this.stopped) return;
    this.setState(this.session ? 'reconnecting' : 'connecting', 'connecting');
    let token;
    try {
      token = await this.token(this.freshToken);
    } catch (error) {
      if (error instanceof SignInRequired) { this.fail('token-expired'); return; }
      this.scheduleReconnect('unreachable');
      return;
    }
    if (this.stopped) return;
    const url = this.base.replace(/^http/, 'ws') + '/v1/signal?access_token=' + encodeURIComponent(token);
    const ws = new WebSocket(url, 'parley.v1');
    this.ws = ws;
    let opened = false;
    const connectTimer = setTimeout(() => { if (this.ws === ws && this.state !== 'online') ws.close(); }, this.connectTimeoutMs);
    ws.onopen = () => {
      opened = true;
      const hello = { type: 'hello', id: `hello-${this.nextId++}`, device: this.device, client: CLIENT };
      if (this.session) hello.resume = { session: this.session, lastSeq: this.lastSeq };
      ws.send(JSON.stringify(hello));
    };
    ws.onmessage = (event) => { if (this.ws === ws) this.receive(event.data); };
    ws.onclose = async (event) => {
      clearTimeout(connectTimer);
      if (this.ws !== ws) return;
      this.teardown();
      if (this.stopped) return;
      if (event.code === 4009) { this.fail('replaced'); return; }
      if (event.code === 4003) { this.freshToken = true; this.scheduleReconnect('token-expired', 0); return; }
      if (!opened) {
        // The upgrade failed: the server is down, or it refused the token (HTTP 401).
        this.scheduleReconnect(await this.diagnose(token));
        return;
      }
      this.scheduleReconnect(event.code === 1001 ? 'server-restarting' : 'connection-lost');
    };
  }

  async diagnose(token) {
    try {
      const health = await fetch(this.base + '/healthz', { cache: 'no-store' });
      if (!health.ok) return 'server-unavailable';
      const check = await fetch(this.base + '/v1/ice-servers', { headers: { authorization: 'Bearer ' + token } });
      if (check.status === 401) { this.freshToken = true; return 'token-rejected'; }
      return 'connection-lost';
    } catch {
      return 'unreachable';
    }
  }

  receive(text) {
    this.lastHeard = Date.now();
    let frame;
    try { frame = JSON.parse(text); } catch { return; }
    if (!frame || typeof frame.type !== 'string') return;
    if (frame.type === 'welcome') { this.welcomed(frame); return; }
    if (typeof frame.seq === 'number') {
      if (frame.seq <= this.lastSeq) return;          // replayed after a resume: already delivered
      this.lastSeq = frame.seq;
      if (this.lastSeq - this.lastAckSent >= 32) this.sendAck();
    }
    if ((frame.type === 'ack' || frame.type === 'error') && frame.re !== undefined) {
      const entry = this.pending.get(frame.re);
      if (entry) {
        this.pending.delete(frame.re);
        clearTimeout(entry.timer);
        if (frame.type === 'ack') entry.resolve(frame);
        else entry.reject(new ProtocolError(frame.code, frame.message));
      }
      return;
    }
    if (frame.type === 'error') {
      if (frame.code === 'rate_limited' || frame.code === 'bad_request') console.warn('parley: server says', frame);
      return;
    }
    this.dispatchEvent(new CustomEvent('frame', { detail: frame }));
  }

  welcomed(frame) {
    const lost = this.session !== undefined && !frame.resumed;
    this.session = frame.session;
    if (!frame.resumed) { this.lastSeq = 0; this.lastAckSent = 0; }
    this.heartbeat = frame.heartbeat || 20;
    this.iceServers = frame.iceServers || [];
    this.attempt = 0;
    this.freshToken = false;
    this.setState('online', frame.resumed ? 'resumed' : 'new-session');
    for (const entry of this.pending.values()) this.ws.send(entry.frame);
    // Heartbeat well inside the server's window; acks ride along so the resume buffer stays small.
    // Every ping is answered: a connection that heard nothing for a whole heartbeat (two pings) is
    // on a path that went silent without a reset, which the socket itself may not notice for
    // minutes. It is given up and the session resumed on a new one.
    this.lastHeard = Date.now();
    this.pingTimer = setInterval(() => {
      if (Date.now() - this.lastHeard > this.heartbeat * 1000) {
        this.teardown();
        this.scheduleReconnect('connection-lost');
        return;
      }
      this.send({ type: 'ping', id: `ping-${this.nextId++}` });
      if (this.lastSeq > this.lastAckSent) this.sendAck();
    }, Math.max(1000, this.heartbeat * 1000 / 2));
    this.dispatchEvent(new CustomEvent('welcome', { detail: frame }));
    if (lost) this.dispatchEvent(new Event('reset'));
  }

  sendAck() {
    this.lastAckSent = this.lastSeq;
    this.send({ type: 'ack', seq: this.lastSeq });
  }

  scheduleReconnect(reason, delay) {
    if (this.stopped) return;
    // Full jitter: attempt n waits random(0 … min(30 s, 0.5 s · 2ⁿ)).
    const wait = delay ?? Math.random() * Math.min(30000, 500 * 2 ** this.attempt);
    this.attempt += 1;
    this.retryAt = Date.now() + wait;
    this.setState(this.session ? 'reconnecting' : 'connecting', reason);
    this.retryTimer = setTimeout(() => this.connect(), wait);
  }

  fail(reason) {
    this.stopped = true;
    this.setState('offline', reason);
  }

  teardown(code) {
    clearInterval(this.pingTimer);
    const ws = this.ws;
    this.ws = undefined;
    if (ws && ws.readyState <= 1) ws.close(code ?? 1000);
    if (this.state === 'online') this.state = 'reconnecting';
  }

  setState(state, detail) {
    this.state = state;
    this.detail = detail;
    this.dispatchEvent(new CustomEvent('state', { detail: { state, detail } }));
  }
}
