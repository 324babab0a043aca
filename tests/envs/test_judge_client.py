"""The LLM judge's client: score parsing, settings and templates, retries/backoff/timeouts, the concurrency
bound, the cache and the counters; against httpx.MockTransport (exact behaviour) and a real HTTP server."""

from __future__ import annotations

import asyncio
import json
import math
import string
import threading

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import free_port
from sao.envs.base import JudgeError
from sao.envs.judge_client import (
    FAILURE_KINDS,
    JudgeClient,
    JudgeFields,
    JudgeRequestError,
    JudgeSettings,
    parse_score,
    render_messages,
    strip_think,
)

# --- parse_score ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "lo", "hi", "score"),
    [
        ('{"score": 7}', 0, 10, 7.0),
        ('```json\n{"reason": "fine", "Score": "6.5"}\n```', 0, 10, 6.5),
        ('{"score": 9, "reason": "not a score of 3"}', 0, 10, 9.0),  # the JSON key beats prose inside it
        ("Score: 7", 0, 10, 7.0),
        ("score = 7/10", 0, 10, 7.0),
        ("7/10", 0, 10, 7.0),
        ("**8**", 0, 10, 8.0),
        ("8", 0, 10, 8.0),
        ("  3.5. ", 0, 10, 3.5),
        ("**Score:** 6", 0, 10, 6.0),
        ("I give it a score of 4 out of 10.", 0, 10, 4.0),
        ("Rating: 2", 1, 5, 2.0),
        ("The answer 42 is off by 3. Score: 1", 0, 10, 1.0),  # the marker beats other numbers
        ("Step 2 of 3: **9**. Final score: 2", 0, 10, 2.0),
        ("Score: 3\nOn reflection, Score: 8", 0, 10, 8.0),  # the last marker
        ("I saw 3/4 of it right: 6/10", 0, 10, 6.0),  # only fractions over the scale's top count
        ("<think>Score: 2 maybe</think>\nScore: 9", 0, 10, 9.0),
        ("the template opened it: Score: 1</think> Score: 0", 0, 1, 0.0),
        ("Score: 1", 0, 1, 1.0),
        ("Score: 12", 0, 10, None),  # out of range, no fallback to other numbers
        ("Score: -1", 0, 10, None),
        ("Score: 7/5", 0, 10, None),  # a scale the judge was not asked for
        ('{"score": "nan"}', 0, 10, None),
        ('{"score": true}', 0, 10, None),
        ("Score: 1e999", 0, 10, None),  # not finite
        ("<think>Score: 7", 0, 10, None),  # unfinished thinking
        ("The answer is 7.", 0, 10, None),  # a number without a marker is not a score
        ("looks good to me", 0, 10, None),
        ("", 0, 10, None),
        (None, 0, 10, None),
    ],
)
def test_parse_score_hand_cases(text, lo, hi, score):
    assert parse_score(text, lo, hi) == score


_SCALES = st.sampled_from([(0, 1), (0, 10), (1, 5), (-5, 5), (0, 100)])
_FORMS = ["Score: {}", "score = {}", '{{"score": {}}}', "**{}**", "{}", "Final score is {}.", "Rating: {}"]


def _in_scale(data, lo, hi):
    if data.draw(st.booleans()):
        return float(data.draw(st.integers(lo, hi)))
    return data.draw(st.floats(lo, hi, allow_nan=False, allow_infinity=False))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), scale=_SCALES, form=st.sampled_from(_FORMS))
def test_parse_score_reads_back_every_in_range_value_in_every_form(data, scale, form):
    lo, hi = scale
    value = _in_scale(data, lo, hi)
    assert parse_score(form.format(repr(value)), lo, hi) == value


@settings(max_examples=200, deadline=None)
@given(data=st.data(), scale=_SCALES)
def test_parse_score_takes_the_last_marker_and_ignores_thinking_and_prose(data, scale):
    lo, hi = scale
    first, last, thought = (_in_scale(data, lo, hi) for _ in range(3))
    prose = data.draw(st.text(alphabet=string.ascii_letters + " ,.\n", max_size=40))
    prose = "" if any(w in prose.lower() for w in ("score", "rating", "grade", "of", "is")) else prose
    text = f"<think>Score: {thought!r}</think>{prose}\nScore: {first!r}\n{prose}\nscore: {last!r}\n"
    assert parse_score(text, lo, hi) == last


