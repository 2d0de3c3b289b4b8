// Attention pictures on a canvas: the server sends 8-bit rows, each scaled to its own maximum.

export function decodeAttention(attention) {
  const raw = atob(attention.data);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function color(value) {
  // dark blue → yellow
  const v = value / 255;
  return [Math.round(20 + 235 * v), Math.round(30 + 200 * v), Math.round(90 - 60 * v)];
}

// One layer: a row per query head, a column per cached position; groups of heads sharing a KV head are separated.
export function drawLayer(canvas, attention, bytes, layer, groupSize) {
  const [, heads, positions] = attention.shape;
  const ctx = canvas.getContext("2d");
  const gap = 3;
  const groups = Math.ceil(heads / groupSize);
  const rowH = Math.max(4, Math.floor((canvas.height - gap * (groups - 1)) / heads));
  const colW = canvas.width / positions;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  for (let h = 0; h < heads; h++) {
    const y = h * rowH + Math.floor(h / groupSize) * gap;
    for (let p = 0; p < positions; p++) {
      const [r, g, b] = color(bytes[(layer * heads + h) * positions + p]);
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(Math.floor(p * colW), y, Math.ceil(colW), rowH - 1);
    }
  }
}

// Every layer × head: how sharply the head attends (its largest weight).
export function drawOverview(canvas, attention) {
  const [layers, heads] = attention.shape;
  const ctx = canvas.getContext("2d");
  const w = canvas.width / layers;
  const h = canvas.height / heads;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  for (let l = 0; l < layers; l++) {
    for (let k = 0; k < heads; k++) {
      const [r, g, b] = color(Math.round(255 * Math.min(1, attention.row_max[l][k])));
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(Math.floor(l * w), Math.floor(k * h), Math.ceil(w) - 1, Math.ceil(h) - 1);
    }
  }
}
