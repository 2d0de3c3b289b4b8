// Kept conversations: the server's endpoints for one (`/conversations/<id>/`), and the list in the sidebar (an htmx
// partial, searched as you type) with open, rename and delete.
import { el } from "./dom.js";

const csrf = () => JSON.parse(document.body.getAttribute("hx-headers") ?? "{}")["X-CSRFToken"] ?? "";

// The answer's JSON, null for a conversation that is gone (deleted elsewhere); other failures throw with the server's
// message.
async function call(method, url, body) {
  const response = await fetch(url, {
    method,
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 404) return null;
  if (!response.ok) {
    const detail = await response.json().catch(() => null);
    throw new Error(detail?.error?.message ?? `the server answered ${response.status}`);
  }
  return response.status === 204 ? {} : response.json();
}

export const conversations = {
  load: (id) => call("GET", `/conversations/${id}/`),
  rename: (id, title) => call("PATCH", `/conversations/${id}/`, { title }),
  remove: (id) => call("DELETE", `/conversations/${id}/`),
  show: (id, message) => call("PUT", `/conversations/${id}/current`, { message }),
  deleteTurn: (id, message) => call("DELETE", `/conversations/${id}/messages/${message}/`),
};

// The list: `open(id)` when one is picked, `removed(id)` after one was deleted, `failed(message)` when the server said
// no.
export class ConversationList {
  constructor(host, { open, removed, failed }) {
    this.host = host;
    host.addEventListener("click", async (event) => {
      const button = event.target.closest("button[data-do]");
      if (!button) return;
      const id = Number(button.closest("[data-conversation]").dataset.conversation);
      try {
        if (button.dataset.do === "open") open(id);
        else if (button.dataset.do === "rename") this.rename(button.closest("li"), id);
        else if (button.dataset.do === "delete") await this.remove(button, id, removed);
      } catch (error) {
        failed(`Could not change that conversation: ${error.message}.`);
      }
    });
  }

  refresh() {
    htmx.trigger(document.body, "conversation-saved");
  }

  // Marks the open conversation in the list (after each refresh too).
  mark(id) {
    this.current = id;
    for (const li of this.host.querySelectorAll("[data-conversation]")) li.classList.toggle("open", Number(li.dataset.conversation) === id);
  }

  // The title becomes a box: Enter saves, Escape (or leaving it) keeps the old one.
  rename(li, id) {
    const title = li.querySelector('[data-do="open"]');
    const box = el("input", { class: "rename-box", value: title.textContent, maxLength: 120, "aria-label": "new title" });
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const text = box.value.trim();
      box.replaceWith(title);
      if (!save || !text || text === title.textContent) return;
      await conversations.rename(id, text);
      title.textContent = text;
      this.refresh();
    };
    box.addEventListener("keydown", (event) => {
      if (event.key === "Enter") finish(true);
      else if (event.key === "Escape") finish(false);
    });
    box.addEventListener("blur", () => finish(false));
    title.replaceWith(box);
    box.focus();
    box.select();
  }

  // Two clicks: the first asks ("Delete?"), the second deletes.
  async remove(button, id, removed) {
    if (button.dataset.armed !== "yes") {
      button.dataset.armed = "yes";
      button.textContent = "Delete?";
      setTimeout(() => {
        button.dataset.armed = "";
        button.textContent = "Delete";
      }, 4000);
      return;
    }
    await conversations.remove(id);
    removed(id);
    this.refresh();
  }
}
