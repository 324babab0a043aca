"""A tool-using verifiers taskset (``verifiers.v1``) for sao's tests: products of two numbers, with a
per-rollout ``vf.Toolset`` of python functions (``calc_multiply``, ``calc_divide``, and ``calc_digits``,
which reads the task its ``setup_task`` got), rewarded for the
exact answer; a response ``@vf.stop`` ends the rollout when the model gives up.
"""

import verifiers.v1 as vf


class CalcToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    async def setup_task(self, task: vf.TaskData) -> None:
        self.answer_digits = len(str(task.answer))

    @vf.tool
    def digits(self) -> str:
        """How many digits the answer has."""
        return f"The answer has {self.answer_digits} digits."

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    @vf.tool
    def divide(self, a: int, b: int) -> float:
        """Divide a by b."""
        return a / b


class ProductData(vf.TaskData):
    answer: int


class ProductTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class ProductTask(vf.Task[ProductData, vf.State, ProductTaskConfig]):
    @classmethod
    def toolsets(cls, config: ProductTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(self.data.answer))

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.assistant_messages))

    @vf.stop
    async def gave_up(self, response: vf.Response) -> bool:
        return "I give up" in (response.message.content or "")


class ProductConfig(vf.TasksetConfig):
    num_tasks: int = 3
    task: ProductTaskConfig = ProductTaskConfig()


class ProductTaskset(vf.Taskset[ProductTask, ProductConfig]):
    def load(self) -> list[ProductTask]:
        pairs = [(12, 34), (56, 78), (91, 23), (45, 67)][: self.config.num_tasks]
        return [
            ProductTask(
                ProductData(
                    prompt=f"What is {a} * {b}? Use the tools, then reply with the number only.", answer=a * b
                ),
                self.config.task,
            )
            for a, b in pairs
        ]


__all__ = ["ProductTaskset"]
