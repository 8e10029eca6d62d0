"""A real server for API tests: the tiny world's model behind create_app, on uvicorn in a
thread on a free loopback port, with adapters published to a registry the slab loads from."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import uvicorn

from adapters.format.base_model import BaseModelSpec
from adapters.registry.names import OPERATOR
from adapters.registry.registry import Registry
from adapters.slab.slab import AdapterSlab
from serving.api import AppSettings, LocalGenerator, create_app
from serving.api.core.caller import Principal, key_id
from serving.engine.engine import Engine, EngineConfig
from serving.engine.request import GenerateRequest, SamplingParams
from serving.model.checkpoint import load_state_dict
from serving.model.hf_config import load_model_config
from serving.model.llama import LlamaModel
from serving.model.tokenizer import load_tokenizer
from tests.serving.engine.world import World, build_world

MODEL_ID = "demo"
MAX_MODEL_LEN = 96
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
ADMIN, ACME, GLOBEX = "admin-key-0123", "acme-key-4567", "globex-key-89ab"
KEYS = {
    ADMIN: Principal("ops", "admin", key_id(ADMIN)),
    ACME: Principal("acme", "user", key_id(ACME)),
    GLOBEX: Principal("globex", "user", key_id(GLOBEX)),
}


def chat_world(root: Path) -> World:
    """build_world's model and adapters, its tokenizer given a chat template."""
    world = build_world(root)
    (world.base_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    world.tokenizer = load_tokenizer(world.base_dir)
    return world


def build_engine(world: World, loader, *, embeddings: bool = False, **config) -> Engine:
    model = LlamaModel(
        load_model_config(world.base_dir), load_state_dict(world.base_dir),
        fp8=False, dtype=torch.float32,
    )  # fmt: skip
    slab = AdapterSlab(
        BaseModelSpec.from_dir(world.base_dir), num_slots=4, max_rank=16, max_cpu_loras=2,
        loader=loader, base_weight=model.served_weight,  # DoRA's norms, as a replica's slab
        embeddings=embeddings,
    )  # fmt: skip
    cfg = {"block_size": 4, "num_blocks": 256, "max_model_len": MAX_MODEL_LEN, **config}
    return Engine(model, world.tokenizer, EngineConfig(**cfg), slab=slab)


def stub_settings(world: World, root: Path, **fields) -> AppSettings:
    """Settings over world's tokenizer and an empty registry, for apps on a stub generator."""
    fields = {"keys": KEYS, "max_model_len": 64, **fields}
    return AppSettings(
        model_id=MODEL_ID,
        tokenizer=world.tokenizer,
        registry=Registry(str(root / "reg")),
        base_spec=BaseModelSpec.from_dir(world.base_dir),
        **fields,
    )


@dataclass
class Served:
    url: str
    world: World
    registry: Registry
    settings: AppSettings
    generator: LocalGenerator
    reference_engine: Engine
    _count: list[int] = field(default_factory=lambda: [0])

    def reference(self, ids: list[int], adapter: str | None, max_tokens: int) -> tuple[list, str]:
        """Greedy tokens and text of the request run alone on an engine of its own."""
        self._count[0] += 1
        version = self.world.versions[adapter] if adapter else None
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        request = GenerateRequest(f"ref{self._count[0]}", tuple(ids), params, version)
        outs = []
        self.reference_engine.submit(request, outs.append)
        self.reference_engine.run_until_idle()
        return [t for o in outs for t in o.new_token_ids], "".join(o.new_text for o in outs)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        text = self.world.tokenizer.apply_chat_template(messages)
        return self.world.tokenizer.encode(text, add_special_tokens=False)

    def text_ids(self, text: str) -> list[int]:
        return self.world.tokenizer.encode(text)


@contextmanager
def serve(
    world: World,
    root: Path,
    *,
    keys=KEYS,
    publish=("upper", "rot13", "mlp"),
    owner: str = "acme",
    max_queue: int = 64,
    max_body_bytes: int = 1 << 20,
    max_model_len: int = MAX_MODEL_LEN,
    generator_class: type[LocalGenerator] = LocalGenerator,
    tenancy=None,
    embeddings: bool = False,
    batch=None,
    speculative=None,
    **settings_fields,
) -> Iterator[Served]:
    """The world's model served over HTTP; `publish` names the world's adapters published
    for `owner` (public when owner is the reserved operator tenant); `speculative`, the
    engine's SpecConfig (None: no speculation)."""
    registry = Registry(f"file://{root / 'registry'}")
    for name in publish:
        registry.publish(name, world.adapters[world.versions[name]], owner)
        if owner == OPERATOR:
            registry.set_public(name, OPERATOR, True)

    def loader(ref):
        return registry.load(ref, verify=False)  # as a replica loads: trusting publish's checks

    engine_fields = {} if speculative is None else {"speculative": speculative}
    engine = build_engine(
        world, loader, embeddings=embeddings, max_model_len=max_model_len, **engine_fields
    )
    # As settings.served_spec: uploads are checked against what the slab serves.
    spec = BaseModelSpec.from_dir(world.base_dir)
    generator = generator_class(engine, max_queue)
    settings = AppSettings(
        model_id=MODEL_ID,
        max_model_len=engine.max_model_len,
        tokenizer=world.tokenizer,
        registry=registry,
        base_spec=spec if embeddings else spec.without_outer(),
        max_lora_rank=16,
        keys=keys,
        max_body_bytes=max_body_bytes,
        vocab_size=512,
        **settings_fields,
    )
    settings.ready.set()
    app = create_app(generator, settings, tenancy, batch)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    reference = build_engine(world, world.adapters.__getitem__, embeddings=True,
                             max_model_len=max_model_len)  # fmt: skip
    try:
        yield Served(f"http://127.0.0.1:{port}", world, registry, settings, generator, reference)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        generator.close()
        sock.close()
