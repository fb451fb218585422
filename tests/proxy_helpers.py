"""What the proxy tests share: generators to put behind a ChatProxy (one that always says "ok",
one that answers each call with the next of a script), and the check of an OpenAI error body."""

from __future__ import annotations

from envhub.chat import end_of_turn_ids
from envhub.generation import Completion


class Echo:
    """Replies "ok" and ends its turn (for requests about refusals and records, not sampling)."""

    def __init__(self, tokenizer):
        self.ids = tokenizer.encode("ok", add_special_tokens=False) + end_of_turn_ids(tokenizer)[:1]

    def generate(self, prompts, sampling):
        return [Completion(list(self.ids), [-0.1] * len(self.ids), "ok") for _ in prompts]


class Scripted:
    """Answers each call with the next of ``replies``, ending its turn."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.turn_end, self.replies = tokenizer, end_of_turn_ids(tokenizer)[:1], list(replies)

    def generate(self, prompts, sampling):
        out = []
        for _ in prompts:
            text = self.replies.pop(0)
            ids = self.tokenizer.encode(text, add_special_tokens=False) + self.turn_end
            out.append(Completion(ids, [-0.5] * len(ids), text))
        return out


def expert_moves(tokenizer, moves) -> Scripted:
    """Plays a lake as its expert would: a reply of plain text first (after the call's start, which
    the proxy writes for the agent's named ``tool_choice``, it is no call, and the agent must ask
    again), then one ``move`` call's arguments per expert step."""
    return Scripted(tokenizer, ["Let me look at the board."] + ['{"direction": "%s"}}\n</tool_call>' % m.lower() for m in moves])


def openai_error(response, status, code=None):
    """``response``'s OpenAI error (``{"error": {"message", "type", "param", "code"}}``), checked to
    come with ``status`` (and ``code``, when given)."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error
