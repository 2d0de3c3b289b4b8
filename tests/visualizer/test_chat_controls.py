"""The chat as a visitor first meets it (the pipeline folded to its strip, answers rendered, the chat sampling), in
real headless Chromium against a real server and model: Markdown and code blocks, hostile text kept inert, message
controls whose result the kept conversation agrees with after a reload, conversations, the strip, and a phone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from page_actions import answer, ask, exported, open_page, settings, wait_done

from visualizer.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)
SMOLLM2 = "smollm2-135m-instruct"


def conversation_id(page: Any) -> int:
    return int(page.evaluate("() => localStorage.getItem('roundtrip.conversation')"))


def kept(page: Any) -> list[tuple[str, str]]:
    """The thread the server keeps for the open conversation."""
    return [(m.role, m.content) for m in Conversation.objects.get(pk=conversation_id(page)).thread()]


def on_screen(page: Any) -> list[tuple[str, str]]:
    """(role, message id) per bubble, mapped to the kept messages' text: what the screen shows, as stored."""
    ids = page.evaluate("() => [...document.querySelectorAll('#bubbles .bubble')].map((b) => Number(b.dataset.id))")
    messages = {m.pk: m for m in Conversation.objects.get(pk=conversation_id(page)).messages.all()}
    return [(messages[i].role, messages[i].content) for i in ids]


def reload(page: Any) -> None:
    page.reload()
    page.wait_for_selector(".status.connected", timeout=15000)
    page.wait_for_selector("#bubbles .bubble", timeout=15000)


def greedy_answer(page: Any, question: str, max_tokens: int) -> None:
    """SmolLM2's greedy answer to `question`, at most `max_tokens` long: the same text every run."""
    page.check("#greedy")
    settings(page, max_tokens=str(max_tokens))
    ask(page, question, model=SMOLLM2)
    wait_done(page)


def test_a_markdown_answer_renders_as_a_list_with_bold_text(chat_page: Any, screenshot: Any) -> None:
    page = chat_page
    greedy_answer(page, "Give me three tips for sleeping better.", 120)
    bubble = page.locator(".bubble.assistant").last
    assert bubble.locator(".answer ol > li").count() >= 2  # "1. **Avoiding Caffeine…**" became a list
    assert bubble.locator(".answer li strong").count() >= 2
    assert "**" not in bubble.locator(".answer").inner_text()
    screenshot(page, "chat-markdown")
    # the exact text, token by token, is one click away
    bubble.locator('[data-action="view"]').click()
    assert "**" in bubble.locator(".tokens-view").inner_text() and bubble.locator(".tokens-view .tok").count() == 120
    assert bubble.locator(".answer").is_hidden()


def test_a_code_block_is_highlighted_and_its_copy_button_copies_it(chat_page: Any, screenshot: Any) -> None:
    page = chat_page
    greedy_answer(page, "Write a Python function that checks whether a number is prime.", 110)
    block = page.locator(".bubble.assistant .code-block").first
    assert block.locator(".code-lang").inner_text() == "python"
    assert block.locator("code.hljs .hljs-keyword").count() >= 2  # def, if, return … coloured
    block.locator(".copy-code").click()
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied.startswith("def is_prime(n):") and copied == block.locator("code").inner_text()
    assert block.locator(".copy-code").inner_text() == "Copied"
    screenshot(block, "chat-code-block")


HOSTILE = (
    "Look: <img src=x onerror=\"document.title='pwned'\"> <script>document.title='pwned'</script> "
    "[a link](javascript:document.title='pwned') <a href=\"javascript:document.title='pwned'\">another</a> "
    '<div id="prompt" onclick="document.title=\'pwned\'">a shadow of the message box</div> '
    '<iframe src="/"></iframe> <form action="/"><button>go</button></form> **still bold**'
)
WATCH_VIOLATIONS = (
    "window.violations = []; "
    "document.addEventListener('securitypolicyviolation', (e) => window.violations.push(e.violatedDirective));"
)


