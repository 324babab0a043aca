"""A single-turn verifiers taskset (the library's 0.4 API, ``verifiers.v1``) for sao's tests: sums of two
numbers, with a system prompt and a few-shot turn, rewarded for the exact answer.

Load it as a hub package is loaded, by module name (`tests/envs/vf_envs` on ``sys.path``):
``data.env_kwargs: {env_id: sao_vf_sum, env_args: {num_tasks: 5}}``.
"""

import verifiers.v1 as vf

SYSTEM_PROMPT = "Answer with the number only."
FEW_SHOT = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"}]


class SumData(vf.TaskData):
    answer: str


class SumTaskConfig(vf.TaskConfig):
    nan_reward: bool = False
    """Score every rollout NaN (a broken reward function, for the test that it is refused)."""
    use_runtime: bool = False
    """Have a metric run a command in the rollout's runtime (which sao does not provide)."""


class SumTask(vf.Task[SumData, vf.State, SumTaskConfig]):
    @vf.reward
    async def exact_answer(self, trace: vf.Trace) -> float:
        return float("nan") if self.config.nan_reward else float(trace.last_reply == self.data.answer)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        if self.config.use_runtime:
            await runtime.run(["true"], {})
        return float(len(trace.last_reply))


class SumConfig(vf.TasksetConfig):
    num_tasks: int = 5
    task: SumTaskConfig = SumTaskConfig()


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        return [
            SumTask(
                SumData(
                    prompt=[*FEW_SHOT, {"role": "user", "content": f"What is {i} + {i + 3}?"}],
                    system_prompt=SYSTEM_PROMPT,
                    answer=str(2 * i + 3),
                ),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]


__all__ = ["SumTaskset"]
