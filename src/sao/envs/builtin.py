"""Imports the built-in environments so that they register themselves (see `sao.envs.base.make_env`)."""
