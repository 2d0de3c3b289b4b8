// Small DOM helpers. Text always goes in as textContent: model and user text can never become HTML.

export function el(tag, props = {}, text = null) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  if (text !== null) node.textContent = text;
  return node;
}

export function field(stage, name) {
  return document.querySelector(`#stage-${stage} [data-field="${name}"]`);
}

export function clock(stage, text) {
  const node = document.querySelector(`#stage-${stage} .clock`);
  if (node && node.textContent !== text) node.textContent = text;
}

// A stage the run has reached lights up (its clock shows it is still busy).
export function light(stage) {
  const node = document.getElementById(`stage-${stage}`);
  if (!node.classList.contains("active")) node.classList.add("active");
}

export function ms(value) {
  if (value === null || value === undefined) return "—";
  return value < 10 ? `${value.toFixed(2)} ms` : `${value.toFixed(0)} ms`;
}

// Whitespace and control characters made visible, for token chips.
export function visible(text) {
  return text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥");
}

export function hex(bytes) {
  return bytes.map((b) => b.toString(16).padStart(2, "0")).join(" ");
}
