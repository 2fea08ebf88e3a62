/// The minimal browser peer of `parley bench calls`: protocol v1 over WebSocket, one
/// RTCPeerConnection per call, the fake microphone, timings reported on the console.
/// Query: ws, token, device, role (caller | callee), callee, calls, talk (ms), steady (ms).
enum BenchPage {
    static let html = #"""
<!doctype html>
<meta charset="utf-8">
<title>parley bench peer</title>
<script type="module">
const q = new URLSearchParams(location.search);
const report = (fields) => console.log('PARLEY ' + JSON.stringify(fields));
const role = q.get('role');
let ws, stream, pc, call, t0, marks, pending = [], poll, nextId = 1, done = 0;
const calls = Number(q.get('calls')), talk = Number(q.get('talk')), steady = Number(q.get('steady'));

function send(type, fields) {
  ws.send(JSON.stringify({type, id: 'p' + (nextId++), ...fields}));
}

function newPeer() {
  pc = new RTCPeerConnection({iceServers: []});
  for (const track of stream.getTracks()) pc.addTrack(track, stream);
  // Chromium decodes received audio only while something plays it.
  pc.ontrack = (e) => { const audio = new Audio(); audio.srcObject = e.streams[0]; audio.play().catch(() => {}); };
  pc.onicecandidate = (e) => send('call.signal', {call, candidate: e.candidate ? e.candidate.toJSON() : null});
  pc.oniceconnectionstatechange = () => {
    const state = pc.iceConnectionState;
    if ((state === 'connected' || state === 'completed') && marks.ice === undefined) marks.ice = performance.now() - t0;
  };
  poll = setInterval(async () => {
    if (!pc || marks.audio !== undefined) return;
    const stats = await pc.getStats();
    stats.forEach((s) => {
      if (s.type === 'inbound-rtp' && s.kind === 'audio' && s.packetsReceived > 0 &&
          (s.totalSamplesReceived - (s.concealedSamples || 0)) > 0 && marks.audio === undefined) {
        marks.audio = performance.now() - t0;
      }
    });
  }, 5);
}

function endPeer() {
  clearInterval(poll);
  if (pc) pc.close();
  pc = null;
  pending = [];
}

async function startCall() {
  call = crypto.randomUUID();
  marks = {};
  t0 = performance.now();
  send('call.invite', {call, to: q.get('callee'), media: {audio: true, video: false}});
}

async function waitForAudio() {
  const deadline = performance.now() + 10000;
  while ((marks.ice === undefined || marks.audio === undefined) && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function handle(m) {
  switch (m.type) {
  case 'welcome':
    report({event: 'ready'});
    if (role === 'caller') setTimeout(startCall, 300);
    break;
  case 'call.incoming':
    call = m.call; marks = {}; t0 = performance.now();
    send('call.accept', {call});
    newPeer();
    break;
  case 'call.accepted': {
    newPeer();
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    send('call.signal', {call, description: {type: offer.type, sdp: offer.sdp}});
    await waitForAudio();
    const last = done === calls - 1;
    report({event: 'call', index: done, ice: marks.ice, audio: marks.audio, steady: last});
    if (last) report({event: 'steady-start'});
    await new Promise((r) => setTimeout(r, last ? steady : talk));
    if (last) report({event: 'steady-end'});
    send('call.hangup', {call});
    endPeer();
    done += 1;
    if (done < calls) setTimeout(startCall, 200); else report({event: 'done'});
    break;
  }
  case 'call.signal':
    if (!pc || m.call !== call) break;
    if (m.description) {
      await pc.setRemoteDescription(m.description);
      for (const c of pending) await pc.addIceCandidate(c);
      pending = [];
      if (m.description.type === 'offer') {
        const answer = await pc.createAnswer();
        await pc.setLocalDescription(answer);
        send('call.signal', {call, description: {type: answer.type, sdp: answer.sdp}});
      }
    } else if (m.candidate) {
      if (pc.remoteDescription) await pc.addIceCandidate(m.candidate); else pending.push(m.candidate);
    }
    break;
  case 'call.ended':
    if (m.call === call) endPeer();
    break;
  }
}

(async () => {
  try {
    stream = await navigator.mediaDevices.getUserMedia({audio: true});
  } catch (e) {
    report({event: 'error', message: 'getUserMedia: ' + e});
    return;
  }
  ws = new WebSocket(q.get('ws') + '?access_token=' + encodeURIComponent(q.get('token')), 'parley.v1');
  setInterval(() => { if (ws.readyState === 1) send('ping', {}); }, 15000);
  ws.onopen = () => ws.send(JSON.stringify({type: 'hello', id: 'h1', device: q.get('device'),
                                             client: {name: 'parley-bench-page', version: '1', platform: 'web'}}));
  ws.onmessage = (e) => handle(JSON.parse(e.data)).catch((err) => report({event: 'error', message: String(err)}));
  ws.onclose = (e) => report({event: 'closed', code: e.code});
})();
</script>
"""#
}
