"""Agent frameworks on a live server through the Responses API, as people run them: the OpenAI Agents SDK's default
`Agent` (its model is a plain name, so it speaks the Responses API) running a function tool to a final answer, and
LangChain's `ChatOpenAI(use_responses_api=True)` answering, streaming and calling a tool."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI

from webapp.usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)
SYSTEM = "You are a helpful assistant."


def test_an_agents_sdk_agent_runs_a_function_tool_to_a_final_answer(site_server: Any, make_key: Any) -> None:
    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    client = AsyncOpenAI(base_url=site_server.api, api_key=make_key(), max_retries=0, timeout=120)
    set_default_openai_client(client, use_for_tracing=False)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"Sunny, 24 °C in {city}"

    # The SDK resets tool_choice to "auto" after the tool ran, so the second turn may answer in words.
    settings = ModelSettings(tool_choice="required", temperature=0, max_tokens=80)
    agent = Agent(name="Assistant", instructions=SYSTEM, model="smollm2", tools=[get_weather], model_settings=settings)
    result = asyncio.run(Runner.run(agent, "What's the weather in Paris?", max_turns=4))
    assert asked == ["Paris"]
    assert [type(item) for item in result.new_items] == [ToolCallItem, ToolCallOutputItem, MessageOutputItem]
    assert isinstance(result.final_output, str) and result.final_output
    ids = [r.response_id for r in result.raw_responses]
    assert len(ids) == 2 and all(i and i.startswith("resp_") for i in ids)
    rows = UsageRecord.objects.filter(request_id__in=ids)
    assert sorted(r.endpoint for r in rows) == ["responses", "responses"] and all(r.status == 200 for r in rows)


def test_langchain_chat_openai_on_the_responses_api_answers_streams_and_calls_tools(
    site_server: Any, make_key: Any
) -> None:
    llm = ChatOpenAI(
        model="smollm2",
        base_url=site_server.api,
        api_key=make_key(),  # type: ignore[arg-type]
        use_responses_api=True,
        temperature=0,
        max_tokens=40,  # type: ignore[call-arg]
        max_retries=0,
    )
    question = [SystemMessage(SYSTEM), HumanMessage("What's the capital of India?")]
    answer = llm.invoke(question)
    assert answer.text == "The capital of India is New Delhi."
    assert answer.usage_metadata is not None and answer.usage_metadata["input_tokens"] == 27
    assert str(answer.response_metadata["id"]).startswith("resp_")
    assert "".join(chunk.text for chunk in llm.stream(question)) == answer.text

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"Sunny in {city}"

    ask = [HumanMessage("What's the weather in Paris?")]
    called = llm.bind_tools([get_weather], tool_choice="required").invoke(ask)
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [("get_weather", {"city": "Paris"})]
    result = ToolMessage("Sunny, 24 °C", tool_call_id=called.tool_calls[0]["id"])
    followed = llm.bind_tools([get_weather]).invoke([*ask, called, result])
    assert followed.text and not followed.tool_calls
