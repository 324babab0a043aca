"""Token-in/token-out recording of chat sessions for the gateway.

A session is one agent episode served through the OpenAI-compatible API. Its token ids are never
re-rendered: the first request's prompt is rendered with the chat template; every later request must
*extend* what was recorded (the previous prompt, the assistant tokens exactly as generated), and only the
chat-template delta of the new messages is tokenised and appended as observation tokens. A request whose
rendering does not start with the recorded text (the client edited history, or the template rewrites it)
starts a new *branch*, recorded separately and flagged in its metadata. A ``strict`` session (the agent
loop's) raises `PrefixMismatchError` instead: there the template is under our control, and a rewrite is a
configuration error. `ChatSession.plan` computes a request's prompt without recording it and
`ChatSession.commit` records it: the gateway commits only once generation succeeded, so a failed request
leaves its session as it was.

Echoed replies. An OpenAI client sends the assistant's replies back as it got them — text with the tool
calls split off into structured ``tool_calls`` — and a chat template renders those differently from what
was generated (other whitespace, other JSON spacing). `ChatSession.note_reply` remembers each reply as
returned; `plan` replaces an assistant message that equals the next remembered reply of the branch (same
content, same tool names and arguments) by the text actually generated, so the rendering extends the
recorded tokens and no branch is opened. An assistant message the client changed is rendered as sent.

Owns: session state and turning it into `Trajectory` objects. Does not own: HTTP, generation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sao.types import Trajectory

__all__ = ["Branch", "ChatSession", "PrefixMismatchError", "PromptPlan", "reply_signature"]


def reply_signature(message: Mapping[str, Any]) -> str | None:
    """A key equal for two assistant messages with the same content and the same tool calls (name and
    parsed arguments; call ids and JSON spacing ignored); None if a call's arguments are not JSON."""
    calls = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            return None
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        calls.append([fn.get("name"), args])
    return json.dumps([message.get("content") or "", calls], sort_keys=True)


class PrefixMismatchError(ValueError):
    """A strict session's rendering does not start with the recorded text.

    ``offset`` is the first character where ``rendered`` differs from ``recorded`` (the branch's text).
    """

    def __init__(self, message: str, *, offset: int, recorded: str, rendered: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.recorded = recorded
        self.rendered = rendered


def _first_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (``min(len)`` when one is a prefix)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass
class Branch:
    """One token sequence of a session: prompt, then alternating generated and observation tokens."""

    text: str = ""  # the text the recorded tokens stand for (rendered prompt + generated text + deltas)
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    turns: int = 0
    finish_reason: str = "stop"
    prefix_mismatch: bool = False
    replies: list[tuple[str | None, str]] = field(default_factory=list)  # (reply_signature, generated text)

    def append(self, ids: Sequence[int], text: str, action: bool, logprobs=None, versions=None) -> None:
        n = len(ids)
        turn = self.turns - 1
        self.token_ids.extend(ids)
        self.action_mask.extend([int(action)] * n)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * n)
        self.versions.extend(versions if versions is not None else [-1] * n)
        self.turn_ids.extend([turn] * n)
        self.text += text


@dataclass(frozen=True)
class PromptPlan:
    """A request's prompt, planned by `ChatSession.plan` and recorded by `ChatSession.commit`.

    ``branch``: the index of the branch it extends (``== len(branches)``: it opens a new one, flagged
    ``prefix_mismatch`` when the session already had a branch); ``base_tokens``: that branch's length when
    planned; ``delta``/``delta_ids``: the observation text and tokens appended; ``prompt_ids``: the
    branch's tokens followed by the delta, what to generate from.
    """

    branch: int
    base_tokens: int
    prefix_mismatch: bool
    delta: str
    delta_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...]


