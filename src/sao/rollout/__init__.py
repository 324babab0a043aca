"""Rollout: the agent loop (turns, tool calls, limits, token-in/token-out bookkeeping) and the producer."""

from .agent_loop import AgentLoopConfig, EpisodeError, run_episode

__all__ = ["AgentLoopConfig", "EpisodeError", "run_episode"]