def test_markup_from_the_model_or_the_visitor_stays_inert_under_the_enforced_policy(
    chat_page: Any, browser: Any, site_server: Any, tmp_path: Path, screenshot: Any
) -> None:
    """A model's answer with HTML and script in it (a recording whose text is replaced, then imported and replayed),
    and the same text typed as a message: nothing runs, nothing loads, the page's own elements keep their ids, and
    the browser reports no policy violation (so nothing reached the policy to be blocked)."""
    settings(chat_page, max_tokens="4")
    ask(chat_page, "hi", model="tiny")
    wait_done(chat_page)
    recorded = exported(chat_page, tmp_path)
    texts = [f["frame"]["event"] for f in recorded["frames"] if f["frame"].get("event", {}).get("event") == "text"]
    for i, event in enumerate(texts):
        event["text"] = HOSTILE if i == 0 else ""
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(recorded))

    context = browser.new_context(viewport={"width": 1500, "height": 1000})  # the policy enforced: no bypass
    context.add_init_script(WATCH_VIOLATIONS)
    page = context.new_page()
    problems: list[str] = []
    dialogs: list[str] = []
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("console", lambda m: problems.append(m.text) if "Content Security Policy" in m.text else None)
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(site_server.url + "/")
        page.locator(".status.connected").wait_for(timeout=15000)
        page.click("#recording summary")
        page.set_input_files("#import-run", str(hostile))
        page.click("#replay-run")
        page.locator(".bubble.assistant .answer strong", has_text="still bold").wait_for(timeout=15000)
        page.locator("#send:not([disabled])").wait_for(timeout=15000)
        bubbles = page.locator("#bubbles")
        foreign = "img, script, iframe, form, button:not(.act):not(.copy-code), [onerror], [onclick]"
        assert bubbles.locator(foreign).count() == 0  # the model's answer, replayed: its HTML shown as text
        assert "<script>document.title='pwned'</script>" in bubbles.locator(".answer").last.inner_text()
        assert bubbles.locator('a[href^="javascript"], [id]').count() == 0
        screenshot(page.locator("#bubbles"), "chat-inert-answer")
        page.fill("#prompt", HOSTILE)  # the visitor's own message: plain text, exactly as typed
        page.check("#greedy")
        settings(page, model=SMOLLM2, max_tokens="4")  # the tiny model's context is too short for this message
        page.click("#send")
        page.locator(".bubble.user[data-id]").wait_for(timeout=60000)  # kept: the turn is over
        assert bubbles.locator(foreign).count() == 0
        assert bubbles.locator('a[href^="javascript"], [id]').count() == 0
        assert page.evaluate("() => document.getElementById('prompt').tagName") == "TEXTAREA"
        assert page.locator(".bubble.user .text").last.inner_text() == HOSTILE
        assert page.title() == "Roundtrip" and dialogs == []
        assert page.evaluate("() => window.violations") == [] and problems == []
        screenshot(page.locator("#bubbles"), "chat-inert-markup")
    finally:
        context.close()


def test_regenerate_keeps_the_earlier_answer_one_click_away_and_a_reload_agrees(
    chat_page: Any, screenshot: Any
) -> None:
    page = chat_page
    settings(page, max_tokens="8", temperature="1")
    ask(page, "the heat is on", model="tiny")
    wait_done(page)
    first = answer(page)
    page.locator('.bubble.assistant [data-action="regenerate"]').click()
    wait_done(page)
    bubble = page.locator(".bubble.assistant").last
    assert bubble.locator(".version-n").inner_text() == "2 / 2" and page.locator(".bubble.user").count() == 1
    second = answer(page)
    bubble.locator('[data-action="older"]').click()
    page.locator(".bubble.assistant .version-n", has_text="1 / 2").wait_for(timeout=10000)
    assert answer(page) == first and on_screen(page) == kept(page)
    reload(page)
    assert page.locator(".bubble.assistant .version-n").inner_text() == "1 / 2" and answer(page) == first
    page.locator('.bubble.assistant [data-action="newer"]').click()
    page.locator(".bubble.assistant .version-n", has_text="2 / 2").wait_for(timeout=10000)
    assert answer(page) == second and on_screen(page) == kept(page)
    screenshot(page.locator("#bubbles"), "chat-regenerate")


