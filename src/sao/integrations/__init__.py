"""Adapters that let other projects' agent harnesses run on sao's pieces, loaded by those harnesses by
import path (sao never imports them itself).

- `mini_swe_agent`: a mini-swe-agent environment (``SandboxEnvironment``) that runs the harness's commands
  in sao's bubblewrap sandbox, on a SWE-style instance's workspace (`sao.envs.swe_workspace`), and grades
  it with the hidden tests. Recipe: examples/swe_agent/README.md.
"""
