"""Write mini-swe-agent-shaped conversations for an SFT warm start (``{"messages", "tools"}`` JSONL lines).

A random tiny model never writes a valid tool call, so every mini-swe-agent turn would be a format error
and no command would ever run. This teaches the format only: each conversation has the system and task
messages rendered from the harness's own config (``mini_swe_agent.yaml``, with mini-swe-agent's bash tool),
then one to four commands that look around the instance's repository (``ls``, ``cat`` the module the issue
names, ``grep`` for the function), each as ``<tool_call>{"name": "bash", ...}</tool_call>`` answered by its
real output at ``base_commit`` rendered with the config's observation template, and, in most of them, the
submit command last. Nothing in it fixes a bug: the warm-started model explores and submits, and its
solve rate stays near zero; the point is sessions with real turns (commands run in the sandbox,
observations masked).

Imports nothing of sao: the instance file's fields and ``git`` are all it reads.

    python examples/swe_agent/make_warm_chats.py --instances runs/swe_gateway/synth/instances.jsonl \\
        --n 2000 --out runs/swe_gateway/warm_chats.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from jinja2 import StrictUndefined, Template

HERE = Path(__file__).resolve().parent
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
BASH_TOOL = {  # mini-swe-agent's own tool (minisweagent.models.utils.actions_toolcall.BASH_TOOL)
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
            "required": ["command"],
        },
    },
}
SUBMIT_SHARE = 0.8  # conversations that end with the submit command (the rest end after a look around)
_NAMED = (  # where an issue names the function: "from pkg.module import fn", "`pkg.module.fn`"
    re.compile(r"from ([A-Za-z_][\w.]*) import ([A-Za-z_]\w*)"),
    re.compile(r"`([A-Za-z_][\w.]*)\.([A-Za-z_]\w*)`"),
)


class Repo:
    """The files of one instance's repository at its base commit (read with git, never checked out)."""

    def __init__(self, path: Path, commit: str) -> None:
        listing = subprocess.run(
            ["git", "-C", str(path), "ls-tree", "-r", "--name-only", commit],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        self.path, self.commit, self.files = path, commit, sorted(listing.split())
        self._text: dict[str, str] = {}

    def read(self, name: str) -> str:
        if name not in self._text:
            self._text[name] = subprocess.run(
                ["git", "-C", str(self.path), "show", f"{self.commit}:{name}"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
        return self._text[name]

    def ls(self, directory: str = "") -> str:
        prefix = f"{directory}/" if directory else ""
        names = {f[len(prefix) :].split("/")[0] for f in self.files if f.startswith(prefix)}
        return "".join(f"{n}\n" for n in sorted(n for n in names if not n.startswith(".")))

    def grep(self, pattern: str, directory: str) -> str:
        out = []
        for name in self.files:
            if name.startswith(f"{directory}/") and name.endswith(".py"):
                out += [
                    f"{name}:{i}:{line}\n"
                    for i, line in enumerate(self.read(name).splitlines(), 1)
                    if pattern in line
                ]
        return "".join(out)


def commands(repo: Repo, statement: str, rng: random.Random) -> list[tuple[str, str, int]]:
    """``(command, output, returncode)`` of a short look around the repository."""
    steps: list[tuple[str, str, int]] = [("ls", repo.ls(), 0)]
    found = next((m for pattern in _NAMED if (m := pattern.search(statement))), None)
    if found:
        dotted, function = found.groups()
        module_path = dotted.replace(".", "/") + ".py"
        package = dotted.split(".")[0]
        if module_path in repo.files:
            steps.append((f"cat {module_path}", repo.read(module_path), 0))
        hits = repo.grep(f"def {function}", package)
        steps.append((f'grep -rn "def {function}" {package}', hits, 0 if hits else 1))
        steps.append((f"ls {package}", repo.ls(package), 0))
    rng.shuffle(steps)
    return steps[: rng.randint(1, len(steps))]


def conversation(config: dict[str, Any], row: dict[str, Any], repo: Repo, rng: random.Random) -> list[dict]:
    agent, model = config["agent"], config["model"]
    observation = Template(model["observation_template"], undefined=StrictUndefined)
    render = {"task": row["problem_statement"]}
    messages = [
        {"role": "system", "content": Template(agent["system_template"]).render(**render)},
        {"role": "user", "content": Template(agent["instance_template"]).render(**render)},
    ]
    steps = commands(repo, row["problem_statement"], rng)
    for command, output, code in steps:
        messages.append({"role": "assistant", "content": _call(command)})
        shown = {"output": output, "returncode": code, "exception_info": ""}
        messages.append({"role": "tool", "content": observation.render(output=shown)})
    if rng.random() < SUBMIT_SHARE:
        messages.append({"role": "assistant", "content": _call(SUBMIT)})
    else:
        messages.pop()  # end on the last command: the loss covers assistant turns only
    return messages


def _call(command: str) -> str:
    return (
        "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", required=True, type=Path, help="sao's SWE instance file (JSONL)")
    p.add_argument("--config", type=Path, default=HERE / "mini_swe_agent.yaml", help="the harness's config")
    p.add_argument("--n", type=int, default=2000, help="conversations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    config = yaml.safe_load(args.config.read_text())
    rows = [json.loads(line) for line in args.instances.read_text().splitlines() if line.strip()]
    repos = {}
    for row in rows:
        path = Path(row["repo_path"])
        path = path if path.is_absolute() else args.instances.parent / path
        repos[row["instance_id"]] = Repo(path, row["base_commit"])
    rng = random.Random(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for _ in range(args.n):
            row = rng.choice(rows)
            messages = conversation(config, row, repos[row["instance_id"]], rng)
            f.write(json.dumps({"messages": messages, "tools": [BASH_TOOL]}) + "\n")
    print(f"wrote {args.n} conversations over {len(rows)} instances to {args.out}")


if __name__ == "__main__":
    main()
