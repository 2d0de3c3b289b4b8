// Keyboard navigation through lists (token chips, answer tokens, stages, loop rows): the list is one Tab stop,
// arrow keys and Home/End move between its items, Enter acts like a click. A list is any element with
// data-rove="<selector of its items>"; one listener on the document serves them all, also items added later.

const NEXT = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1 };

function items(list) {
  return [...list.querySelectorAll(list.dataset.rove)];
}

// Makes the list's items focusable with exactly one of them in the Tab order (the last one focused, else the first).
export function roving(list) {
  const all = items(list);
  for (const item of all) if (!item.hasAttribute("tabindex")) item.tabIndex = -1;
  if (all.length && !all.some((item) => item.tabIndex === 0)) all[0].tabIndex = 0;
}

function focus(list, item) {
  for (const other of items(list)) other.tabIndex = -1;
  item.tabIndex = 0;
  item.focus();
}

document.addEventListener("keydown", (event) => {
  const list = event.target.closest?.("[data-rove]");
  if (!list || !event.target.matches(list.dataset.rove) || event.altKey || event.ctrlKey || event.metaKey) return;
  const all = items(list);
  const here = all.indexOf(event.target);
  let to = null;
  if (event.key in NEXT) to = all[here + NEXT[event.key]];
  else if (event.key === "Home") to = all[0];
  else if (event.key === "End") to = all[all.length - 1];
  else if (event.key === "Enter") event.target.click();
  else return;
  event.preventDefault();
  if (to) focus(list, to);
});

document.addEventListener("focusin", (event) => {
  const list = event.target.closest?.("[data-rove]");
  if (list && event.target.matches(list.dataset.rove)) focus(list, event.target);
});
