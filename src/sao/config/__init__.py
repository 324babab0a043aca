"""Typed run configuration, loaded from YAML plus dotted overrides.

The pydantic sections live in `sao.config.schema`; `load_config` / `dump_config` and the error messages that
name the dotted key live in `sao.config.loading`.
"""

from sao.config.loading import dump_config, load_config
from sao.config.schema import (
    CRITIC_ADVANTAGES,
    DEFAULT_PRESET,
    AlgoConfig,
    ClusterConfig,
    ConfigError,
    CriticConfig,
    DataConfig,
    EngineConfig,
    EvalConfig,
    GatewayConfig,
    LoggingConfig,
    ModelConfig,
    RunConfig,
    RuntimeConfig,
    TrainerConfig,
    ValuePretrainConfig,
)

__all__ = [
    "CRITIC_ADVANTAGES",
    "DEFAULT_PRESET",
    "AlgoConfig",
    "ClusterConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "EngineConfig",
    "EvalConfig",
    "GatewayConfig",
    "LoggingConfig",
    "ModelConfig",
    "RunConfig",
    "RuntimeConfig",
    "TrainerConfig",
    "ValuePretrainConfig",
    "dump_config",
    "load_config",
]