def test_edit_and_resend_branches_the_conversation_and_a_reload_agrees(chat_page: Any, screenshot: Any) -> None:
    page = chat_page
    settings(page, max_tokens="6")
    ask(page, "first question", model="tiny")
    wait_done(page)
    ask(page, "second question", model="tiny")
    wait_done(page)
    question = page.locator(".bubble.user").first
    question.locator('[data-action="edit"]').click()
    page.fill(".edit-box", "first question, edited")
    page.click('.edit-form button[type="submit"]')
    wait_done(page)
    assert page.locator(".bubble.user .text").all_inner_texts() == ["first question, edited"]
    assert page.locator(".bubble.user .version-n").inner_text() == "2 / 2"
    screenshot(page.locator("#bubbles"), "chat-edit")
    page.locator('.bubble.user [data-action="older"]').click()
    page.locator(".bubble.user .version-n", has_text="1 / 2").wait_for(timeout=10000)
    assert page.locator(".bubble.user .text").all_inner_texts() == ["first question", "second question"]
    assert on_screen(page) == kept(page)
    reload(page)
    assert page.locator(".bubble.user .text").all_inner_texts() == ["first question", "second question"]
    assert on_screen(page) == kept(page)


def test_an_answer_cut_by_length_says_so_and_continues_in_place(chat_page: Any, screenshot: Any) -> None:
    page = chat_page
    page.check("#greedy")  # sampled, the tiny model could end its answer within six tokens
    settings(page, max_tokens="6")
    ask(page, "tell me a long story", model="tiny")
    wait_done(page)
    bubble = page.locator(".bubble.assistant").last
    assert bubble.locator(".finish").inner_text().startswith("stopped: length — Continue")
    before = answer(page)
    screenshot(bubble, "chat-length")
    bubble.locator('[data-action="continue"]').click()
    wait_done(page)
    after = answer(page)
    assert page.locator(".bubble.assistant").count() == 1
    assert after.startswith(before.rstrip()) and len(after) > len(before)
    assert "12 tokens" in page.locator(".bubble.assistant .stats").inner_text()
    reload(page)
    assert answer(page) == after and on_screen(page) == kept(page)


def test_stop_keeps_what_was_written_and_says_stopped_even_before_the_first_token(
    chat_page: Any, screenshot: Any
) -> None:
    page = chat_page
    ask(page, "a long answer, please", model="tiny", speed="step")  # the engine waits after each token
    page.locator(".bubble.assistant .answer:not(:empty)").wait_for(timeout=30000)
    page.click("#cancel")
    wait_done(page)
    stopped = page.locator(".bubble.assistant").last
    assert stopped.locator(".finish").inner_text() == "stopped" and answer(page)
    # Stop pressed with the message: nothing may have arrived yet
    page.fill("#prompt", "and another")
    page.evaluate("() => { document.getElementById('send').click(); document.getElementById('cancel').click(); }")
    wait_done(page)
    stopped = page.locator(".bubble.assistant").last
    assert stopped.locator(".finish").inner_text() == "stopped"
    assert page.locator(".bubble.user").count() == 2
    screenshot(page.locator("#bubbles"), "chat-stopped")
    reload(page)
    assert page.locator(".bubble.assistant .finish").all_inner_texts() == ["stopped", "stopped"]
    assert on_screen(page) == kept(page)


