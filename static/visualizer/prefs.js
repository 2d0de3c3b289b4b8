// Choices the page remembers in this browser (the pipeline open or folded, the last conversation, greedy or not).
// Storage can be off (private windows, policies): then nothing is remembered and nothing breaks.

const PREFIX = "roundtrip.";

export function recall(name, fallback = null) {
  try {
    return localStorage.getItem(PREFIX + name) ?? fallback;
  } catch {
    return fallback;
  }
}

export function remember(name, value) {
  try {
    if (value === null || value === undefined) localStorage.removeItem(PREFIX + name);
    else localStorage.setItem(PREFIX + name, String(value));
  } catch {
    // not remembered
  }
}
