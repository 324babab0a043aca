"""Serving layer: the OpenAI-compatible gateway and the session recorder, above the engine.

Owns the HTTP gateway any OpenAI-SDK agent can talk to (`sao.serve.gateway`, what ``sao serve`` runs) and
the token-in/token-out recording of chat sessions into trajectories (`sao.serve.sessions`, also used by
the rollout agent loop), with its resource limits (`sao.serve.limits`) and bounded session registry
(`sao.serve.registry`). Generation itself is `sao.engine`'s; this layer never computes gradients.
"""