class ChatSession:
    """The recorded branches of one session, extended request by request.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        session_id: the client's session key.
        strict: raise `PrefixMismatchError` where the rendering does not extend the recorded text, instead
            of opening a new branch (a strict session has at most one branch).
    """

    def __init__(self, tokenizer: Any, session_id: str, *, strict: bool = False) -> None:
        self.tokenizer = tokenizer
        self.session_id = session_id
        self.strict = strict
        self.branches: list[Branch] = []
        self.group_id: str | None = None  # set by the gateway from the first request that names one
        self.task_id: str | None = None
        self.messages: list[dict[str, Any]] = []  # the latest conversation, ending with the reply returned

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def prompt_for(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[int]:
        """Token ids to generate from for this request; records the observation delta.

        Extends the current branch when the rendered conversation starts with its recorded text, else
        opens a new branch (flagged ``prefix_mismatch`` when the session already had one).
        """
        plan = self.plan(messages, tools)
        self.commit(plan)
        return list(plan.prompt_ids)

    def plan(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> PromptPlan:
        """What `prompt_for` would record and return, without recording anything (raises as it does).

        `commit` records it; a plan that is never committed (the request failed) leaves the session
        exactly as it was. Commit a plan before the session changes otherwise.
        """
        current = self.branches[-1] if self.branches else None
        if current is not None and current.replies:
            messages = _with_generated_replies(messages, current.replies)
        rendered = self.render(messages, tools)
        if current is not None and self.strict:
            self.check_extends(rendered)
        new_branch = current is None or not rendered.startswith(current.text)
        base_text = "" if new_branch or current is None else current.text
        base_ids = [] if new_branch or current is None else current.token_ids
        delta = rendered[len(base_text) :]
        delta_ids = self._encode(delta)
        return PromptPlan(
            branch=len(self.branches) if new_branch else len(self.branches) - 1,
            base_tokens=len(base_ids),
            prefix_mismatch=new_branch and bool(self.branches),
            delta=delta,
            delta_ids=tuple(delta_ids),
            prompt_ids=(*base_ids, *delta_ids),
        )

    def commit(self, plan: PromptPlan) -> None:
        """Record ``plan``'s observation delta (opening its new branch if it has one). Raises
        `RuntimeError` if the session changed since the plan was made."""
        if plan.branch == len(self.branches):
            self.branches.append(Branch(prefix_mismatch=plan.prefix_mismatch))
        elif plan.branch != len(self.branches) - 1 or len(self.branches[-1].token_ids) != plan.base_tokens:
            raise RuntimeError(f"session {self.session_id!r} changed since this prompt was planned")
        self.branches[-1].append(list(plan.delta_ids), plan.delta, action=False)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template's rendering of ``messages`` as text (nothing is recorded)."""
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    @property
    def text(self) -> str:
        """The text the current branch's tokens stand for ("" before the first request)."""
        return self.branches[-1].text if self.branches else ""

    def check_extends(self, rendered: str) -> None:
        """Raise `PrefixMismatchError` unless ``rendered`` starts with the current branch's text."""
        recorded = self.text
        if rendered.startswith(recorded):
            return
        at = _first_difference(recorded, rendered)
        raise PrefixMismatchError(
            f"the rendering differs from the recorded text at character {at}: "
            f"recorded ...{recorded[max(0, at - 40) : at + 40]!r}, "
            f"rendered ...{rendered[max(0, at - 40) : at + 40]!r}",
            offset=at,
            recorded=recorded,
            rendered=rendered,
        )

    def append_observation(self, text: str) -> list[int]:
        """Tokenise ``text`` and append it to the current branch as observation tokens (no rendering, no
        check: for callers that computed the template delta themselves); returns the branch's token ids."""
        if not self.branches:
            self.branches.append(Branch())
        self.branches[-1].append(self._encode(text), text, action=False)
        return list(self.branches[-1].token_ids)

    def record_generation(
        self, token_ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int], finish_reason: str
    ) -> str:
        """Append the generated tokens (action tokens, a new turn) and return their decoded text."""
        branch = self.branches[-1]
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=False)
        branch.turns += 1
        branch.append(token_ids, text, action=True, logprobs=list(logprobs), versions=list(versions))
        branch.finish_reason = finish_reason
        return text

    def note_reply(self, message: Mapping[str, Any], generated: str) -> None:
        """Remember the reply of the latest turn as the client got it (``message``: role, content, maybe
        ``tool_calls``) and the text that was generated for it (`record_generation`'s), so an echo of
        ``message`` is rendered as ``generated`` without its end-of-turn token, which the template adds
        (see the module docstring)."""
        content = generated.removesuffix(self.tokenizer.eos_token or "")
        self.branches[-1].replies.append((reply_signature(message), content))

    @property
    def num_tokens(self) -> int:
        """Tokens of the current branch (0 before the first request)."""
        return len(self.branches[-1].token_ids) if self.branches else 0

    @property
    def num_turns(self) -> int:
        """Generated turns of the current branch."""
        return self.branches[-1].turns if self.branches else 0

    def trajectories(
        self,
        rewards: Sequence[float],
        metadata: Mapping[str, Any] | None = None,
        *,
        finish_reason: str | None = None,
    ) -> list[Trajectory]:
        """One `Trajectory` per branch that has generated tokens, each with ``rewards`` attached (and
        ``finish_reason`` instead of the last generation's, when given)."""
        out = []
        for index, branch in enumerate(self.branches):
            if not any(branch.action_mask):
                continue
            meta = {
                "env": "gateway",
                "session_id": self.session_id,
                "task_id": self.task_id,
                "branch": index,
                "prefix_mismatch": branch.prefix_mismatch,
                **(metadata or {}),
            }
            out.append(
                Trajectory(
                    prompt_id=self.task_id or self.session_id,
                    token_ids=list(branch.token_ids),
                    action_mask=list(branch.action_mask),
                    rollout_logprobs=list(branch.logprobs),
                    versions=list(branch.versions),
                    turn_ids=list(branch.turn_ids),
                    rewards=list(rewards),
                    finish_reason=finish_reason or branch.finish_reason,
                    metadata=meta,
                    group_id=self.group_id,
                )
            )
        return out


def _with_generated_replies(
    messages: Sequence[Mapping[str, Any]], replies: Sequence[tuple[str | None, str]]
) -> list[Mapping[str, Any]]:
    """``messages`` with each assistant message that equals the next remembered reply (in order) replaced
    by the text generated for it; others (few-shot examples, edited replies) are left as sent."""
    out: list[Mapping[str, Any]] = []
    j = 0
    for message in messages:
        if j < len(replies) and message.get("role") == "assistant":
            signature, generated = replies[j]
            if signature is not None and reply_signature(message) == signature:
                message = {"role": "assistant", "content": generated}
                j += 1
        out.append(message)
    return out
