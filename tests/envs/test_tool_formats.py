"""Tool-call formats by name (`sao.envs.tool_formats`): the registry, the Hermes and Qwen3-Coder formats
(render → parse round trips, parse never raises, malformed blocks reported and skipped, values typed by a
schema as vLLM's qwen3_coder parser does), the shipped ``qwen3_coder`` chat template writing exactly what
the format renders, and envs reading calls in the format they are given."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError

from sao.envs import tool_formats
from sao.envs.base import Task
from sao.envs.calculator import CalculatorEnv
from sao.envs.tool_formats import (
    TOOL_FORMATS,
    HermesFormat,
    ToolFormat,
    get_tool_format,
    register_tool_format,
)
from sao.envs.tools import ToolCall, ToolCallParse, parse_tool_calls

from .scripted import play_scripted

HERMES, CODER = get_tool_format("hermes"), get_tool_format("qwen3_coder")
EOT = "<|im_end|>"
# Pieces that stress the formats: their own tags, JSON syntax, newlines, quotes, non-ASCII.
TAGS = ["<tool_call>", "</tool_call>", "<function=f>", "</function>", "<parameter=a>", "</parameter>"]
TRICKY = [*TAGS, *"\n{}[<>\"'\\ ", "\n\n", "null", "é", "日本", "\U0001f600"]  # one-char pieces, then longer
CODER_CANNOT = ("</parameter>", "</tool_call>")  # closing tags a qwen3_coder value cannot hold


def _text(extra: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.text(max_size=8), st.sampled_from(extra)), max_size=8).map("".join)


def _coder_value(value: str) -> bool:
    return not any(tag in value for tag in CODER_CANNOT) and value.lower() != "null"


NAMES = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
XML_NAMES = st.from_regex(r"[A-Za-z_\-.:/=éλ0-9]{1,12}", fullmatch=True)


def _calls(
    names: st.SearchStrategy[str], values: st.SearchStrategy[Any]
) -> st.SearchStrategy[list[ToolCall]]:
    call = st.builds(ToolCall, names, st.dictionaries(names, values, max_size=4))
    return st.lists(call, max_size=3)


# ---- the registry


def test_formats_are_found_by_name_and_an_unknown_name_lists_the_known_ones() -> None:
    assert HERMES.name == "hermes" and CODER.name == "qwen3_coder"
    assert isinstance(HERMES, ToolFormat) and isinstance(CODER, ToolFormat)
    with pytest.raises(ValueError, match=r"'qwen9'.*hermes, qwen3_coder"):
        get_tool_format("qwen9")


def test_a_registered_format_is_found_and_a_taken_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool_formats, "TOOL_FORMATS", dict(TOOL_FORMATS))

    class Shout(HermesFormat):
        name = "shout"

    mine = register_tool_format(Shout())
    assert get_tool_format("shout") is mine
    with pytest.raises(ValueError, match="'shout' is already registered"):
        register_tool_format(Shout())
    assert get_tool_format("shout") is mine
    again = register_tool_format(Shout(), replace=True)
    assert get_tool_format("shout") is again
    with pytest.raises(ValueError, match="non-empty name"):
        register_tool_format(object())  # type: ignore[arg-type]


# ---- round trips and robustness


@settings(max_examples=300, deadline=None)
@given(_calls(NAMES, _text(TRICKY)))
def test_hermes_reads_back_any_calls_it_renders(calls: list[ToolCall]) -> None:
    text = HERMES.render(calls)
    parsed = HERMES.parse(text)
    assert parsed.calls == calls and not parsed.errors and not parsed.unclosed
    assert "\n".join(text[a:b] for a, b in parsed.spans) == text  # each call's span is its whole block


@settings(max_examples=300, deadline=None)
@given(_calls(XML_NAMES, _text(TRICKY).filter(_coder_value)))
def test_qwen3_coder_reads_back_any_string_valued_calls_it_renders(calls: list[ToolCall]) -> None:
    text = CODER.render(calls)
    parsed = CODER.parse(text)
    assert parsed.calls == calls and not parsed.errors and not parsed.unclosed
    assert "\n".join(text[a:b] for a, b in parsed.spans) == text  # each call's span is its whole block


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
TYPED = {
    "n": (st.integers(), "integer"),
    "x": (st.floats(allow_nan=False, allow_infinity=False), "number"),
    "b": (st.booleans(), "boolean"),
    "o": (st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3), "object"),
    "l": (st.lists(JSON_VALUES, max_size=3), "array"),
    "s": (_text(TRICKY).filter(_coder_value), "string"),
    "z": (st.none(), ["string", "null"]),
}
SCHEMA = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {key: {"type": kind} for key, (_, kind) in TYPED.items()}}}}]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional={key: values for key, (values, _) in TYPED.items()}))
def test_qwen3_coder_reads_typed_values_back_through_the_tools_schema(arguments: dict[str, Any]) -> None:
    [call] = CODER.parse(CODER.render([ToolCall("f", arguments)]), tools=SCHEMA).calls
    assert call == ToolCall("f", arguments)
    assert all(type(call.arguments[k]) is type(v) for k, v in arguments.items())


def _fragments(fmt_tags: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.text(max_size=6), st.sampled_from(fmt_tags)), max_size=24).map("".join)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fragments([*TRICKY, '{"name": "f", "arguments": ', '"x"', "1", ":", ",", "{}"]))
def test_parse_never_raises_and_every_span_is_a_block_that_reads_back_alone(text: str) -> None:
    for fmt in (HERMES, CODER):
        for tools in (None, SCHEMA):
            parsed = fmt.parse(text, tools)
            assert isinstance(parsed, ToolCallParse) and len(parsed.calls) == len(parsed.spans)
            assert parsed.unclosed == ("a <tool_call> block is not closed with </tool_call>" in parsed.errors)
            for call, (start, end) in zip(parsed.calls, parsed.spans, strict=True):
                block = text[start:end]
                assert block.startswith("<tool_call>") and block.endswith("</tool_call>")
                assert fmt.parse(block, tools).calls == [call]


def test_parse_survives_absurdly_deep_nesting() -> None:
    deep = "[" * 50_000
    assert HERMES.parse(f"<tool_call>{deep}</tool_call>").errors
    text = f"<tool_call>\n<function=f>\n<parameter=o>\n{deep}\n</parameter>\n</function>\n</tool_call>"
    assert CODER.parse(text, tools=SCHEMA).calls == [ToolCall("f", {"o": deep})]


def test_hermes_format_is_the_envs_parser() -> None:
    text = '<tool_call>{"name": "a"}</tool_call> <tool_call>{bad</tool_call> <tool_call>{"name": "b"'
    assert HERMES.parse(text) == parse_tool_calls(text)
    assert HERMES.render([ToolCall("calc", {"expr": "1+1"})]) == (
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+1"}}\n</tool_call>'
    )


# ---- malformed input


GOOD = "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
MALFORMED = {
    "no function tag": ("<tool_call>\n<parameter=cmd>\nls\n</parameter>\n</tool_call>", "<function=NAME>"),
    "function not closed": (
        "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</tool_call>",
        "not closed with </function>",
    ),
    "duplicate parameter": (
        "<tool_call>\n<function=run>\n<parameter=a>\n1\n</parameter>\n<parameter=a>\n2\n</parameter>\n"
        "</function>\n</tool_call>",
        "'a' of 'run' is given twice",
    ),
    "parameter not closed": (
        "<tool_call>\n<function=run>\n<parameter=a>\n1\n</function>\n</tool_call>",
        "'a' of 'run' is not closed",
    ),
    "text between parameters": ("<tool_call>\n<function=run>\nhello\n</function>\n</tool_call>", "'hello"),
    "name with a space": ("<tool_call>\n<function=run it>\n</function>\n</tool_call>", "needs a name"),
    "empty parameter name": (
        "<tool_call>\n<function=run>\n<parameter=>\n1\n</parameter>\n</function>\n</tool_call>",
        "<parameter=NAME> of 'run'",
    ),
    "two functions in one block": (
        "<tool_call>\n<function=a>\n</function>\n<function=b>\n</function>\n</tool_call>",
        "not a <parameter=...> block",
    ),
    "hermes JSON body": ('<tool_call>{"name": "run", "arguments": {}}</tool_call>', "<function=NAME>"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_qwen3_coder_block_makes_no_call_and_is_reported(case: str) -> None:
    bad, why = MALFORMED[case]
    text = f"thinking {bad} then {GOOD}"
    parsed = CODER.parse(text)
    assert parsed.calls == [ToolCall("run", {"cmd": "ls"})] and not parsed.unclosed
    assert len(parsed.errors) == 1 and why in parsed.errors[0], parsed.errors
    assert [text[a:b] for a, b in parsed.spans] == [GOOD]


def test_an_unclosed_block_is_flagged_and_makes_no_call() -> None:
    for fmt, good in ((CODER, GOOD), (HERMES, HERMES.render([ToolCall("run", {"cmd": "ls"})]))):
        parsed = fmt.parse(good + "\n" + good.removesuffix("</tool_call>"))
        assert parsed.unclosed and parsed.calls == [ToolCall("run", {"cmd": "ls"})]
        assert parsed.errors == ["a <tool_call> block is not closed with </tool_call>"]


def test_a_non_json_hermes_body_makes_no_call_and_is_reported() -> None:
    parsed = HERMES.parse("<tool_call>\n<function=run>\n</function>\n</tool_call>")
    assert not parsed.calls and not parsed.spans and "not valid JSON" in parsed.errors[0]


@pytest.mark.parametrize(
    ("fmt", "call", "why"),
    [
        (CODER, ToolCall("run it", {}), "function name 'run it'"),
        (CODER, ToolCall("f<g", {}), "function name"),
        (CODER, ToolCall("f", {"a b": "1"}), "parameter name 'a b'"),
        (CODER, ToolCall("f", {"a": "x</parameter>"}), "holds a closing tag"),
        (CODER, ToolCall("f", {"a": "</tool_call>"}), "holds a closing tag"),
        (CODER, ToolCall("f", {"a": {1, 2}}), "'a' of 'f' is not JSON"),
        (HERMES, ToolCall("f", {"a": {1, 2}}), "arguments are not JSON"),
        (HERMES, ToolCall("f", {"a": math.nan}), "arguments are not JSON"),
    ],
)
def test_render_refuses_calls_the_format_cannot_write(fmt: ToolFormat, call: ToolCall, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        fmt.render([call])


# ---- values (vLLM/SGLang qwen3_coder rules)


def _value(raw: str, schema: dict[str, Any] | None = None) -> Any:
    tools = None if schema is None else [{"name": "f", "parameters": {"properties": {"v": schema}}}]
    text = f"<tool_call>\n<function=f>\n<parameter=v>\n{raw}\n</parameter>\n</function>\n</tool_call>"
    [call] = CODER.parse(text, tools).calls
    return call.arguments["v"]


def test_without_a_schema_values_stay_strings_except_null() -> None:
    for raw in ("5", "true", "[1, 2]", '{"a": 1}', "1.5", "hello"):
        assert _value(raw) == raw
    assert _value("null") is None and _value("NULL") is None
    assert _value("5", {"type": "integer"}) == 5  # the same text, typed by the schema
    assert _value("5", None) == "5" and _value("5", {"description": "no type"}) == "5"


@pytest.mark.parametrize(
    ("raw", "schema", "value"),
    [
        ("42", {"type": "integer"}, 42),
        ("4x", {"type": "integer"}, "4x"),
        ("3", {"type": "number"}, 3),
        ("2.5", {"type": "number"}, 2.5),
        ("inf", {"type": "number"}, "inf"),
        ("TRUE", {"type": "boolean"}, True),
        ("false", {"type": "bool"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ('{"a": [1, 2]}', {"type": "object"}, {"a": [1, 2]}),
        ("{'a': True}", {"type": "object"}, {"a": True}),
        ("[1, 'x']", {"type": "array"}, [1, "x"]),
        ("{1, 2}", {"type": "array"}, "{1, 2}"),
        ("7", {"type": "object"}, "7"),
        ("7", {"type": ["integer", "null"]}, 7),
        ("null", {"type": "string"}, None),
        ("  spaced \n", {"type": "string"}, "  spaced \n"),
        ("[1]", {"type": "custom"}, [1]),
    ],
)
def test_a_schema_types_a_value_as_vllm_does_and_a_value_that_does_not_convert_stays_text(
    raw: str, schema: dict[str, Any], value: Any
) -> None:
    got = _value(raw, schema)
    assert got == value and type(got) is type(value)


def test_only_one_newline_each_side_of_a_value_is_markup() -> None:
    text = "<tool_call><function=f><parameter=a>\n\n x \n\n</parameter><parameter=b>y</parameter></function>"
    text += "</tool_call>"
    assert CODER.parse(text).calls == [ToolCall("f", {"a": "\n x \n", "b": "y"})]


# ---- the qwen3_coder chat template


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command. ",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "the command"},
                    "timeout": {"type": "integer"},
                },
                "required": ["command"],
            },
        },
    }
]
CALL_ARGS = {"command": "cat a.py\nls", "timeout": 5}
CALL = ToolCall("bash", CALL_ARGS)
CONVERSATION = [
    {"role": "system", "content": "Fix the bug."},
    {"role": "user", "content": "Tests fail."},
    {"role": "assistant", "content": "Let me look.\n",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": CALL_ARGS}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "x = 1"},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
]  # fmt: skip


@pytest.fixture(scope="module")
def coder_tokenizer() -> Any:
    from sao.models.bpe import build_bpe_tokenizer
    from sao.models.templates import load_chat_template

    return build_bpe_tokenizer(load_chat_template("qwen3_coder"))


def test_qwen3_coder_template_renders_tools_calls_and_results_as_qwen3_coder_does(
    coder_tokenizer: Any,
) -> None:
    text = coder_tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nFix the bug.\n\n# Tools\n\nYou have access to the following functions:\n\n"
        "<tools>\n"
        "<function>\n<name>bash</name>\n<description>Run a command.</description>\n<parameters>\n"
        "<parameter>\n<name>command</name>\n<type>string</type>\n<description>the command</description>\n"
        "</parameter>\n<parameter>\n<name>timeout</name>\n<type>integer</type>\n</parameter>\n"
        '<required>["command"]</required>\n</parameters>\n</function>\n</tools>\n\n'
        f"{CODER.instructions}<|im_end|>\n"
        "<|im_start|>user\nTests fail.<|im_end|>\n"
        "<|im_start|>assistant\nLet me look.\n\n<tool_call>\n<function=bash>\n<parameter=command>\n"
        "cat a.py\nls\n"
        "</parameter>\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nx = 1\n</tool_response>\n<tool_response>\nok\n</tool_response>\n"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = coder_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert coder_tokenizer.convert_tokens_to_ids("<tool_call>") in ids
    decoded = coder_tokenizer.decode(ids, skip_special_tokens=False)
    turn = decoded.split("<|im_start|>assistant\n")[1].split(EOT)[0]
    assert CODER.parse(turn, tools=TOOLS).calls == [CALL]
    assert CODER.parse(turn).calls == [ToolCall("bash", {"command": "cat a.py\nls", "timeout": "5"})]


def test_tool_call_arguments_sent_as_json_text_render_through_the_qwen3_coder_template(
    coder_tokenizer: Any,
) -> None:
    """What an OpenAI client sends back (``arguments`` as a JSON string) renders as the object would."""
    from sao.models.chat_delta import render

    wire = [dict(m) for m in CONVERSATION]
    call = wire[2]["tool_calls"][0]
    as_text = {**call["function"], "arguments": json.dumps(CALL_ARGS)}
    wire[2] = {**wire[2], "tool_calls": [{**call, "function": as_text}]}
    with pytest.raises(TemplateError, match="arguments as an object"):
        coder_tokenizer.apply_chat_template(wire, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    expected = coder_tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert render(coder_tokenizer, wire, TOOLS, add_generation_prompt=True) == expected


def test_qwen3_coder_template_system_turn_without_tools_or_system_message(coder_tokenizer: Any) -> None:
    user = [{"role": "user", "content": "hi"}]
    render = coder_tokenizer.apply_chat_template
    assert render(user, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    system = [{"role": "system", "content": "Be brief."}, *user]
    assert render(system, tokenize=False).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user"
    )
    defaulted = render(user, tools=TOOLS, tokenize=False)
    assert defaulted.startswith("<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact")
    with pytest.raises(TemplateError, match="arguments as an object"):
        call = {"function": {"name": "bash", "arguments": json.dumps(CALL.arguments)}}
        render(
            [*user, {"role": "assistant", "content": "", "tool_calls": [call]}], tools=TOOLS, tokenize=False
        )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=20), _calls(XML_NAMES, _text(TRICKY).filter(_coder_value)).filter(bool))
def test_the_template_re_renders_a_turn_exactly_as_the_format_generates_it(
    coder_tokenizer: Any, content: str, calls: list[ToolCall]
) -> None:
    from sao.models.chat_delta import assistant_text

    tool_calls = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    lead = content.strip() + "\n\n" if content.strip() else ""
    assert assistant_text(coder_tokenizer, message, TOOLS, EOT) == lead + CODER.render(calls) + EOT


# ---- envs read calls in their format


CALC_TASK = Task(id="t", prompt="What is 37 * 12?", answer=444, metadata={"a": 37, "op": "*", "b": 12})


def test_calculator_reads_calls_in_the_format_it_is_given() -> None:
    call = CODER.render([ToolCall("calc", {"expr": "37*12"})])
    _, results = play_scripted(CalculatorEnv(tool_format="qwen3_coder"), CALC_TASK, [call, "answer: 444"])
    assert results[0].observation == [{"role": "tool", "content": "444"}] and results[1].reward == 1.0
    _, results = play_scripted(CalculatorEnv(), CALC_TASK, [call])  # hermes reads the XML as a broken call
    assert results[0].observation[0]["content"].startswith("error: tool call is not valid JSON")
    with pytest.raises(ValueError, match=r"'xml'.*hermes, qwen3_coder"):
        CalculatorEnv(tool_format="xml")


def test_code_tests_reads_calls_in_the_format_it_is_given() -> None:
    from sao.envs.base import EnvError
    from sao.envs.code_tests import CodeTestsEnv

    try:
        env = CodeTestsEnv(tool_format="qwen3_coder", command_timeout_s=20.0, test_timeout_s=30.0)
    except EnvError as err:
        pytest.skip(f"no sandbox here: {err}")
    task = Task(id="add", prompt="Write calc.py.", tests={"t.py": "import calc"},
                metadata={"files": {}, "test_command": "python t.py"})  # fmt: skip
    write = CODER.render([ToolCall("write_file", {"path": "calc.py", "content": "X = 1\n"})])
    turns = ["no call", write, CODER.render([ToolCall("submit", {})])]
    _, results = play_scripted(env, task, turns)
    assert CODER.instructions in results[0].observation[0]["content"]
    assert results[1].observation[0]["role"] == "tool" and not results[1].observation[0][
        "content"
    ].startswith("error")
    assert results[2].done and results[2].reward == 1.0


def test_submit_turn_reports_malformed_blocks_and_runs_only_the_calls_before_submit() -> None:
    from sao.envs.tools import submit_turn

    text = (
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
        "<tool_call>not json</tool_call>"
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "bash", "arguments": {"command": "rm -rf ."}}</tool_call>'
    )
    observation, info, calls, submitted = submit_turn(HERMES.parse(text), turn=3)
    assert submitted and calls == [ToolCall("bash", {"command": "ls"})]
    assert info == {"turn": 3, "tool_calls": 3, "tool_errors": 1}
    assert [m["role"] for m in observation] == ["tool"] and observation[0]["content"].startswith("error: ")
    observation, info, calls, submitted = submit_turn(HERMES.parse("no calls"), turn=1)
    assert (observation, info, calls, submitted) == ([], {"turn": 1, "tool_calls": 0}, [], False)
