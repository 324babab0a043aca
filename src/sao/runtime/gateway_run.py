"""The training run's gateway: the OpenAI-compatible server in front of the run's engine, on the run's loop.

`RunGateway` builds the app (`sao.serve.gateway.create_app`) with the run's `GatewaySource` as its session
hooks, the session rules of the config (token budget ``data.max_total_tokens``, turn limit
``data.max_turns``, the engine's sampling, ``engine.max_new_tokens`` per turn) and a verifier, serves it
with uvicorn as a task of the run's event loop (so weight pushes and generation share the one engine), and
writes ``RUN_DIR/gateway.json`` (``base_url``, ``host``, ``port``, ``model``) for agents to find it.
The socket is bound before serving, so a port in use is a clear error at start-up.

`make_verifier`: rewards from inside sao — the run's env scores a finished conversation of a task the
agent names (`sao.envs.base.score_conversation`), under ``data.env_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sao.config import ConfigError
from sao.envs.base import Env, EnvError, Task, score_conversation
from sao.serve.hooks import Verifier, VerifierError

from .args import GatewayArgs
from .gateway_source import GatewaySource

__all__ = ["GATEWAY_FILE", "RunGateway", "make_verifier"]

GATEWAY_FILE = "gateway.json"


def make_verifier(make_env: Callable[[], Env], tasks: Sequence[Task], timeout_s: float | None) -> Verifier:
    """``verify(task_id, messages) -> reward``: a fresh env's ``score`` of the conversation; raises
    `VerifierError` for an unknown task, an env without a scorer, a failing or slow scorer."""
    by_id = {task.id: task for task in tasks}

    async def verify(task_id: str, messages: Sequence[Mapping[str, Any]]) -> float:
        task = by_id.get(task_id)
        if task is None:
            raise VerifierError(f"unknown task id {task_id!r} (data.train_file or the env's own tasks)")
        env = make_env()
        try:
            try:
                return await asyncio.wait_for(score_conversation(env, task, list(messages)), timeout_s)
            except EnvError as err:
                raise VerifierError(str(err)) from None
            except asyncio.TimeoutError:
                raise VerifierError(f"the env's score() took longer than {timeout_s:g} s") from None
            except Exception as err:  # a user env's scorer that raises costs this reward, not the run
                raise VerifierError(f"the env's score() raised {type(err).__name__}: {err}") from None
        finally:
            with contextlib.suppress(Exception):
                await env.close()

    return verify


def _uvicorn_server(config: Any) -> Any:
    """uvicorn's server without its signal handlers: Ctrl-C stops the training run, not just the server."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return Server(config)


class RunGateway:
    """The run's server (see the module docstring): `start` binds and serves, `close` stops it."""

    def __init__(
        self,
        args: GatewayArgs,
        engine: Any,
        tokenizer: Any,
        source: GatewaySource,
        verifier: Verifier | None,
        run_dir: Path,
        *,
        model_name: str,
    ) -> None:
        self.args, self.engine, self.tokenizer, self.source = args, engine, tokenizer, source
        self.verifier, self.run_dir, self.model_name = verifier, run_dir, model_name
        self.base_url: str | None = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Bind, serve, write ``gateway.json``; returns the base URL (``http://host:port/v1``)."""
        import uvicorn

        from sao.serve.gateway import create_app

        g = self.args.gateway
        app = create_app(
            self.engine, self.tokenizer, model_name=self.model_name,
            default_max_tokens=self.args.rules.max_tokens_per_turn or 1024,
            max_sessions=g.max_sessions, session_idle_timeout_s=g.session_idle_timeout_s,
            max_body_bytes=g.max_body_bytes, max_pending=g.max_pending, retry_after_s=g.retry_after_s,
            hooks=self.source, rules=self.args.rules, verifier=self.verifier,
            tool_call_format=g.tool_call_format,
            reasoning_parser=g.reasoning_parser,
        )  # fmt: skip
        sock = socket.socket(socket.AF_INET6 if ":" in g.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((g.host, g.port))
        except OSError as err:
            sock.close()
            why = f"gateway.host/gateway.port: cannot listen on {g.host}:{g.port}: {err}"
            raise ConfigError(why) from None
        sock.listen(2048)
        sock.setblocking(False)
        port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
        self._server = _uvicorn_server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the gateway server stopped during start-up")
            await asyncio.sleep(0.01)
        self.base_url = f"http://{g.host}:{port}/v1"
        info = {"base_url": self.base_url, "host": g.host, "port": port, "model": self.model_name}
        (self.run_dir / GATEWAY_FILE).write_text(json.dumps(info, indent=2) + "\n")
        return self.base_url

    async def close(self) -> None:
        """Stop serving (requests in flight get up to 5 s to finish); the engine stays the run's."""
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=10)
        except asyncio.TimeoutError:
            self._server.force_exit = True
            with contextlib.suppress(Exception):
                await self._task
        finally:
            self._task = None
