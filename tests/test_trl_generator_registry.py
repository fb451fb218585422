"""Generator backends as plug-ins: registered by name, with declared capabilities the trainer asks
for instead of testing classes (envhub_trl.generators.registry)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from envhub.generation import ExpertGenerator  # noqa: E402
from envhub_trl.config import EnvGRPOConfig  # noqa: E402
from envhub_trl.generators import (  # noqa: E402
    BACKENDS,
    Capabilities,
    HFGenerator,
    VLLMGenerator,
    VLLMServerGenerator,
    capabilities_of,
    make_generator,
    register_generator,
)
from trl_helpers import save_tiny_lake_model  # noqa: E402

LAKE = "frozenlake/FrozenLakeNotSlippery-v0"


def _config(tmp_path, **overrides) -> EnvGRPOConfig:
    values = dict(
        output_dir=str(tmp_path), env_id=LAKE, max_turns=2, groups_per_step=2, group_size=2, per_device_train_batch_size=4,
        max_steps=1, max_turn_tokens=8, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True, seed=3,
    )
    values.update(overrides)
    return EnvGRPOConfig(**values)


def test_the_shipped_backends_are_registered_with_their_capabilities():
    assert {"hf", "vllm", "vllm-server"} <= set(BACKENDS)
    assert HFGenerator.capabilities.weight_sync == "shared"
    assert VLLMGenerator.capabilities.weight_sync == "local"
    assert VLLMServerGenerator.capabilities.weight_sync == "server"
    assert all(g.capabilities.per_request_seeds and g.capabilities.logprobs for g in (HFGenerator, VLLMGenerator, VLLMServerGenerator))
    assert BACKENDS["vllm-server"].needs_server_url and not BACKENDS["vllm"].needs_server_url
    assert BACKENDS["vllm"].in_sync_when_built and BACKENDS["vllm-server"].from_path is None


def test_a_generator_without_declared_capabilities_is_read_from_its_methods():
    class TakesWeights:
        def load_weights(self, model):
            pass

    assert capabilities_of(TakesWeights()).weight_sync == "local"
    assert capabilities_of(ExpertGenerator()) == Capabilities(weight_sync="none", per_request_seeds=False, logprobs=True)


def test_a_backend_name_is_taken_once_and_an_unknown_one_is_named(monkeypatch):
    with pytest.raises(ValueError, match="already registered"):
        register_generator("hf")(lambda model, tokenizer, args: None)
    with pytest.raises(ValueError, match=r"generator must be one of .*'hf'.*registered backends\), got 'nope'"):
        _config("unused", generator="nope")

    def never(*args, **kwargs):
        raise AssertionError("the model was resolved (tiny built for every env) before the generator was refused")

    monkeypatch.setattr("envhub_trl.models.resolve_model", never)
    with pytest.raises(ValueError, match="cannot load a model folder; choose one of hf, vllm"):
        make_generator("vllm-server", "tiny")


@pytest.fixture
def scripted_backend():
    """A backend added by a plug-in: one registration, a scripted policy whose weights never change."""

    class Scripted(ExpertGenerator):
        capabilities = Capabilities(weight_sync="none", per_request_seeds=False, logprobs=False)
        built_with = None

        def load_weights(self, model):  # declared "none": the trainer must never call it
            raise AssertionError("a generator declaring weight_sync='none' got weights")

    @register_generator("scripted")
    def build(model, tokenizer, args, **kwargs):
        generator = Scripted(tokenizer=tokenizer)
        generator.built_with = kwargs
        return generator

    yield Scripted
    BACKENDS.pop("scripted")


def test_a_registered_backend_is_built_by_name_and_synced_by_its_capabilities(scripted_backend, tmp_path):
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = save_tiny_lake_model(tmp_path / "model")
    config = _config(tmp_path / "out", generator="scripted", generator_kwargs={"note": 1})
    trainer = EnvGRPOTrainer(AutoModelForCausalLM.from_pretrained(path), config, processing_class=tokenizer)
    generator = trainer.generator
    assert isinstance(generator, scripted_backend) and generator.built_with == {"note": 1}
    trainer.state.global_step += 1  # a new optimizer step: "none" still gets no weights
    assert trainer.generator is generator


def test_an_option_the_backend_does_not_take_is_named_and_trls_vllm_memory_field_reaches_vllm(tmp_path, monkeypatch):
    """A recipe that says vLLM's memory share in TRL's field switches to generator=hf unchanged;
    one that passes a vLLM option to hf through generator_kwargs gets a one-line error."""
    from transformers import AutoModelForCausalLM

    from envhub.error import GeneratorOptionError
    from envhub_trl.generators import vllm_engine
    from envhub_trl.trainer import EnvGRPOTrainer

    path, tokenizer = save_tiny_lake_model(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(path)
    bad = _config(tmp_path / "bad", generator="hf", generator_kwargs={"gpu_memory_utilization": 0.05})
    with pytest.raises(GeneratorOptionError, match="the hf generator takes no 'gpu_memory_utilization'.*vllm_gpu_memory_utilization"):
        EnvGRPOTrainer(model, bad, processing_class=tokenizer).generator
    assert isinstance(EnvGRPOTrainer(model, _config(tmp_path / "hf", vllm_gpu_memory_utilization=0.05), processing_class=tokenizer).generator, HFGenerator)

    built = {}
    monkeypatch.setattr(vllm_engine, "VLLMGenerator", lambda folder, **kwargs: built.update(kwargs))
    vllm_engine.build_vllm(model, tokenizer, _config(tmp_path / "vllm", vllm_gpu_memory_utilization=0.05))
    assert built["gpu_memory_utilization"] == 0.05
    vllm_engine.build_vllm(model, tokenizer, _config(tmp_path / "vllm", vllm_gpu_memory_utilization=0.05), gpu_memory_utilization=0.2)
    assert built["gpu_memory_utilization"] == 0.2  # generator_kwargs, the more specific, wins


def test_a_locally_synced_generator_gets_the_weights_once_per_step(tmp_path):
    from transformers import AutoModelForCausalLM

    from envhub_trl.trainer import EnvGRPOTrainer

    class Copying(ExpertGenerator):
        capabilities = Capabilities(weight_sync="local", per_request_seeds=False, logprobs=True)
        loads = 0

        def load_weights(self, model):
            Copying.loads += 1

    path, tokenizer = save_tiny_lake_model(tmp_path / "model")
    trainer = EnvGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(path), _config(tmp_path / "out"), processing_class=tokenizer, generator=Copying(tokenizer=tokenizer)
    )
    trainer.generator, trainer.generator
    assert Copying.loads == 1
    trainer.state.global_step += 1
    trainer.generator
    assert Copying.loads == 2


def test_envhub_eval_plays_with_a_plugins_generator_that_loads_a_folder(tmp_path):
    """`envhub eval --generator NAME` takes any registered generator with a from_path, and names
    the ones it could take (before any model loads) when NAME has none."""
    import json

    from click.testing import CliRunner

    from envhub.cli import cli as main

    loaded = []

    def from_path(path, **kwargs):
        loaded.append(path)
        return ExpertGenerator(tokenizer=AutoTokenizer.from_pretrained(path))

    from transformers import AutoTokenizer

    register_generator("folder-expert", from_path=from_path)(lambda model, tokenizer, args: None)
    try:
        path, _ = save_tiny_lake_model(tmp_path / "model")
        result = CliRunner().invoke(main, ["eval", "frozenlake/FrozenLakeNotSlippery-v0", "--model", str(path), "--generator", "folder-expert",
                                           "--episodes", "4", "--json"])
        assert result.exit_code == 0, result.output
        assert loaded == [str(path)] and json.loads(result.output.splitlines()[-1])["success_rate"] == 1.0
        result = CliRunner().invoke(main, ["eval", "frozenlake/FrozenLakeNotSlippery-v0", "--model", str(path), "--generator", "vllm-server"])
        assert result.exit_code == 2 and "'vllm-server' cannot load a model folder; choose one of folder-expert, hf, vllm" in result.output
    finally:
        BACKENDS.pop("folder-expert")
