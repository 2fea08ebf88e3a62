// The live quality graph: MOS, round trip, loss and received bitrate over the last minute
// (one sample a second), one strip each, drawn on a canvas from the call's quality history.

const STRIPS = [
  { key: 'mos', label: 'MOS', unit: '', min: 1, max: 4.5, digits: 2, color: '#2f7d32' },
  { key: 'rttMs', label: 'RTT', unit: ' ms', min: 0, max: 300, digits: 0, color: '#1565c0' },
  { key: 'lossPct', label: 'Loss', unit: ' %', min: 0, max: 10, digits: 1, color: '#c62828' },
  { key: 'bitrateKbps', label: 'Bitrate', unit: ' kbps', min: 0, max: 80, digits: 0, color: '#6a1b9a' },
];

export function drawQuality(canvas, fullHistory, capacity = 60) {
  const history = fullHistory.slice(-capacity);
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 480;
  const height = canvas.clientHeight || 240;
  if (canvas.width !== width * ratio) { canvas.width = width * ratio; canvas.height = height * ratio; }
  const g = canvas.getContext('2d');
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  g.font = '12px system-ui, sans-serif';
  const strip = height / STRIPS.length;
  const left = 110;
  const plot = width - left - 8;
  STRIPS.forEach((s, row) => {
    const top = row * strip + 4;
    const h = strip - 10;
    const values = history.map((entry) => entry[s.key]);
    const latest = values[values.length - 1];
    // Scales grow with the data so a bad call stays on the chart.
    const max = Math.max(s.max, ...values.map((v) => v * 1.1));
    g.fillStyle = '#444';
    g.fillText(s.label, 8, top + 14);
    g.fillStyle = s.color;
    g.font = 'bold 16px system-ui, sans-serif';
    g.fillText(latest === undefined ? '–' : latest.toFixed(s.digits) + s.unit, 8, top + 34);
    g.font = '12px system-ui, sans-serif';
    g.strokeStyle = '#ddd';
    g.strokeRect(left, top, plot, h);
    if (values.length < 2) return;
    g.strokeStyle = s.color;
    g.lineWidth = 2;
    g.beginPath();
    values.forEach((v, i) => {
      const x = left + plot * i / (capacity - 1);
      const y = top + h - h * (Math.min(max, Math.max(s.min, v)) - s.min) / (max - s.min);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  });
}
