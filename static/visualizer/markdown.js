// Answers rendered as Markdown, while they stream: marked parses, DOMPurify sanitizes every piece before it reaches
// the page, highlight.js colours finished code blocks. Blocks that are complete are rendered once and kept; only the
// last ones, still being written, are drawn again, so an answer costs about the same per token at its end as at its
// start.
import DOMPurify from "../vendor/dompurify-3.5.0/purify.es.js";
import hljs from "../vendor/highlight.js-11.12.0/highlight.min.js";
import { Marked } from "../vendor/marked-18.3.0/marked.esm.js";
import { el } from "./dom.js";

const escape = (text) => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// GitHub-flavoured Markdown with single newlines kept (chat answers use them for lines of a poem or an address).
// An image becomes a link to it: the page loads nothing a model names. HTML in the text is shown as the text it is
// (as the exact tokens would show it): it is never parsed as markup, so not even a sanitizer's inert parse sees an
// event handler to report to the page's Content-Security-Policy.
const markdown = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    html({ text }) {
      return escape(text);
    },
    image({ href, text }) {
      return `<a href="${escape(href ?? "")}">${escape(text || href || "image")}</a>`;
    },
  },
});

// No scripts, no event handlers, no forms, no styles, no ids or names (a model's `id="prompt"` must not shadow the
// page's own elements), no embedded documents; links open elsewhere without the page's referrer.
const PURIFY = {
  FORBID_TAGS: ["style", "img", "form", "input", "button", "textarea", "select", "iframe", "frame", "object", "embed", "svg", "math", "video", "audio", "link", "meta", "base"],
  FORBID_ATTR: ["id", "name", "style", "srcset", "formaction"],
  ALLOW_DATA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};
DOMPurify.addHook("uponSanitizeAttribute", (node, data) => {
  // classes only as marked writes them on code (the language), never the page's own
  if (data.attrName === "class" && !(node.nodeName === "CODE" && /^language-[\w+#.-]+$/.test(data.attrValue))) data.keepAttr = false;
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

// Sanitized nodes for `source` (Markdown), with code blocks framed (language, copy button) and, when `highlight`,
// coloured.
function render(source, highlight) {
  const fragment = DOMPurify.sanitize(markdown.parser(markdown.lexer(source)), PURIFY);
  for (const code of fragment.querySelectorAll("pre > code")) frameCode(code, highlight);
  return fragment;
}

function frameCode(code, highlight) {
  const pre = code.parentElement;
  const language = (code.className.match(/language-([\w+#.-]+)/) ?? [])[1] ?? "";
  const frame = el("div", { class: "code-block" });
  const head = el("div", { class: "code-head" });
  head.append(el("span", { class: "code-lang" }, language || "code"), el("button", { type: "button", class: "copy-code" }, "Copy"));
  pre.replaceWith(frame);
  frame.append(head, pre);
  if (highlight) colour(code, language);
}

function colour(code, language) {
  if (code.dataset.highlighted) return;
  if (language && hljs.getLanguage(language)) code.innerHTML = hljs.highlight(code.textContent, { language }).value;
  else code.innerHTML = hljs.highlightAuto(code.textContent).value;
  code.classList.add("hljs");
  code.dataset.highlighted = "yes";
}

const LIVE_BLOCKS = 2; // the last blocks stay live: a list's next item may still join it after a blank line

// One answer as it streams into `host`: `update(text)` with the whole text so far (it may only have grown),
// `finish()` once it is complete.
export class StreamingMarkdown {
  constructor(host) {
    this.done = el("div", { class: "md-done" });
    this.live = el("div", { class: "md-live" });
    host.replaceChildren(this.done, this.live);
    this.text = "";
    this.kept = 0; // characters of `text` rendered into `done`, never drawn again
    this.liveText = null;
  }

  update(raw) {
    const text = raw.replace(/\r\n?/g, "\n");
    if (text === this.text) return;
    if (!text.startsWith(this.text.slice(0, this.kept))) this.reset();
    this.text = text;
    const tokens = markdown.lexer(text.slice(this.kept));
    const blocks = tokens.map((t, i) => (t.type === "space" ? -1 : i)).filter((i) => i >= 0);
    const freeze = blocks.length > LIVE_BLOCKS ? blocks[blocks.length - LIVE_BLOCKS] : 0;
    const settled = tokens.slice(0, freeze).map((t) => t.raw).join("");
    if (settled && text.startsWith(settled, this.kept)) {
      this.done.append(render(settled, true));
      this.kept += settled.length;
    }
    const rest = text.slice(this.kept);
    if (rest !== this.liveText) {
      this.live.replaceChildren(render(rest, false));
      this.liveText = rest;
    }
  }

  finish() {
    this.live.replaceChildren(render(this.text.slice(this.kept), true));
  }

  reset() {
    this.done.replaceChildren();
    this.live.replaceChildren();
    this.text = "";
    this.kept = 0;
    this.liveText = null;
  }
}

// The copy buttons of code blocks, for every one inside `root`, present or future.
export function copyCodeButtons(root, copy) {
  root.addEventListener("click", (event) => {
    const button = event.target.closest(".copy-code");
    if (!button) return;
    copy(button.closest(".code-block").querySelector("code").textContent, button);
  });
}