@settings(max_examples=200, deadline=None)
@given(scale=_SCALES, value=st.floats(allow_nan=True, allow_infinity=True), form=st.sampled_from(_FORMS[:3]))
def test_parse_score_never_accepts_a_value_outside_the_scale(scale, value, form):
    lo, hi = scale
    parsed = parse_score(form.format(repr(value)), lo, hi)
    if math.isfinite(value) and lo <= value <= hi:
        assert parsed == value
    else:
        assert parsed is None


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200), scale=_SCALES)
def test_parse_score_never_raises_and_answers_none_or_a_finite_in_range_value(text, scale):
    lo, hi = scale
    parsed = parse_score(text, lo, hi)
    assert parsed is None or (math.isfinite(parsed) and lo <= parsed <= hi)


def test_strip_think_drops_closed_lone_closing_and_unfinished_blocks():
    assert strip_think("<think>a</think>b<think>c</think>d") == "bd"
    assert strip_think("reasoning</think>answer") == "answer"
    assert strip_think("answer<think>cut off") == "answer"


# --- settings and templates ---------------------------------------------------------------------------


def _settings(**kw) -> JudgeSettings:
    return JudgeSettings(**({"base_url": "http://judge.test", "model": "grader"} | kw))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"prompt": "Grade {response} for {target_style}"}, r"unknown field \{target_style\}"),
        ({"prompt": "Grade {} please {response}"}, r"unknown field \{\}"),
        ({"prompt": "Grade {0} {response}"}, r"unknown field \{0\}"),
        ({"prompt": "Grade {response"}, "not a valid format string"),
        ({"prompt": "Grade {answer} {info[x]}"}, r"must show the episode"),
        ({"prompt": "{response:{width}}"}, r"unknown field \{width\}"),
        ({"base_url": "judge.test"}, "base_url"),
        ({"model": ""}, "model"),
        ({"score_min": 5, "score_max": 5}, "score_max"),
        ({"score_max": math.inf}, "score_max"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"retries": -1}, "retries"),
        ({"retries": True}, "retries"),
        ({"concurrency": 0}, "concurrency"),
        ({"cache_size": 1.5}, "cache_size"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"backoff_s": 2.0, "backoff_max_s": 1.0}, "backoff_max_s"),
        ({"api_key_env": ""}, "api_key_env"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting_or_field(kw, match):
    with pytest.raises(ValueError, match=match):
        _settings(**kw)


def test_chat_url_takes_base_urls_with_or_without_v1():
    assert _settings(base_url="http://h:1").chat_url == "http://h:1/v1/chat/completions"
    assert _settings(base_url="http://h:1/v1/").chat_url == "http://h:1/v1/chat/completions"


def test_render_messages_fills_every_field_from_the_episode():
    prompt = (
        "Q={prompt}|C={conversation}|R={response}|A={answer}|W={reward:.2f}|S={info[target_style]}"
        "|T={info[turn]}|scale={score_min}..{score_max}"
    )
    s = _settings(prompt=prompt, system_prompt="be strict", score_min=1, score_max=5)
    fields = JudgeFields(
        "q?", "user: q?\nassistant: a", "a", answer=42, reward=0.5, info={"target_style": "cute", "turn": 3}
    )
    assert render_messages(s, fields) == [
        {"role": "system", "content": "be strict"},
        {"role": "user", "content": "Q=q?|C=user: q?\nassistant: a|R=a|A=42|W=0.50|S=cute|T=3|scale=1..5"},
    ]
    # None answer/reward render empty; no system prompt, no system message; values' braces stay literal
    bare = render_messages(
        _settings(prompt="{answer}|{reward}|{response}", system_prompt=None), JudgeFields("", "", "{x}")
    )
    assert bare == [{"role": "user", "content": "||{x}"}]


def test_render_messages_names_a_field_the_episode_cannot_fill():
    s = _settings(prompt="{response} in {info[target_style]}")
    with pytest.raises(ValueError, match="target_style"):
        render_messages(s, JudgeFields("q", "c", "r", info={"style": "cute"}))


# --- the client against httpx.MockTransport -------------------------------------------------------


class _FixedRng:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def _ok(content: str) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": content}}]})


def _client(handler, jitter: float = 0.0, **kw):
    """A client over ``handler`` whose backoff waits are recorded, not slept; jitter factor 0.5 + jitter/2."""
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    client = JudgeClient(_settings(**kw), httpx.MockTransport(handler), sleep=sleep, rng=_FixedRng(jitter))
    return client, sleeps


def _fields(text: str = "the cat is fluffy~") -> JudgeFields:
    return JudgeFields(
        prompt="Write about a cat.",
        conversation=f"user: Write about a cat.\nassistant: {text}",
        response=text,
    )


def _grade(client: JudgeClient, fields: JudgeFields | None = None):
    return asyncio.run(client.grade(fields or _fields()))


def test_a_grade_sends_the_rendered_request_and_normalises_the_score(monkeypatch):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return _ok("The text is fine.\nScore: 4")

    monkeypatch.setenv("JUDGE_KEY", "sekret")
    client, _ = _client(
        handler, score_min=1, score_max=5, max_tokens=77, temperature=0.3, api_key_env="JUDGE_KEY"
    )
    grade = _grade(client)
    assert (grade.score, grade.raw_text, grade.cached, grade.attempts) == (
        0.75,
        "The text is fine.\nScore: 4",
        False,
        1,
    )
    assert grade.latency_s > 0
    (request,) = seen
    assert str(request.url) == "http://judge.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sekret"
    body = json.loads(request.content)
    assert body == {
        "model": "grader",
        "messages": render_messages(client.settings, _fields()),
        "temperature": 0.3,
        "max_tokens": 77,
    }


def test_no_api_key_env_sends_no_auth_header_and_an_unset_one_is_refused(monkeypatch):
    seen = []
    client, _ = _client(lambda r: seen.append(r) or _ok("Score: 5"))
    _grade(client)
    assert "authorization" not in seen[0].headers
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_JUDGE_KEY"):
        JudgeClient(_settings(api_key_env="NO_SUCH_JUDGE_KEY"))


def _scripted(*responses):
    """A handler answering ``responses`` in order (an exception instance is raised), counting calls."""
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        item = responses[min(len(calls), len(responses) - 1)]
        calls.append(request)
        if isinstance(item, Exception):
            raise item
        return item

    return handler, calls


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_429_and_5xx_are_retried_with_exponential_backoff(status):
    handler, calls = _scripted(httpx.Response(status, text="busy"), httpx.Response(status), _ok("Score: 6"))
    client, sleeps = _client(handler, retries=3, backoff_s=0.5)
    grade = _grade(client)
    assert (grade.score, grade.attempts, len(calls)) == (0.6, 3, 3)
    assert sleeps == [0.25, 0.5]  # backoff_s * 2^k * jitter factor 0.5
    stats = client.stats()
    assert (stats["requests"], stats["retries"], stats["failures"]) == (3, 2, 0)


def test_backoff_doubles_up_to_the_cap_and_jitter_scales_it():
    handler, calls = _scripted(httpx.Response(500))
    client, sleeps = _client(handler, jitter=1.0, retries=5, backoff_s=1.0, backoff_max_s=3.0)
    with pytest.raises(JudgeRequestError) as err:
        _grade(client)
    assert sleeps == [1.0, 2.0, 3.0, 3.0, 3.0] and len(calls) == 6
    assert (
        err.value.kind == "http" and "after 6 attempt(s)" in str(err.value) and "HTTP 500" in str(err.value)
    )
    assert client.stats()["failures/http"] == 1


def test_retry_after_is_honoured_up_to_the_cap():
    handler, _ = _scripted(
        httpx.Response(429, headers={"Retry-After": "7"}),
        httpx.Response(503, headers={"Retry-After": "60"}),
        _ok("Score: 1"),
    )
    client, sleeps = _client(handler, retries=2, backoff_s=0.1, backoff_max_s=10.0)
    _grade(client)
    assert sleeps == [7.0, 10.0]


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_fail_at_once_without_retries(status):
    handler, calls = _scripted(httpx.Response(status, text="bad request"), _ok("Score: 1"))
    client, sleeps = _client(handler, retries=3)
    with pytest.raises(JudgeRequestError, match=f"HTTP {status}") as err:
        _grade(client)
    assert (err.value.kind, len(calls), sleeps) == ("http", 1, [])
    assert isinstance(err.value, JudgeError)


def test_transport_errors_are_retried_then_fail_as_transport():
    handler, calls = _scripted(httpx.ConnectError("refused"), httpx.ReadError("reset"), _ok("Score: 2"))
    client, _ = _client(handler, retries=2)
    assert _grade(client).attempts == 3
    handler, calls = _scripted(httpx.ConnectError("refused"))
    client, sleeps = _client(handler, retries=1)
    with pytest.raises(JudgeRequestError, match="ConnectError") as err:
        _grade(client)
    assert (err.value.kind, len(calls), len(sleeps)) == ("transport", 2, 1)
    assert client.stats()["failures/transport"] == 1


def test_a_slow_judge_times_out_per_attempt_and_fails_as_timeout():
    calls = []

    async def slow(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        await asyncio.sleep(5)
        return _ok("Score: 1")

    client, sleeps = _client(slow, retries=1, timeout_s=0.05)
    with pytest.raises(JudgeRequestError, match=r"within 0\.05 s") as err:
        _grade(client)
    assert (err.value.kind, len(calls), len(sleeps)) == ("timeout", 2, 1)
    assert client.stats()["failures/timeout"] == 1


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, text="not json"),
        httpx.Response(200, json={"choices": []}),
        httpx.Response(200, json={"choices": [{"message": {"content": ["x"]}}]}),
    ],
)
def test_a_malformed_body_fails_as_http_without_retries(response):
    handler, calls = _scripted(response, _ok("Score: 1"))
    client, _ = _client(handler, retries=3)
    with pytest.raises(JudgeRequestError) as err:
        _grade(client)
    assert (err.value.kind, len(calls)) == ("http", 1)


