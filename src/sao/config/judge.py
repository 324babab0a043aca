"""The judge section: an LLM behind any OpenAI-compatible endpoint grades every finished episode, and its
score is combined with the env's own reward (docs/envs.md, "LLM-judge rewards")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sao.envs.judge_client import DEFAULT_PROMPT, DEFAULT_SYSTEM_PROMPT, TEMPLATE_FIELDS, JudgeSettings

from .section import Section

__all__ = ["JudgeConfig"]


class JudgeConfig(Section):
    """An LLM judge's reward: off while ``url`` is null; every other key needs ``url`` set."""

    url: str | None = Field(
        None,
        description="Base URL of the judge's OpenAI-compatible server (with or without /v1), e.g. a "
        "`sao serve` of a frozen model; null: no judge.",
    )
    model: str = Field("judge", description="Model name sent in the judge's requests.")
    api_key_env: str | None = Field(
        None, description="Environment variable holding the judge's API key; null: no Authorization header."
    )
    system_prompt: str | None = Field(
        DEFAULT_SYSTEM_PROMPT, description="The judge's system message; null or '': none."
    )
    prompt: str = Field(
        DEFAULT_PROMPT,
        description="The judge's user message, a str.format template (literal braces doubled) over "
        f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)}: the task's first user message, the episode as "
        "a 'role: text' transcript, the final assistant text, the task's reference answer, the env's reward, "
        "the env's last-step info (e.g. {info[style]}) and the scale. It must use {response} or "
        "{conversation}; an unknown field is refused at load.",
    )
    score_min: float = Field(0.0, description="Lowest score the prompt asks for (normalised to reward 0).")
    score_max: float = Field(10.0, description="Highest score the prompt asks for (normalised to reward 1).")
    combine: Literal["product", "sum", "mean", "judge"] = Field(
        "product",
        description="How the judge's normalised score s and the env's outcome r make the episode's reward: "
        "'product' r*s (the paper's quality x style), 'sum' r+s, 'mean' (r+s)/2, 'judge' s alone.",
    )
    temperature: float = Field(0.0, ge=0, description="The judge's sampling temperature.")
    max_tokens: int = Field(256, ge=1, description="The judge's answer budget in tokens.")
    timeout_s: float = Field(60.0, gt=0, description="Seconds one judge request may take.")
    retries: int = Field(
        3,
        ge=0,
        description="Retries of a request that failed in transport, timed out or got HTTP 429/5xx, with "
        "exponential backoff; then the episode is dropped as judge_error (an unparseable answer is not "
        "retried).",
    )
    concurrency: int = Field(8, ge=1, description="Judge requests in flight at once, per process.")
    cache_size: int = Field(
        4096,
        ge=0,
        description="Grades kept, keyed by the request's content (a repeat is not re-sent); 0: off.",
    )

    @model_validator(mode="after")
    def _needs_url(self) -> JudgeConfig:
        changed = [name for name in self.changed() if name != "url"]
        if self.url is None:
            if changed:
                raise ValueError(f"judge.{changed[0]} applies only with judge.url set (no judge without it)")
            return self
        try:
            self.settings()
        except ValueError as err:  # "judge setting <name> must be ...": the same names as these keys
            raise ValueError(str(err).replace("judge setting ", "judge.", 1)) from None
        return self

    def settings(self) -> JudgeSettings:
        """The judge client's settings (``url`` must be set)."""
        assert self.url is not None
        return JudgeSettings(
            base_url=self.url, model=self.model, api_key_env=self.api_key_env,
            system_prompt=self.system_prompt, prompt=self.prompt, score_min=self.score_min,
            score_max=self.score_max, temperature=self.temperature, max_tokens=self.max_tokens,
            timeout_s=self.timeout_s, retries=self.retries, concurrency=self.concurrency,
            cache_size=self.cache_size,
        )  # fmt: skip

    def worst_case_s(self) -> float:
        """Seconds one grade may take at most: every attempt timing out, with the longest backoffs."""
        backoffs = self.settings().backoff
        return (self.retries + 1) * self.timeout_s + sum(backoffs(k) for k in range(1, self.retries + 1))
