"""The two wire formats: what a model call asks (``Request``) and what it is answered.

One engine for the synchronous routes (``server.py``) and the Batch APIs
(``batches.py``): the same body gets the same answer and usage on either path.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from herd.testing.simulator import content
from herd.testing.simulator.state import SimState


@dataclass
class Request:
    """What both wire formats ask, in one shape."""

    messages: list[Any]
    system: str
    schema: Any
    json_object: bool
    tool: str | None
    prefill: str

    @classmethod
    def of(cls, api: str, body: dict[str, Any]) -> Request:
        messages = list(body.get("messages") or [])
        schema: Any = None
        json_object = False
        tool: str | None = None
        system = ""
        prefill = ""
        if api == "openai":
            system = "\n".join(
                content.text_of(m.get("content"))
                for m in messages
                if isinstance(m, dict) and m.get("role") in ("system", "developer")
            )
            messages = [
                m
                for m in messages
                if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))
            ]
            fmt = body.get("response_format") or {}
            if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
                schema = (fmt.get("json_schema") or {}).get("schema", {})
            json_object = isinstance(fmt, dict) and fmt.get("type") == "json_object"
        else:
            system = content.text_of(body.get("system"))
            out = (body.get("output_config") or {}).get("format") or body.get("output_format")
            if isinstance(out, dict) and out.get("type") == "json_schema":
                schema = out.get("schema", {})
            choice = body.get("tool_choice") or {}
            tools = body.get("tools") or []
            if isinstance(choice, dict) and choice.get("type") == "tool":
                for t in tools:
                    if isinstance(t, dict) and t.get("name") == choice.get("name"):
                        schema, tool = t.get("input_schema", {}), str(t["name"])
            last = messages[-1] if messages else None
            if isinstance(last, dict) and last.get("role") == "assistant":
                prefill = content.text_of(last.get("content"))
                messages = messages[:-1]
        return cls(messages, system, schema, json_object, tool, prefill)

    @property
    def user_text(self) -> str:
        users = [m for m in self.messages if isinstance(m, dict) and m.get("role") == "user"]
        return content.text_of(users[-1].get("content")) if users else ""

    @property
    def prompt_text(self) -> str:
        parts = [self.system] + [
            content.text_of(m.get("content")) for m in self.messages if isinstance(m, dict)
        ]
        return "\n".join(parts)


def compose(state: SimState, req: Request, outcome: str) -> str:
    """The text of a generated outcome, from the content mode in force."""
    with state.lock:
        mode, fixed = state.config.content, state.config.fixed_text
    # The same prompt gets the same answer, whichever wire format and model asked.
    turns = [
        [m.get("role"), content.text_of(m.get("content"))] for m in req.messages if _is_dict(m)
    ]
    rng = random.Random(content.seed_of(turns, req.system, req.schema))
    if mode == "echo":
        text = req.user_text
    elif mode == "fixed":
        text = fixed
    elif req.schema is not None:
        value = content.generate(req.schema, rng)
        if outcome == "schema_invalid":
            value = content.violate(value, req.schema)
        text = json.dumps(value, ensure_ascii=False)
    elif req.json_object:
        value = {"answer": content.sentence(rng)}
        text = json.dumps(value if outcome != "schema_invalid" else ["not", "an", "object"])
    else:
        text = content.sentence(rng, 20)
    if outcome == "malformed":
        text = content.malformed(text if text.startswith(("{", "[")) else json.dumps(text))
    return text


def generate(state: SimState, req: Request, outcome: str) -> tuple[str, tuple[int, int]]:
    """The text a generated outcome answers and its (input, output) tokens: one engine for
    the synchronous routes and the batches (``batches.py``), so both bill alike."""
    text = compose(state, req, outcome)
    return text, (content.estimate_tokens(req.prompt_text), max(1, content.estimate_tokens(text)))


def answer_payload(
    api: str,
    model: str,
    req: Request,
    text: str,
    tokens: tuple[int, int],
    cache: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """The 200 body of a model call in the ``api``'s wire format; ``cache``: the prompt
    cache's tokens (read, written) that its usage reports."""
    if api == "openai":
        return _openai_answer(model, text, tokens, cache)
    return _anthropic_answer(model, req, text, tokens, cache)


def weight(req: Request, body: dict[str, Any]) -> int:
    """Tokens a call is charged at admission: its input plus the most output it allows."""
    most = body.get("max_completion_tokens", body.get("max_tokens"))
    out = int(most) if isinstance(most, int | float) and most > 0 else 0
    return content.estimate_tokens(req.prompt_text) + out


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _openai_answer(
    model: str, text: str, tokens: tuple[int, int], cache: tuple[int, int] = (0, 0)
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-sim-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": tokens[0],
            "completion_tokens": tokens[1],
            "total_tokens": tokens[0] + tokens[1],
            "prompt_tokens_details": {"cached_tokens": cache[0], "audio_tokens": 0},
        },
    }


def _anthropic_answer(
    model: str,
    req: Request,
    text: str,
    tokens: tuple[int, int],
    cache: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    block: dict[str, Any]
    stop = "end_turn"
    if req.tool is not None:
        try:
            block = {
                "type": "tool_use",
                "id": f"toolu_sim_{uuid.uuid4().hex[:20]}",
                "name": req.tool,
                "input": json.loads(text),
            }
            stop = "tool_use"
        except ValueError:  # malformed: the "model" wrote text instead of calling the tool
            block = {"type": "text", "text": text}
    else:
        if req.prefill and text.startswith(req.prefill):
            text = text[len(req.prefill) :]
        block = {"type": "text", "text": text}
    return {
        "id": f"msg_sim_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        # Anthropic counts the cached prefix apart from input_tokens.
        "usage": {
            "input_tokens": max(0, tokens[0] - cache[0] - cache[1]),
            "cache_creation_input_tokens": cache[1],
            "cache_read_input_tokens": cache[0],
            "output_tokens": tokens[1],
        },
    }