def test_an_unparseable_answer_is_not_retried_and_the_error_carries_the_truncated_text():
    answer = "looks good to me " + "x" * 1000
    handler, calls = _scripted(_ok(answer))
    client, _ = _client(handler, retries=3)
    with pytest.raises(JudgeRequestError, match="unparseable answer 'looks good to me xxx") as err:
        _grade(client)
    assert (err.value.kind, len(calls)) == ("parse", 1) and len(str(err.value)) < 400
    # an empty answer (content null: e.g. a thinking model that ran out of tokens) is a parse failure too
    client, _ = _client(lambda r: httpx.Response(200, json={"choices": [{"message": {"content": None}}]}))
    with pytest.raises(JudgeRequestError, match="unparseable answer ''"):
        _grade(client)
    stats = client.stats()
    assert stats["failures/parse"] == 1 and stats["failures"] == 1


def test_a_custom_parser_reads_the_answer_and_its_value_must_be_in_the_scale():
    client, _ = _client(lambda r: _ok("QUALITY: yes"), score_min=0, score_max=1)
    messages = [{"role": "user", "content": "grade"}]
    grade = asyncio.run(client.grade_messages(messages, lambda text: 1.0 if "yes" in text else 0.0))
    assert grade.score == 1.0
    with pytest.raises(JudgeRequestError, match="unparseable"):
        asyncio.run(client.grade_messages([{"role": "user", "content": "again"}], lambda text: 2.0))


