"""A minimal environment: repeat the word you are shown."""

from envhub import DiscreteTextEnv


class EchoEnv(DiscreteTextEnv):
    instructions = "Say the word you are shown."
    action_names = ("ping", "pong")

    def _reset(self, options):
        self.word = self.action_names[int(self.np_random.integers(2))]
        self.done = False
        return self.word, {}

    def _step(self, action):
        self.done = action == self.word
        return self.word, float(self.done), self.done, {}

    def state_key(self):
        return f"{self.word}:{self.done}"

    def is_success(self):
        return self.done

    def render_text(self):
        return self.word


class ImpostorEnv(EchoEnv):
    """What an impostor would build."""
