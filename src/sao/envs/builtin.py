"""Imports the built-in environments so that they register themselves (see `sao.envs.base.make_env`)."""

from sao.envs import (
    calculator,  # noqa: F401
    code_tests,  # noqa: F401
    guess_number,  # noqa: F401
    long_tail,  # noqa: F401
    math_tir,  # noqa: F401
    style_shift,  # noqa: F401
    tool_latency,  # noqa: F401
)
