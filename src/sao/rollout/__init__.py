"""Rollout: the agent loop (turns, tool calls, limits, token-in/token-out bookkeeping) and the producer."""
