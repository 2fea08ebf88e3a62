// Call quality from WebRTC statistics: the same E-model and smoothing as the Swift SDK
// (Sources/ParleyKit/Quality.swift), so a browser and a Linux client score a call alike.
//
//   R   = 93.2 − Id − Ie,eff
//   Id  = 0.024·d + 0.11·(d − 177.3)·H(d − 177.3)     d = rtt/2 + 2·jitter + codec delay (ms)
//   Ie,eff = Ie' + (95 − Ie') · loss / (loss + Bpl)    Ie' = Ie + k · max(0, full − codec kbit/s)
//   (the SDK also weighs bursty loss by G.107's BurstR; a browser's statistics do not say how loss
//   runs, so here loss counts as random)
//   MOS = 1 + 0.035·R + 7·10⁻⁶·R·(R − 60)·(100 − R)    (1 below R = 0, 4.5 above R = 100)

// Fitted to PESQ on an impaired wire (docs/quality.md), as the SDK's EModel.opus.
export const opus = Object.freeze({ equipmentImpairment: 11, packetLossRobustness: 19, codecDelayMs: 26.5,
                                    fullQualityKbps: 20, impairmentPerMissingKbps: 5 });

export function rating({ rttMs, jitterMs, lossPct, codecKbps }, model = opus) {
  const delay = rttMs / 2 + 2 * jitterMs + model.codecDelayMs;
  const delayImpairment = 0.024 * delay + (delay > 177.3 ? 0.11 * (delay - 177.3) : 0);
  const loss = Math.max(0, Math.min(100, lossPct));
  const base = codecKbps > 0
    ? model.equipmentImpairment + model.impairmentPerMissingKbps * Math.max(0, model.fullQualityKbps - codecKbps)
    : model.equipmentImpairment;
  const ie = base + (95 - base) * loss / (loss + model.packetLossRobustness);
  return 93.2 - delayImpairment - ie;
}

export function mos(r) {
  if (r <= 0) return 1;
  if (r >= 100) return 4.5;
  return 1 + 0.035 * r + 7e-6 * r * (r - 60) * (100 - r);
}

/** G.107 Annex B satisfaction bands as 1…5 bars. */
export function score(r) {
  return r >= 90 ? 5 : r >= 80 ? 4 : r >= 70 ? 3 : r >= 60 ? 2 : 1;
}

/** Reads the audio figures of one `RTCPeerConnection.getStats()` report. Counters are cumulative. */
export function sampleFromStats(report, at = performance.now()) {
  const sample = { at, rttMs: undefined, jitterMs: undefined, packetsReceived: 0, packetsLost: 0, bytesSent: 0, bytesReceived: 0 };
  report.forEach((s) => {
    if (s.kind !== 'audio' && s.mediaType !== 'audio') return;
    if (s.type === 'inbound-rtp') {
      sample.packetsReceived += s.packetsReceived || 0;
      sample.packetsLost += Math.max(0, s.packetsLost || 0);
      sample.bytesReceived += s.bytesReceived || 0;
      if (s.jitter !== undefined) sample.jitterMs = s.jitter * 1000;
    } else if (s.type === 'outbound-rtp') {
      sample.bytesSent += s.bytesSent || 0;
    } else if (s.type === 'remote-inbound-rtp' && s.roundTripTime !== undefined) {
      sample.rttMs = s.roundTripTime * 1000;
    }
  });
  return sample;
}

/**
 * Whether packets arrive, as the SDK's `MediaArrivals`: silent once `silenceAfterMs` pass without a
 * packet (from the first sample on, so a call that never receives anything counts). `add` answers
 * `false` or `true` when that changes, else undefined. A count that moved arrived, down too (a
 * source forgotten in a silence counts afresh).
 */
export class MediaArrivals {
  constructor(silenceAfterMs = 5000) {
    this.silenceAfterMs = silenceAfterMs;
    this.packets = 0;
    this.lastArrival = undefined;
    this.receiving = true;
  }

  add(sample) {
    const arrived = sample.packetsReceived !== this.packets && sample.packetsReceived > 0;
    this.packets = sample.packetsReceived;
    if (arrived || this.lastArrival === undefined) this.lastArrival = sample.at;
    if (arrived && !this.receiving) {
      this.receiving = true;
      return true;
    }
    if (!arrived && this.receiving && sample.at - this.lastArrival >= this.silenceAfterMs) {
      this.receiving = false;
      return false;
    }
    return undefined;
  }
}

/** Per-interval quality from cumulative samples, averaged over the last `window` intervals. */
export class QualityMonitor {
  constructor({ model = opus, window = 5 } = {}) {
    this.model = model;
    this.window = Math.max(1, window);
    this.previous = undefined;
    this.recent = [];
    this.windowBitrates = [];  // the window's mean bitrate at each of the last ten intervals
  }

  /** Takes a sample; returns the smoothed report once two samples can be compared, else undefined. */
  add(sample) {
    const previous = this.previous;
    this.previous = sample;
    if (!previous || !(sample.at > previous.at)) return undefined;
    const seconds = (sample.at - previous.at) / 1000;
    const received = Math.max(0, sample.packetsReceived - previous.packetsReceived);
    const lost = Math.max(0, sample.packetsLost - previous.packetsLost);
    const lossPct = received + lost > 0 ? 100 * lost / (received + lost) : 0;
    const bitrateKbps = seconds > 0 ? Math.max(0, sample.bytesReceived - previous.bytesReceived) * 8 / 1000 / seconds : 0;
    const last = this.recent[this.recent.length - 1];
    const rttMs = sample.rttMs ?? last?.rttMs ?? 0;
    const jitterMs = sample.jitterMs ?? last?.jitterMs ?? 0;
    // The codec's bitrate: the highest window bitrate of the last ten intervals, as the SDK reads it.
    const windowed = [...(this.window > 1 ? this.recent.slice(-(this.window - 1)) : []).map((entry) => entry.bitrateKbps), bitrateKbps];
    this.windowBitrates.push(windowed.reduce((sum, value) => sum + value, 0) / windowed.length);
    if (this.windowBitrates.length > 10) this.windowBitrates.splice(0, this.windowBitrates.length - 10);
    const codecKbps = Math.max(...this.windowBitrates);
    this.recent.push({ r: rating({ rttMs, jitterMs, lossPct, codecKbps }, this.model), rttMs, jitterMs, lossPct, bitrateKbps });
    if (this.recent.length > this.window) this.recent.splice(0, this.recent.length - this.window);
    const mean = (key) => this.recent.reduce((sum, entry) => sum + entry[key], 0) / this.recent.length;
    const r = mean('r');
    return { mos: mos(r), score: score(r), rttMs: mean('rttMs'), jitterMs: mean('jitterMs'),
             lossPct: mean('lossPct'), bitrateKbps: mean('bitrateKbps') };
  }
}

/** The form `call.report` carries (rounded as the SDK rounds it). */
export function callQuality(report) {
  return { mos: Math.round(report.mos * 100) / 100, rttMs: Math.round(report.rttMs), jitterMs: Math.round(report.jitterMs),
           lossPct: Math.round(report.lossPct * 10) / 10, bitrateKbps: Math.round(report.bitrateKbps) };
}
