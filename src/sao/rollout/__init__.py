"""Rollout: one episode of an environment played by an inference engine, recorded token-in/token-out.

`agent_loop` owns the turns, limits and token bookkeeping and builds the `sao.types.Trajectory`;
`env_calls` calls the (user-written) environment under a timeout and checks each answer. The producer that
keeps many episodes in flight is `sao.runtime.producer`'s.
"""

from .agent_loop import AgentLoopConfig, EpisodeError, run_episode

__all__ = ["AgentLoopConfig", "EpisodeError", "run_episode"]
