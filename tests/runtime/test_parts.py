"""`RunParts`: one typed field per factory, each holding what that factory made of the config."""

from __future__ import annotations

import dataclasses
import typing

from sao.config import load_config
from sao.runtime.build import FACTORIES, assemble
from sao.runtime.parts import RunParts


def test_run_parts_has_one_field_per_factory_holding_that_factorys_typed_arguments():
    cfg = load_config(None, ["model.tiny_arch=qwen3", "model.device=cpu", "runtime.backend=ray"])
    parts = assemble(cfg)
    hints = typing.get_type_hints(RunParts)
    assert [f.name for f in dataclasses.fields(RunParts)] == list(FACTORIES)
    for name, factory in FACTORIES.items():
        value = getattr(parts, name)
        assert isinstance(value, hints[name]), (name, type(value), hints[name])
        assert value == factory(cfg), name
    assert parts.loop.backend == "ray" and parts.engine.server.replica_gpus is not None
