"""Chat templates by name or file, and template variables bound into a template's text.

Shipped templates (`SHIPPED`), all in the ChatML turn format (``<|im_start|>role\\n…<|im_end|>\\n``):

- ``sao``: the byte tokenizer's template (`sao.models.tokenizer.CHAT_TEMPLATE`), prefix-stable.
- ``qwen3``: Qwen3's documented behaviour (``chat_templates/qwen3.jinja``): tools in the system turn, earlier
  turns' ``<think>`` stripped, consecutive tool results merged into one user turn, an empty think block
  after the generation prompt when ``enable_thinking`` is false. Not prefix-stable.
- ``qwen3_coder``: Qwen3-Coder's behaviour (``chat_templates/qwen3_coder.jinja``): tools listed as XML in the
  system turn, an assistant's tool calls in the XML form of the ``qwen3_coder`` tool-call format
  (`sao.envs.tool_formats`), consecutive tool results merged into one user turn, no thinking.
- ``hermes``: Hermes function calling (``chat_templates/hermes.jinja``): a default system prompt injected
  when the conversation has none, each tool result its own ``tool`` turn, no thinking.

The .jinja files are written for sao from the templates' documented behaviour (test fixtures of what real
templates do), not copies. Token-in/token-out (`sao.models.chat_delta`) only needs a template to close an
assistant turn with ``<|im_end|>`` right after its content and to render that content verbatim.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

__all__ = ["SHIPPED", "bind_template_variables", "load_chat_template"]

SHIPPED: frozenset[str] = frozenset({"qwen3", "qwen3_coder", "hermes", "sao"})
# A binding that `bind_template_variables` wrote earlier, so binding again replaces it instead of stacking
# (the later, inner ``set`` would win otherwise).
_BOUND_THINKING = re.compile(r"\A\{%- set enable_thinking = (?:true|false) -%\}\n")


def load_chat_template(spec: str) -> str:
    """The text of chat template ``spec``: a `SHIPPED` name, else the path of a template file (``~``
    expanded). Raises ValueError naming ``spec`` when it is neither a shipped name nor a readable file."""
    if spec == "sao":
        from sao.models.tokenizer import CHAT_TEMPLATE

        return CHAT_TEMPLATE
    if spec in SHIPPED:
        return (resources.files("sao.models") / "chat_templates" / f"{spec}.jinja").read_text("utf-8")
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ValueError(
            f"chat template {spec!r} is neither a shipped template ({', '.join(sorted(SHIPPED))}) "
            "nor an existing file"
        )
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"chat template file {spec!r} cannot be read: {err}") from None
    if not text.strip():
        raise ValueError(f"chat template file {spec!r} is empty")
    return text


def bind_template_variables(template: str, *, enable_thinking: bool) -> str:
    """``template`` with ``{%- set enable_thinking = true|false -%}`` prepended (replacing an earlier binding
    of this function), so every rendering sees that value, even one whose caller passes its own
    ``enable_thinking``: a template's top-level ``set`` shadows the render variables. Renders the same text
    otherwise (the tag trims the whitespace after it)."""
    unbound = _BOUND_THINKING.sub("", template, count=1)
    value = "true" if enable_thinking else "false"
    return f"{{%- set enable_thinking = {value} -%}}\n{unbound}"
