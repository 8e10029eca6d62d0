"""A streamed chat choice's deltas where the request offered tools: its text read as it comes
(serving/model/tool_parse.py) into content and tool-call deltas, as OpenAI streams them: a
call opens with its index, id, type and name (arguments ""), then its arguments in pieces."""

from __future__ import annotations

from serving.api.core.tools import ToolPlan
from serving.model.tool_parse import CallOpened, CallReader, Content


class ToolDeltas:
    """One choice's reader: deltas(new text) -> the deltas it completes; end() the rest."""

    def __init__(self, plan: ToolPlan) -> None:
        self._reader, self._plan = CallReader(plan.format), plan

    @property
    def calls(self) -> int:
        """Calls the choice has completed."""
        return self._reader.calls

    def deltas(self, text: str) -> list[dict]:
        return _merged([self._delta(e) for e in self._reader.feed(text)])

    def end(self) -> list[dict]:
        return _merged([self._delta(e) for e in self._reader.finish()])

    def _delta(self, event) -> dict:
        if isinstance(event, Content):
            return {"content": event.text}
        if isinstance(event, CallOpened):
            return {"tool_calls": [{"index": event.index, "id": self._plan.call_id(),
                                    "type": "function",
                                    "function": {"name": event.name, "arguments": ""}}]}  # fmt: skip
        return {"tool_calls": [{"index": event.index,
                                "function": {"arguments": event.fragment}}]}  # fmt: skip


def _merged(deltas: list[dict]) -> list[dict]:
    """deltas with neighbouring content joined, and a call's neighbouring argument pieces."""
    out: list[dict] = []
    for d in deltas:
        last = out[-1] if out else None
        if last and "content" in d and "content" in last:
            last["content"] += d["content"]
        elif (last and "tool_calls" in d and "tool_calls" in last
              and "id" not in d["tool_calls"][0]
              and last["tool_calls"][0]["index"] == d["tool_calls"][0]["index"]):  # fmt: skip
            last["tool_calls"][0]["function"]["arguments"] += d["tool_calls"][0]["function"][
                "arguments"
            ]
        else:
            out.append(d)
    return out