def test_the_cache_answers_repeats_by_content_and_evicts_the_least_recently_used():
    handler, calls = _scripted(_ok("Score: 3"))
    client, _ = _client(handler, cache_size=2)
    a, b, c = _fields("a"), _fields("b"), _fields("c")

    async def run(order):
        return [await client.grade(f) for f in order]

    grades = asyncio.run(run([a, a, b, a, c, b, a]))
    # a miss, a hit, b miss, a hit (a most recent), c miss (evicts b), b miss (evicts a), a miss
    assert [g.cached for g in grades] == [False, True, False, True, False, False, False]
    assert len(calls) == 5 and grades[1] == type(grades[1])(0.3, "Score: 3", 0.0, True, 0)
    stats = client.stats()
    assert (stats["grades"], stats["cache_hits"], stats["requests"]) == (7, 2, 5)


def test_cache_size_0_sends_every_grade_and_failures_are_not_cached():
    handler, calls = _scripted(_ok("Score: 3"))
    client, _ = _client(handler, cache_size=0)
    asyncio.run(client.grade(_fields()))
    asyncio.run(client.grade(_fields()))
    assert len(calls) == 2
    handler, calls = _scripted(_ok("no idea"), _ok("Score: 9"))
    client, _ = _client(handler)
    with pytest.raises(JudgeRequestError):
        _grade(client)
    assert _grade(client).score == 0.9 and _grade(client).cached and len(calls) == 2


def test_concurrency_bounds_requests_in_flight():
    state = {"now": 0, "peak": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.02)
        state["now"] -= 1
        return _ok("Score: 5")

    client, _ = _client(handler, concurrency=3, cache_size=0)

    async def run():
        return await asyncio.gather(*(client.grade(_fields(str(i))) for i in range(12)))

    assert len(asyncio.run(run())) == 12 and state["peak"] == 3


