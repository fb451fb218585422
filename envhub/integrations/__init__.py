"""envhub environments handed to other trainers and servers, unchanged.

- :mod:`envhub.integrations.trl`: TRL's ``GRPOTrainer(environment_factory=...)``.
- :mod:`envhub.integrations.gem`: GEM's registry (``gem.make("envhub:ID")``), which ROLL's agentic
  pipeline uses.
- :mod:`envhub.integrations.openenv`: an OpenEnv server (``envhub serve ID``) for OpenEnv clients.

Each module imports only the core; the peer package (``pip install 'envhub[trl]'``, ``[gem]``,
``[openenv]``) is imported where it is needed, and its absence is a one-line error naming the extra.
"""
