"""Serving layer: the OpenAI- and Anthropic-compatible gateway and the session recorder, above the engine.

`gateway` is the HTTP server any OpenAI-SDK (or Anthropic-SDK) agent can talk to (what ``sao serve`` runs);
`openai_api`, `anthropic_api` and `responses_api` hold each API's request bodies and conversions
(Chat Completions, Messages, Responses); `streaming` turns a served reply into each API's server-sent
events; `replies` builds the assistant message of a generation (reasoning split off by `reasoning`, tool
calls read by `sao.envs.tool_formats`); `generation` is the engine call with the context cap and engine
errors as HTTP errors; `turns` serves one recorded request of a session and closes sessions, without HTTP;
`sessions` records a chat session token-in/token-out as a trajectory (the rollout agent loop uses it too);
`hooks` is what the gateway's owner decides (admission, where closed sessions go), `limits` its resource
limits and `registry` its bounded set of open sessions. Generation itself is `sao.engine`'s; this layer
never computes gradients.
"""
