"""Token-in/token-out recording of chat sessions for the gateway.

A session is one agent episode served through the OpenAI- or Anthropic-compatible API. Its recorded
history is never re-rendered: the first request's prompt is the chat template's full rendering; a later
request whose messages *start with* the branch's recorded messages (the previous request's messages, then
the reply as returned) extends the branch: only its new trailing messages are rendered, as a suffix after
the tokens the engine generated (`sao.models.chat_delta.observation_delta`), and appended as observation
tokens. A template that rewrites earlier text (Qwen3's drops earlier ``<think>`` blocks) therefore never
changes what was recorded. A request that does not extend the branch (the client edited history, changed
the tools, or resent an older conversation) opens a new *branch*, rendered in full and flagged
``prefix_mismatch``. `ChatSession.plan` computes a request's prompt without recording it and
`ChatSession.commit` records it: the gateway commits only once generation succeeded, so a failed request
leaves its session as it was.

Echoed replies. A client sends the assistant's replies back as it got them (text with the tool calls
split off into structured ``tool_calls``, other call ids, other JSON spacing). `ChatSession.note_reply`
remembers each reply as returned; a request's assistant message at that position matches it when it has
the same content and the same tool calls (`reply_signature`). Other messages match when they are equal.
Without `note_reply` a reply matches an assistant message whose content is the generated text.

Cost. A client sends the whole history with every request; what a request that adds k messages costs here
is O(k) rendering and tokenizing (the suffix only) and one ``==`` per earlier message: each recorded
message keeps a copy of the last form a request sent it in, compared first (C-speed dict equality, no
serialization); a reply's `reply_signature` is computed only for an echo not seen before (once per reply).
Nothing recorded is re-rendered, re-tokenized or re-serialized.

Owns: session state and turning it into `Trajectory` objects. Does not own: HTTP, generation.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sao.models.chat_delta import end_of_turn_token, observation_delta, render
from sao.types import Trajectory

__all__ = ["Branch", "ChatSession", "PromptPlan", "RecordedMessage", "reply_signature"]


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


def _tools_value(tools: Sequence[Any] | None) -> list[Any] | None:
    """The tools as the branch compares them (no tools and an empty list are the same)."""
    return list(tools) if tools else None


@dataclass
class RecordedMessage:
    """One message of a branch's conversation, and what a request's message at its position must be to
    continue the branch.

    ``sent``: a request sent it, and ``message`` is a copy of it (a request continues with an equal
    message, ``==`` on the parsed JSON). Else the gateway generated it: ``signature`` is its
    `reply_signature` as the client got it (None: no echo can match) and ``message`` a copy of the reply as
    the client got it, or of the last echo of it a request sent in another form: compared first, so an
    echo seen before costs one ``==`` and only a new form of it is parsed.
    """

    sent: bool
    message: dict[str, Any]
    signature: str | None = None

    def matches(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` continues the branch at this position; remembers a new echo of a reply."""
        if not self.sent and self.signature is None:
            return False
        if message == self.message:
            return True
        if self.sent or message.get("role") != "assistant":
            return False
        if reply_signature(message) != self.signature:
            return False
        # The same reply as the client got it, sent in another form (other call ids or JSON spacing):
        # remember the form, which matches exactly the same messages, so the next echo costs one ``==``.
        self.message = copy.deepcopy(dict(message))
        return True


def _reply(message: Mapping[str, Any]) -> RecordedMessage:
    """A generated reply as the client got it (``message``, copied: its exact echo is compared first)."""
    return RecordedMessage(False, copy.deepcopy(dict(message)), reply_signature(message))


def _generated_reply(content: str) -> RecordedMessage:
    """A generated reply as its text (until `ChatSession.note_reply` says how the client got it)."""
    message = {"role": "assistant", "content": content}
    return RecordedMessage(False, message, reply_signature(message))