def test_a_cancelled_grade_gives_its_slot_back():
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.05)
        return _ok("Score: 5")

    client, _ = _client(slow, concurrency=1, cache_size=0)

    async def run():
        tasks = [asyncio.create_task(client.grade(_fields(str(i)))) for i in range(3)]
        await asyncio.sleep(0.01)
        tasks[0].cancel()  # holds the slot
        tasks[1].cancel()  # waits for it
        await asyncio.gather(*tasks, return_exceptions=True)
        return await asyncio.wait_for(client.grade(_fields("after")), 2)

    assert asyncio.run(run()).score == 0.5


def test_stats_start_at_zero_and_track_latency():
    client, _ = _client(lambda r: _ok("Score: 5"))
    stats = client.stats()
    assert set(stats) == {
        "grades", "requests", "retries", "cache_hits", "failures", "latency_mean_s", "latency_max_s",
        *(f"failures/{k}" for k in FAILURE_KINDS),
    }  # fmt: skip
    assert all(v == 0 for v in stats.values())
    _grade(client)
    stats = client.stats()
    assert stats["grades"] == stats["requests"] == 1 and 0 < stats["latency_mean_s"] == stats["latency_max_s"]


# --- the client against a real HTTP server ------------------------------------------------------


@pytest.fixture(scope="module")
def judge_server(serve_app):
    """A real OpenAI-style server in-process; ``state`` sets its answer, delay and first failures, and
    records the auth headers and the peak of concurrent requests."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    state: dict = {}

    async def chat(request):
        body = await request.json()
        state["auth"].append(request.headers.get("authorization"))
        state["models"].append(body["model"])
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        try:
            await asyncio.sleep(state["delay"])
            if state["fail_first"] > 0:
                state["fail_first"] -= 1
                return JSONResponse({"error": "busy"}, status_code=503, headers={"Retry-After": "0"})
            return JSONResponse({"choices": [{"message": {"role": "assistant", "content": state["answer"]}}]})
        finally:
            state["now"] -= 1

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    url = serve_app(app)

    def reset(**kw):
        state.clear()
        state.update(
            {
                "auth": [],
                "models": [],
                "now": 0,
                "peak": 0,
                "delay": 0.0,
                "fail_first": 0,
                "answer": "Score: 7",
            }
        )
        state.update(kw)
        return state

    return url, reset


def test_a_real_server_grades_and_a_503_is_retried_over_http(judge_server, monkeypatch):
    url, reset = judge_server
    state = reset(fail_first=1, answer="Reasoning...\nScore: 8")
    monkeypatch.setenv("REAL_JUDGE_KEY", "k1")
    client = JudgeClient(_settings(base_url=url, api_key_env="REAL_JUDGE_KEY", backoff_s=0.01))
    grade = _grade(client)
    assert (grade.score, grade.attempts) == (0.8, 2)
    assert state["auth"] == ["Bearer k1", "Bearer k1"] and state["models"] == ["grader", "grader"]


def test_a_real_server_too_slow_times_out(judge_server):
    url, reset = judge_server
    reset(delay=2.0)
    client = JudgeClient(_settings(base_url=url + "/v1", timeout_s=0.2, retries=0))
    with pytest.raises(JudgeRequestError, match="timeout failure after 1 attempt"):
        _grade(client)


def test_the_concurrency_bound_holds_across_event_loops_and_threads_at_a_real_server(judge_server):
    url, reset = judge_server
    state = reset(delay=0.1)
    client = JudgeClient(_settings(base_url=url, concurrency=3, cache_size=0))
    results: list = []

    def worker(k: int) -> None:
        async def run():
            return await asyncio.gather(*(client.grade(_fields(f"{k}-{i}")) for i in range(4)))

        results.extend(asyncio.run(run()))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 12 and {g.score for g in results} == {0.7}
    assert state["peak"] == 3 and client.stats()["requests"] == 12
    # a loop that has closed leaves its HTTP client behind; a new loop gets a working one
    assert _grade(client, _fields("later")).score == 0.7


def test_an_unreachable_judge_fails_as_transport_after_its_retries():
    client = JudgeClient(_settings(base_url=f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=0.01))
    with pytest.raises(JudgeRequestError, match="transport failure after 2 attempt") as err:
        _grade(client)
    assert err.value.kind == "transport"
