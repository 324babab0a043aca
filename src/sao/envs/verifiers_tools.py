"""The tools of a `verifiers` environment, served in-process for sao (`sao.envs.verifiers_env`).

In the library a ``vf.Toolset`` is an MCP server launched per rollout (or once per run, for a taskset's
shared toolsets), and the chat harness calls it over HTTP. Here each toolset registers its ``@vf.tool``
methods (its own ``register`` hook) on an in-process ``mcp`` server: its schemas become the sao env's
``tools`` (OpenAI function schemas), and the model's tool calls are answered by calling it directly.

Names and answers follow the library's chat harness: a tool is named ``<server>_<tool>`` (the toolset's
``server_name``; bare when its ``TOOL_PREFIX`` is None); a tool that raises answers with its error text
(as the MCP server does), an unknown tool with ``error: unknown tool 'x'``. Not supported (`EnvError`):
toolsets with a typed ``State`` (their state lives on the rollout's ``/state`` channel), toolsets
configured with a remote ``url``, and image or audio tool results.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from sao.envs.base import EnvError

__all__ = ["ToolBox", "run_sync"]

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, inside a running event loop or not (then in a
    worker thread with its own loop). For short, self-contained coroutines only (listing tools)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _check_supported(toolset: Any) -> None:
    import verifiers.v1 as vf
    from verifiers.v1.state import state_cls  # 0.4.0 exports no public name for a class's State type

    name = type(toolset).__name__
    if not callable(getattr(toolset, "register", None)):
        raise EnvError(f"toolset {name} has no register() method (not a verifiers.v1.Toolset)")
    if getattr(toolset.config, "url", None):
        raise EnvError(f"toolset {name} runs at a remote url; sao serves toolsets in-process only")
    if state_cls(type(toolset)) is not vf.State:
        raise EnvError(
            f"toolset {name} keeps a typed State (synced over the rollout's /state channel), "
            "which sao does not serve"
        )


class ToolBox:
    """The toolsets of one episode: OpenAI function ``schemas`` and `call` by qualified name."""

    def __init__(self, schemas: list[dict[str, Any]], dispatch: dict[str, tuple[Any, str]]) -> None:
        self.schemas = schemas
        self._dispatch = dispatch  # qualified name -> (in-process MCP server, the tool's own name)

    @classmethod
    async def open(
        cls, toolsets: Sequence[Any], shared: Sequence[Any] = (), data: Any = None, setup: bool = True
    ) -> ToolBox:
        """Register the rollout's ``toolsets`` and the taskset's ``shared`` ones on in-process servers.
        With ``setup``, first run each one's ``setup()`` and, for the rollout's own, ``setup_task(data)``
        (``data``: the task's ``vf.TaskData``), as the library does when it launches them."""
        from mcp.server.mcpserver import MCPServer

        schemas: list[dict[str, Any]] = []
        dispatch: dict[str, tuple[Any, str]] = {}
        for k, toolset in enumerate([*toolsets, *shared]):
            _check_supported(toolset)
            if setup:
                await toolset.setup()
                if k < len(toolsets):
                    await toolset.setup_task(data)
            prefix = toolset.server_name
            server = MCPServer(prefix or type(toolset).__name__)
            toolset.register(server)
            for tool in await server.list_tools():
                full = f"{prefix}_{tool.name}" if prefix else tool.name
                if full in dispatch:
                    raise EnvError(f"two toolsets define the tool {full!r}; give one a distinct TOOL_PREFIX")
                dispatch[full] = (server, tool.name)
                function = {
                    "name": full,
                    "description": tool.description or "",
                    "parameters": tool.input_schema,
                }
                schemas.append({"type": "function", "function": function})
        return cls(schemas, dispatch)

    @classmethod
    def describe(cls, toolsets: Sequence[Any]) -> list[dict[str, Any]]:
        """The OpenAI function schemas of ``toolsets`` (without running their setup), from sync code."""
        return run_sync(cls.open(toolsets, setup=False)).schemas

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text the model sees for the call ``name(**arguments)``; a failing tool's error text."""
        from mcp.server.mcpserver.exceptions import ToolError
        from mcp.types import CallToolResult

        if name not in self._dispatch:
            return f"error: unknown tool {name!r}"
        server, raw = self._dispatch[name]
        try:
            result = await server.call_tool(raw, arguments)
        except ToolError as err:  # the tool raised, or its arguments did not validate
            return str(err)
        if not isinstance(result, CallToolResult):
            raise EnvError(f"tool {name!r} asked for client input ({type(result).__name__}); not supported")
        return _result_text(name, result)


def _result_text(name: str, result: Any) -> str:
    """The text of an MCP tool result, as the library's chat harness renders a text-only one."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", None)
        if kind in ("image", "audio"):
            raise EnvError(
                f"tool {name!r} answered with {kind} content; sao's verifiers adapter is text-only"
            )
        parts.append(block.text if kind == "text" else str(block))
    return "\n".join(parts) if parts else str(result.content)
