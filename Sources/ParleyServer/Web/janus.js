// A small Janus client for the page: one session over the WebSocket API (subprotocol
// `janus-protocol`), keepalives, handles, and requests answered by `success`, or by `ack` and an
// `event` in either order; plugin errors (`error_code`) reject like core errors.

export class JanusError extends Error {
  constructor(code, reason) {
    super(reason);
    this.code = code;
  }
}

export class JanusSession {
  static async open(url, { keepaliveMs = 25000, timeoutMs = 10000 } = {}) {
    const ws = new WebSocket(url, 'janus-protocol');
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = () => reject(new JanusError(0, `cannot reach the voice server at ${url}`));
    });
    const session = new JanusSession(ws, timeoutMs);
    const created = await session.send({ janus: 'create' }, { sessionless: true });
    session.id = created.data.id;
    session.keepalive = setInterval(() => session.send({ janus: 'keepalive' }, { acknowledged: true }).catch(() => {}), keepaliveMs);
    return session;
  }

  constructor(ws, timeoutMs) {
    this.ws = ws;
    this.timeoutMs = timeoutMs;
    this.pending = new Map();     // transaction → {resolve, reject, acknowledged}
    this.handles = new Map();     // handle id → event callback
    this.onclose = undefined;     // (reason) when the session ends without our asking
    ws.onmessage = (event) => this.receive(JSON.parse(event.data));
    ws.onclose = () => this.ended('the voice server closed the connection');
  }

  send(fields, { sessionless = false, acknowledged = false } = {}) {
    const transaction = Math.random().toString(36).slice(2, 14);
    const frame = { ...fields, transaction };
    if (!sessionless) frame.session_id = this.id;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(transaction);
        reject(new JanusError(0, `the voice server did not answer ${fields.janus}`));
      }, this.timeoutMs);
      this.pending.set(transaction, {
        acknowledged,
        resolve: (value) => { clearTimeout(timer); resolve(value); },
        reject: (error) => { clearTimeout(timer); reject(error); },
      });
      this.ws.send(JSON.stringify(frame));
    });
  }

  receive(frame) {
    const entry = frame.transaction && this.pending.get(frame.transaction);
    if (entry) {
      if (frame.janus === 'ack' && !entry.acknowledged) return;   // an event follows (or came first)
      this.pending.delete(frame.transaction);
      if (frame.janus === 'error') return entry.reject(new JanusError(frame.error.code, frame.error.reason));
      const data = frame.plugindata?.data;
      if (data?.error_code) return entry.reject(new JanusError(data.error_code, data.error));
      return entry.resolve(frame);
    }
    if (frame.janus === 'timeout') return this.ended('the voice server timed the session out');
    const handler = this.handles.get(frame.sender);
    if (handler) handler(frame);
  }

  async attach(plugin, onEvent) {
    const answer = await this.send({ janus: 'attach', plugin });
    const id = answer.data.id;
    this.handles.set(id, onEvent);
    return {
      id,
      message: (body, jsep) => this.send(jsep ? { janus: 'message', handle_id: id, body, jsep } : { janus: 'message', handle_id: id, body }),
      trickle: (candidate) => this.send({ janus: 'trickle', handle_id: id, candidate: candidate ?? { completed: true } }, { acknowledged: true }),
      hangup: () => this.send({ janus: 'hangup', handle_id: id }),
    };
  }

  async close() {
    clearInterval(this.keepalive);
    this.closing = true;
    await this.send({ janus: 'destroy' }).catch(() => {});
    this.ws.close();
  }

  ended(reason) {
    clearInterval(this.keepalive);
    for (const entry of this.pending.values()) entry.reject(new JanusError(0, reason));
    this.pending.clear();
    if (!this.closing && this.onclose) this.onclose(reason);
    this.closing = true;
  }
}
