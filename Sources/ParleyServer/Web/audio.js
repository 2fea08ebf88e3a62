// Audio helpers: playing remote streams and metering them with a WebAudio analyser
// (Chromium's `audioLevel` statistic stays 0 in some setups; the analyser always works).

let context;

/** One AudioContext for the page, resumed on use (browsers start it suspended without a gesture). */
export function audioContext() {
  context ??= new AudioContext();
  if (context.state === 'suspended') context.resume().catch(() => {});
  return context;
}

/** Plays a remote stream through an <audio> element (Chromium decodes remote audio only while played). */
export function play(stream, element = new Audio()) {
  element.srcObject = stream;
  element.play().catch(() => {});
  return element;
}

export class LevelMeter {
  constructor(stream) {
    const ctx = audioContext();
    this.source = ctx.createMediaStreamSource(stream);
    this.analyser = ctx.createAnalyser();
    this.analyser.fftSize = 4096;
    this.analyser.smoothingTimeConstant = 0.2;
    this.source.connect(this.analyser);
    this.samples = new Float32Array(this.analyser.fftSize);
    this.spectrum = new Float32Array(this.analyser.frequencyBinCount);
  }

  /** RMS level of the last frame in dBFS (−100 for silence). */
  levelDb() {
    this.analyser.getFloatTimeDomainData(this.samples);
    let sum = 0;
    for (const x of this.samples) sum += x * x;
    const rms = Math.sqrt(sum / this.samples.length);
    return rms > 0 ? Math.max(-100, 20 * Math.log10(rms)) : -100;
  }

  /** The strongest frequency in Hz, or undefined while there is no signal. */
  dominantFrequency() {
    if (this.levelDb() < -60) return undefined;
    this.analyser.getFloatFrequencyData(this.spectrum);
    let best = 1;
    for (let i = 2; i < this.spectrum.length; i++) if (this.spectrum[i] > this.spectrum[best]) best = i;
    return best * this.analyser.context.sampleRate / this.analyser.fftSize;
  }

  close() {
    this.source.disconnect();
  }
}
