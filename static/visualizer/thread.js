// A kept conversation as the server sends it (`/conversations/<id>/`): a tree of messages and the one shown last.
// The shown thread is the path from the root to `current`; a message's versions are its siblings of the same role.

export class Conversation {
  constructor(data = null) {
    this.id = data?.id ?? null;
    this.title = data?.title ?? "";
    this.system = data?.system_prompt ?? null;
    this.messages = new Map();
    this.current = data?.current ?? null;
    for (const m of data?.messages ?? []) this.messages.set(m.id, m);
  }

  add(message) {
    this.messages.set(message.id, message);
  }

  // The shown thread, oldest first.
  path() {
    return this.pathTo(this.current);
  }

  // The messages from the root down to `id` (included), oldest first; none for null.
  pathTo(id) {
    const out = [];
    for (let m = this.messages.get(id); m; m = this.messages.get(m.parent)) out.push(m);
    return out.reverse();
  }

  children(id) {
    return [...this.messages.values()].filter((m) => m.parent === id).sort((a, b) => a.id - b.id);
  }

  // The versions of `message` (itself included, oldest first) and its place among them.
  versions(message) {
    const all = this.children(message.parent).filter((m) => m.role === message.role);
    return { all, index: all.findIndex((m) => m.id === message.id) };
  }

  // The newest message below `id` (itself when none): where picking that version leads.
  leafOf(id) {
    let leaf = id;
    for (let below = this.children(leaf); below.length; below = this.children(leaf)) leaf = below[below.length - 1].id;
    return leaf;
  }

  // The chat messages the model reads for a thread that ends at message `id` (included; null: none yet), after
  // the system prompt.
  history(id, system) {
    const turns = this.pathTo(id).map((m) => ({ role: m.role, content: m.content }));
    return [...(system ? [{ role: "system", content: system }] : []), ...turns];
  }
}
