"""Train an agent that already exists: an OpenAI-compatible endpoint that records token-exact turns.

:class:`ChatProxy` serves ``/v1/chat/completions`` in front of any registered generator, renders
each request with the model's chat template (tools included), returns OpenAI-shaped responses with
``tool_calls`` parsed by envhub's tool-call format, and records every call under the session id the
client sends (as its API key or the ``X-Envhub-Session`` header): the prompt's token ids, and each
choice's sampled token ids and log-probs exactly as sampled. :class:`ProxyServer` serves it over
HTTP from a thread; ``envhub proxy --model PATH`` serves it alone. An agent may play an envhub
env on the proxy (:class:`ProxyEnv`, hosted by :class:`HostedEnvs`), which then scores its session.

A session's calls that extend each other fold into one trajectory; the others become step samples,
and the breaks are counted (:func:`session_trajectory`). Either way the result is envhub's own
:class:`~envhub.trajectory.Trajectory`, which the trainer's stages take unchanged.
"""

from envhub_trl.proxy.client import ProxyEnv, ProxyEnvError
from envhub_trl.proxy.engine import ChatProxy
from envhub_trl.proxy.hosted import HostedEnvs
from envhub_trl.proxy.requests import ChatRequest, ProxyRequestError, parse_request
from envhub_trl.proxy.server import ProxyServer, create_app, session_id_of
from envhub_trl.proxy.sessions import CallRecord, Choice, Session, SessionStore, session_trajectory

__all__ = [
    "CallRecord",
    "ChatProxy",
    "ChatRequest",
    "Choice",
    "HostedEnvs",
    "ProxyEnv",
    "ProxyEnvError",
    "ProxyRequestError",
    "ProxyServer",
    "Session",
    "SessionStore",
    "create_app",
    "parse_request",
    "session_id_of",
    "session_trajectory",
]
