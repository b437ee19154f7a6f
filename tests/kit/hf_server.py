"""A real OpenAI-compatible server for the serving tests: ``transformers serve`` on the CPU, with a tiny random
Llama built on the spot (no download): a few-layer ``LlamaConfig`` saved with ``save_pretrained``, a
byte-level BPE tokenizer trained here with ``tokenizers``, and a chat template.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.kit.ports import free_port

STARTUP_S = 120.0
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
BUILD = """
import sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, template = sys.argv[1], sys.argv[2]
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=320, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
)
tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog, and meshtop measures it"] * 50, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
fast.chat_template = template
fast.save_pretrained(out)
torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=0, eos_token_id=1,
)
LlamaForCausalLM(config).save_pretrained(out)
"""


def serving_available() -> bool:
    """Whether ``transformers serve`` can run here (the ``serving`` test extra)."""
    try:
        import fastapi  # noqa: F401
        import transformers  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return False
    return True


needs_serving = pytest.mark.skipif(
    not serving_available(), reason="transformers[serving] is not installed (pip install -e '.[test]')"
)


def build_tiny_model(directory: Path) -> Path:
    """A tiny random Llama and its tokenizer saved into ``directory`` (a few seconds)."""
    subprocess.run([sys.executable, "-c", BUILD, str(directory), CHAT_TEMPLATE], check=True, capture_output=True)
    return directory


class Server:
    """``transformers serve MODEL`` on a free port, continuous batching on, its log in ``log``."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = str(model)
        self.log = log
        command = [
            sys.executable,
            "-c",
            "from transformers.cli.transformers import main; main()",
            "serve",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--device",
            "cpu",
            "--continuous-batching",
        ]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # one torch thread: the server leaves a core to the load generator and meshtop on 2 cores, so
                # the timings the tests check are the client's, not a CPU fight's
                # offline: the model is local, and the CLI's check for a newer release on PyPI is skipped
                env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"},
            )
        self._wait_ready()
        self._warm()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"transformers serve exited {self.process.returncode}: {self.log.read_text()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                if response.status == 200:
                    return
            time.sleep(0.25)
        self.stop()
        raise AssertionError(f"transformers serve not up in {STARTUP_S:.0f} s: {self.log.read_text()[-2000:]}")

    def _warm(self) -> None:
        """One completion of a token: the server starts its continuous-batching loop at its first request,
        which took past meshtop's 30 s probe on a loaded 2-core machine (CI rehearsal), so the first test's
        probe timed out; the tests measure the client and meshtop, not that start."""
        body = json.dumps({"model": self.model, "prompt": "warm", "max_tokens": 1}).encode()
        request = urllib.request.Request(
            f"{self.url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=STARTUP_S) as response:
                response.read()
        except OSError as error:
            self.stop()
            raise AssertionError(
                f"transformers serve's first completion failed ({error}): {self.log.read_text()[-2000:]}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the server and its children at once (a crash)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[Server]:
    """A tiny model built in ``directory`` and served until the block ends."""
    model = build_tiny_model(directory / "tiny-llama")
    server = Server(model, directory / "server.log")
    try:
        yield server
    finally:
        server.stop()
