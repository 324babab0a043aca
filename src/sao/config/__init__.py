"""Typed run configuration, loaded from YAML plus dotted overrides.

`RunConfig` and the rules across sections live in `sao.config.schema`, each section in a module of its own
(`algo`: the typed algorithm configs); `load_config` / `dump_config` and the error messages that
name the dotted key live in `sao.config.loading`.
"""

from sao.config.loading import dump_config, load_config
from sao.config.schema import (
    DEFAULT_PRESET,
    AlgoConfig,
    ClusterConfig,
    ConfigError,
    CriticConfig,
    DataConfig,
    EngineConfig,
    EvalConfig,
    GatewayConfig,
    JudgeConfig,
    LoggingConfig,
    ModelConfig,
    RunConfig,
    RuntimeConfig,
    TrainerConfig,
    ValuePretrainConfig,
)

__all__ = [
    "DEFAULT_PRESET",
    "AlgoConfig",
    "ClusterConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "GatewayConfig",
    "JudgeConfig",
    "LoggingConfig",
    "ModelConfig",
    "RunConfig",
    "RuntimeConfig",
    "TrainerConfig",
    "ValuePretrainConfig",
    "dump_config",
    "load_config",
]
