"""A multi-turn verifiers taskset (``verifiers.v1``) for sao's tests: guess a secret number from 1 to 20.
The env's own ``run()`` plays the game engine, as the library's TextArena env does: it answers each guess
("Higher." / "Lower.") as the rollout's user through ``agents.player.interaction(task)``, and records
the ``solved`` reward on the trace. The player's ``max_turns`` (6) is the env's own turn limit.
"""

import re

import verifiers.v1 as vf

SYSTEM_PROMPT = "You are playing a guessing game. Reply with one number."


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class GuessConfig(vf.TasksetConfig):
    num_tasks: int = 4
    crash_after: int | None = None
    """The game engine raises on guess ``crash_after + 1`` (for the test that a failing env is dropped)."""


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> list[GuessTask]:
        prompt = "I picked a whole number from 1 to 20. Guess it."
        return [
            GuessTask(
                GuessData(prompt=prompt, system_prompt=SYSTEM_PROMPT, secret=(7 * i + 3) % 20 + 1),
                self.config.task,
            )
            for i in range(self.config.num_tasks)
        ]


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=6)


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task: GuessTask, agents: vf.Agents) -> None:
        secret, crash_after = task.data.secret, self.taskset.config.crash_after
        solved, guesses = False, 0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                guesses += 1
                if crash_after is not None and guesses > crash_after:
                    raise RuntimeError("the game engine crashed")
                numbers = re.findall(r"-?\d+", segment.last_reply)
                if numbers and int(numbers[-1]) == secret:
                    solved = True
                    break
                feedback = (
                    "Reply with one number."
                    if not numbers
                    else "Higher."
                    if int(numbers[-1]) < secret
                    else "Lower."
                )
                segment = await interaction.turn(feedback)
        interaction.trace.record_reward("solved", 1.0 if solved else 0.0)


__all__ = ["GuessEnv", "GuessTaskset"]