@dataclass
class Branch:
    """One token sequence of a session: prompt, then alternating generated and observation tokens, and
    the conversation it records (``messages``, one `RecordedMessage` each; ``tools``: a copy of the
    request's tools)."""

    token_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    turns: int = 0
    finish_reason: str = "stop"
    prefix_mismatch: bool = False
    messages: list[RecordedMessage] = field(default_factory=list)
    tools: list[Any] | None = None
    turn_ended: bool = True  # the last generated turn ended with the end-of-turn token
    # the text the recorded tokens stand for, in pieces (rendered prompt, generated text, deltas): joined
    # only when read, so appending costs O(piece), not O(history)
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The text the recorded tokens stand for (rendered prompt + generated text + deltas)."""
        return "".join(self.pieces)

    def append(self, ids: Sequence[int], text: str, action: bool, logprobs=None, versions=None) -> None:
        n = len(ids)
        turn = self.turns - 1
        self.token_ids.extend(ids)
        self.action_mask.extend([int(action)] * n)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * n)
        self.versions.extend(versions if versions is not None else [-1] * n)
        self.turn_ids.extend([turn] * n)
        self.pieces.append(text)

    def extended_by(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None) -> bool:
        """Whether a request of ``messages`` with ``tools`` continues this branch: same tools, and its
        messages start with the recorded ones (a branch that generated nothing is never continued). One
        ``==`` per recorded message (`RecordedMessage.matches`)."""
        n = len(self.messages)
        return (
            self.turns > 0
            and _tools_value(tools) == self.tools
            and len(messages) >= n
            and all(r.matches(m) for r, m in zip(self.messages, messages, strict=False))
        )


@dataclass(frozen=True)
class PromptPlan:
    """A request's prompt, planned by `ChatSession.plan` and recorded by `ChatSession.commit`.

    ``branch``: the index of the branch it extends (``== len(branches)``: it opens a new one, flagged
    ``prefix_mismatch`` when the session already had a branch); ``base_tokens``: that branch's length when
    planned; ``delta``/``delta_ids``: the observation text and tokens appended (the full rendering for a
    new branch); ``prompt_ids``: the branch's tokens followed by the delta, what to generate from;
    ``new_messages``: the messages the branch records once committed, after those it has (all of them
    for a new branch); ``tools``: the branch's tools.
    """

    branch: int
    base_tokens: int
    prefix_mismatch: bool
    delta: str
    delta_ids: tuple[int, ...]
    prompt_ids: tuple[int, ...]
    new_messages: tuple[RecordedMessage, ...] = ()
    tools: list[Any] | None = None


class ChatSession:
    """The recorded branches of one session, extended request by request.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        session_id: the client's session key.
        end_of_turn: the token that ends an assistant turn (default ``<|im_end|>``, else the eos token).
    """

    def __init__(
        self,
        tokenizer: Any,
        session_id: str,
        *,
        end_of_turn: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.session_id = session_id
        self.end_of_turn, self.end_of_turn_id = end_of_turn_token(tokenizer, end_of_turn)
        self.branches: list[Branch] = []
        self.group_id: str | None = None  # set by the gateway from the first request that names one
        self.task_id: str | None = None
        self.messages: list[dict[str, Any]] = []  # the latest conversation, ending with the reply returned
        # What the HTTP layer remembers of this session's last request, by API ("openai", "anthropic"),
        # so converting the next one costs O(new messages); dropped with the session.
        self.request_memos: dict[str, Any] = {}

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def prompt_for(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[int]:
        """Token ids to generate from for this request; records the observation delta (`plan`, then
        `commit`)."""
        plan = self.plan(messages, tools)
        self.commit(plan)
        return list(plan.prompt_ids)

    def plan(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> PromptPlan:
        """What `prompt_for` would record and return, without recording anything.

        Extends the current branch with the suffix rendering of the new trailing messages when the
        request continues it (`Branch.extended_by`), else plans a new branch with the full rendering.
        Extending costs O(new messages) in rendering, tokenizing and copying, and one ``==`` per earlier
        message. Raises whatever the template raises (`sao.models.chat_delta.ChatTemplateError` for a
        suffix). `commit` records the plan; a plan never committed leaves the session as it was (it may
        remember the form in which a request echoed a reply, which changes no outcome).
        """
        current = self.branches[-1] if self.branches else None
        if current is not None and current.extended_by(messages, tools):
            new = messages[len(current.messages) :]
            delta = observation_delta(self.tokenizer, new, tools, self.end_of_turn, current.turn_ended)
            branch, base_ids, tools_kept = len(self.branches) - 1, current.token_ids, current.tools
        else:
            new = messages
            delta = render(
                self.tokenizer, messages, tools, add_generation_prompt=True,
            )  # fmt: skip
            branch, base_ids, tools_kept = len(self.branches), [], copy.deepcopy(_tools_value(tools))
        delta_ids = self._encode(delta)
        return PromptPlan(
            branch=branch,
            base_tokens=len(base_ids),
            prefix_mismatch=branch == len(self.branches) and bool(self.branches),
            delta=delta,
            delta_ids=tuple(delta_ids),
            prompt_ids=(*base_ids, *delta_ids),
            new_messages=tuple(RecordedMessage(True, copy.deepcopy(dict(m))) for m in new),
            tools=tools_kept,
        )

    def commit(self, plan: PromptPlan) -> None:
        """Record ``plan``'s observation delta and messages (opening its new branch if it has one). Raises
        `RuntimeError` if the session changed since the plan was made."""
        if plan.branch == len(self.branches):
            self.branches.append(Branch(prefix_mismatch=plan.prefix_mismatch, tools=plan.tools))
        elif plan.branch != len(self.branches) - 1 or len(self.branches[-1].token_ids) != plan.base_tokens:
            raise RuntimeError(f"session {self.session_id!r} changed since this prompt was planned")
        branch = self.branches[-1]
        branch.append(list(plan.delta_ids), plan.delta, action=False)
        branch.messages.extend(plan.new_messages)

    @property
    def text(self) -> str:
        """The text the current branch's tokens stand for ("" before the first request)."""
        return self.branches[-1].text if self.branches else ""

    def append_observation(self, text: str) -> list[int]:
        """Tokenise ``text`` and append it to the current branch as observation tokens (no rendering: for
        callers that compute the template's text themselves, as the agent loop does); returns the
        branch's token ids."""
        if not self.branches:
            self.branches.append(Branch())
        self.branches[-1].append(self._encode(text), text, action=False)
        return list(self.branches[-1].token_ids)

    def record_generation(
        self, token_ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int], finish_reason: str
    ) -> str:
        """Append the generated tokens (action tokens, a new turn) and return their decoded text. Until
        `note_reply` says how the client got it, the reply is recorded as its text (end-of-turn token
        removed) as an assistant message's content."""
        branch = self.branches[-1]
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=False)
        branch.turns += 1
        branch.append(token_ids, text, action=True, logprobs=list(logprobs), versions=list(versions))
        branch.finish_reason = finish_reason
        branch.turn_ended = bool(token_ids) and token_ids[-1] == self.end_of_turn_id
        content = text.removesuffix(self.end_of_turn) if branch.turn_ended else text
        branch.messages.append(_generated_reply(content))
        return text

    def note_reply(self, message: Mapping[str, Any]) -> None:
        """Remember the latest turn's reply as the client got it (``message``: role, content, maybe
        ``tool_calls``): an assistant message equal to it (`reply_signature`) continues the branch."""
        branch = self.branches[-1]
        if not branch.messages or branch.messages[-1].sent:
            raise RuntimeError(f"session {self.session_id!r}: no generated turn to note a reply for")
        branch.messages[-1] = _reply(message)

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
