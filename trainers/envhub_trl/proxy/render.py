"""A request's messages as the model's chat template writes them, tools included.

:class:`TemplateView` renders a :class:`~envhub_trl.proxy.requests.ChatRequest` with the
tokenizer's own template. Where the template cannot say something, the proxy says it the way
envhub's own turn loop does: tools it does not render go into the system message
(:func:`envhub.tools.tools_text`), tool results it has no role for become ``<tool_response>``
user messages, an assistant's ``tool_calls`` it does not render are written into the content as
``<tool_call>`` blocks. An assistant message the proxy itself returned in the session is rendered
as the model wrote it (``replies``), so the history the model is shown next holds its own words.
``tool_choice`` ``"required"`` or a named tool prefills the start of a ``<tool_call>`` block.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from envhub.chat import ChatRenderer, renders_tools, tool_message_role
from envhub.tools import CALL_OPEN, ToolCall, tools_text
from envhub_trl.proxy.requests import ChatRequest, ProxyRequestError
from envhub_trl.proxy.sessions import reply_key

_PROBE = {"id": "c", "type": "function", "function": {"name": "envhub_probe_call", "arguments": {}}}


def renders_tool_calls(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes an assistant message's ``tool_calls``."""
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "", "tool_calls": [_PROBE]}]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template that rejects the field does not render it
        return False
    return isinstance(rendered, str) and "envhub_probe_call" in rendered


def prefill(request: ChatRequest) -> str:
    """The start of the reply written for the model: a ``<tool_call>`` block's opening when
    ``tool_choice`` asks for a call (naming the tool when it names one), else nothing."""
    if request.tool_choice == "required":
        return CALL_OPEN + '\n{"name": "'
    if request.named_tool is not None:
        return CALL_OPEN + "\n" + '{"name": ' + json.dumps(request.named_tool) + ', "arguments": '
    return ""


class TemplateView:
    """Renders requests with ``tokenizer``'s chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.

    Raises:
        ValueError: if the tokenizer has no chat template.
    """

    def __init__(self, tokenizer: Any):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the proxy needs a tokenizer with a chat template; this one has none")
        self.tokenizer = tokenizer
        self.renders_tools = renders_tools(tokenizer)
        self.renders_calls = renders_tool_calls(tokenizer)
        self.tool_role = tool_message_role(tokenizer)

    def _assistant(self, message: dict[str, Any], replies: Mapping[str, str]) -> dict[str, Any]:
        calls = message.get("tool_calls") or []
        sampled = replies.get(reply_key(message["content"], calls))
        if sampled is not None:
            return {"role": "assistant", "content": sampled}
        if not calls or self.renders_calls:
            return message
        blocks = [ToolCall(c["function"]["name"], c["function"]["arguments"]).render() for c in calls]
        return {"role": "assistant", "content": "\n".join(part for part in [message["content"], *blocks] if part)}

    def messages(self, request: ChatRequest, replies: Mapping[str, str]) -> list[dict[str, Any]]:
        """The request's messages as the template is given them (see the module's docstring)."""
        out: list[dict[str, Any]] = []
        for message in request.messages:
            if message["role"] == "assistant":
                out.append(self._assistant(message, replies))
            elif message["role"] == "tool" and self.tool_role != "tool":
                out.extend(ChatRenderer.tool_messages([message["content"]], role=self.tool_role))
            else:
                out.append(message)
        tools = self.tools(request)
        if tools and not self.renders_tools:
            written = tools_text(tools)
            if out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{written}"}
            else:
                out.insert(0, {"role": "system", "content": written})
        return out

    @staticmethod
    def tools(request: ChatRequest) -> list[dict[str, Any]] | None:
        """The tools the model is shown: the request's, unless ``tool_choice`` is ``"none"``."""
        return list(request.tools) if request.tools and request.tool_choice != "none" else None

    def text(self, request: ChatRequest, replies: Mapping[str, str]) -> str:
        """The prompt's text: the rendered messages, the generation prompt and the prefill.

        Raises:
            ProxyRequestError: (400) if the template refuses the conversation (e.g. roles out of order).
        """
        tools = self.tools(request)
        extra = {"tools": tools} if tools and self.renders_tools else {}
        try:
            rendered = self.tokenizer.apply_chat_template(self.messages(request, replies), tokenize=False, add_generation_prompt=True, **extra)
        except Exception as exc:  # jinja's raise_exception and template errors: the conversation is at fault
            raise ProxyRequestError(f"the model's chat template refuses these messages: {exc}", param="messages") from None
        return rendered + prefill(request)
