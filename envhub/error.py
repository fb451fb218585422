"""Exceptions raised by envhub, each with a message that says what to do next."""

from __future__ import annotations

import gymnasium


class EnvhubError(Exception):
    """Base class of every error envhub raises on purpose."""


class InvalidEnvId(EnvhubError, ValueError):
    """An environment id is not of the form ``namespace/Name-vN``."""


class UnknownEnv(EnvhubError, gymnasium.error.NameNotFound):
    """No environment is registered under the id that was asked for."""


class DuplicateEnv(EnvhubError, gymnasium.error.RegistrationError):
    """Two registrations claim the same environment id."""


class EntryPointError(EnvhubError, ImportError):
    """An environment's ``module:Class`` entry point could not be loaded."""


class ResetNeeded(EnvhubError, gymnasium.error.ResetNeeded):
    """``step()`` was called before ``reset()`` or after the episode ended."""


class InvalidAction(EnvhubError):
    """An action is not legal in the current state; the message says why.

    Environments raise it from ``parse_action``; ``TextEnv.step`` turns it into an
    invalid-action observation, so it never reaches the caller of ``step``.
    """


class PolicyError(EnvhubError):
    """A policy cannot act in an environment (no expert, no finite action set, ...)."""


class AdapterError(EnvhubError, ValueError):
    """A Gymnasium or PettingZoo environment cannot be adapted as given; the message names what to pass."""


class MissingDependency(EnvhubError, ImportError):
    """An optional dependency is not installed; the message says what to ``pip install``."""


class ModelNotFound(EnvhubError):
    """A model name (``--model``, ``--policy``) names no model that can be loaded here; the message says what to pass."""


class ResumeError(EnvhubError, ValueError):
    """A training run cannot resume as asked (no checkpoint, a checkpoint of another run), or would
    overwrite an earlier run's checkpoints; the message says which flag or path to give."""


class GeneratorOptionError(EnvhubError, ValueError):
    """A generator option (``generator_kwargs``) that the chosen backend does not take."""


class OutputLocked(EnvhubError):
    """An output folder is in use by another running training run; the message names it (PID and host)."""


class OutOfSpace(EnvhubError):
    """A write failed for lack of room (a full disk, a quota, a file size limit); the message names
    the path, the space it needed and what is still whole."""


class DamagedFiles(EnvhubError, ValueError):
    """A model or checkpoint folder whose files are cut short or unreadable (a write that did not
    finish); the message names the file and what is wrong with it."""


class NonFiniteReward(EnvhubError, ValueError):
    """An environment gave a NaN or infinite reward, which training cannot use; the message names
    the env and the episode."""