def test_conversations_are_renamed_searched_deleted_and_reopened_after_a_reload(
    chat_page: Any, screenshot: Any
) -> None:
    page = chat_page
    settings(page, max_tokens="4")
    ask(page, "pancakes please", model="tiny")
    wait_done(page)
    page.click("#new-conversation")
    assert page.locator("#bubbles .bubble").count() == 0
    ask(page, "what is the capital of India", model="tiny")
    wait_done(page)
    titles = page.locator(".conversation-title")
    page.wait_for_function("document.querySelectorAll('.conversation-title').length === 2", timeout=10000)
    assert titles.all_inner_texts() == ["what is the capital of India", "pancakes please"]
    page.fill("#conversation-search", "pancake")
    page.wait_for_function("document.querySelectorAll('.conversation-title').length === 1", timeout=10000)
    item = page.locator(".conversation-list li").first
    item.locator('[data-do="rename"]').click()
    page.fill(".rename-box", "Breakfast")
    page.press(".rename-box", "Enter")
    page.locator(".conversation-title", has_text="Breakfast").wait_for(timeout=10000)
    page.locator(".conversation-title", has_text="Breakfast").click()
    page.locator(".bubble.user .text", has_text="pancakes please").wait_for(timeout=10000)
    screenshot(page, "chat-conversations")
    reload(page)  # the conversation you were in
    assert page.locator(".bubble.user .text").all_inner_texts() == ["pancakes please"]
    page.fill("#conversation-search", "")
    page.wait_for_function("document.querySelectorAll('.conversation-title').length === 2", timeout=10000)
    other = page.locator(".conversation-list li", has_text="capital of India")
    other.locator('[data-do="delete"]').click()
    assert other.locator('[data-do="delete"]').inner_text() == "Delete?"
    other.locator('[data-do="delete"]').click()
    page.wait_for_function("document.querySelectorAll('.conversation-title').length === 1", timeout=10000)
    assert Conversation.objects.count() == 1 and Conversation.objects.get().title == "Breakfast"


def test_the_folded_pipeline_keeps_all_eight_clocks_live_and_opens_at_a_stage(chat_page: Any, screenshot: Any) -> None:
    page = chat_page
    assert page.locator("#pipeline").is_hidden()
    settings(page, max_tokens="6")
    ask(page, "the heat is on", model="tiny")
    wait_done(page)
    clocks = page.locator(".strip-stage .strip-clock").all_inner_texts()
    assert len(clocks) == 8 and all(c.endswith(" ms") for c in clocks), clocks
    assert page.locator(".strip-stage.reached").count() == 8
    screenshot(page.locator(".chat-head"), "chat-strip")
    page.click('.strip-stage[data-stage="sampling"]')
    page.locator("#stage-sampling .bar").first.wait_for(timeout=10000)  # drawn once shown
    assert page.locator("#pipeline").is_visible() and page.get_attribute("#pipeline-toggle", "aria-expanded") == "true"
    assert page.locator("#stage-sampling").evaluate("(s) => s.getBoundingClientRect().top < innerHeight")
    reload(page)  # the choice is remembered
    assert page.locator("#pipeline").is_visible()


def test_on_a_phone_the_message_box_is_in_the_first_screen_and_nothing_scrolls_sideways(
    browser: Any, site_server: Any, screenshot: Any
) -> None:
    context, page, errors = open_page(browser, site_server.url, {}, viewport={"width": 390, "height": 844})
    try:
        box = page.locator("#prompt").bounding_box()
        assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 844
        assert page.locator("#send").is_visible() and page.locator("#sidebar").is_hidden()
        assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
        screenshot(page, "phone-chat-empty")
        settings(page, max_tokens="40")
        page.check("#greedy")
        ask(page, "Give me three tips for sleeping better.", model=SMOLLM2)
        wait_done(page)
        box = page.locator("#prompt").bounding_box()
        assert box is not None and box["y"] + box["height"] <= 844  # still there with an answer above it
        assert page.evaluate("() => document.documentElement.scrollWidth <= innerWidth")
        screenshot(page, "phone-chat-answer")
        page.click("#sidebar-toggle")
        assert page.locator("#settings").is_visible()
        screenshot(page, "phone-chat-settings")
        page.click("#sidebar-close")
        assert page.locator("#sidebar").is_hidden()
    finally:
        context.close()
    assert errors == []
