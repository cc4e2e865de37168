"""Defaults typed once, in the library: ``qkv serve``'s flags leave ServeConfig's fields as the
dataclass has them and ``--help`` shows those; ``--batch-tokens`` shows and uses Decoding's
budget. A help text is read from the library only when it is shown."""

from __future__ import annotations

import dataclasses
import re

import pytest

from qkv.cli import build_parser
from qkv.cli._common import DeferredHelp, with_default
from qkv.cli.serve import serve_config
from qkv.inference import Decoding
from qkv.serve.config import ServeConfig


def _helps(command: str) -> dict[str, str]:
    """``qkv COMMAND``'s flags -> their help as ``--help`` shows it."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return {a.option_strings[0]: a.help % {} for a in sub._actions if a.option_strings}


def _shown_default(help_text: str) -> str:
    m = re.search(r"\(default: ([^)]*)\)$", help_text)
    assert m, help_text
    return m.group(1)


def test_serve_flags_leave_every_field_at_its_default():
    args = build_parser().parse_args(["serve", "--model-dir", "m"])
    cfg = serve_config(args, api_key=None)
    assert cfg == ServeConfig(model_dir="m")


def test_serve_limits_show_the_fields_defaults():
    helps = _helps("serve")
    defaults = {f.name: f.default for f in dataclasses.fields(ServeConfig)}
    limits = {name for name in defaults if name.startswith("max_")} - {"max_attention_cells"}
    assert limits, defaults
    for name in limits:
        flag = "--" + name.replace("_", "-")
        value = defaults[name]
        assert _shown_default(helps[flag]) == (
            f"{value:g}" if isinstance(value, float) else str(value)
        )


def test_serve_flags_set_the_field_of_their_name():
    argv = ["serve", "--model-dir", "m", "--max-chars", "7", "--max-wait-ms", "2.5"]
    argv += ["--beam", "2", "--source-lang", "de", "--max-attention-cells", "99"]
    cfg = serve_config(build_parser().parse_args(argv), api_key="k")
    assert (cfg.max_chars, cfg.max_wait_ms, cfg.beam, cfg.source_lang) == (7, 2.5, 2, "de")
    assert (cfg.max_attention_cells, cfg.api_key, cfg.model_dir) == (99, "k", "m")
    assert cfg.max_queue == ServeConfig().max_queue


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_batch_tokens_is_decodings_budget(command):
    assert _shown_default(_helps(command)["--batch-tokens"]) == str(Decoding().max_tokens)


def test_batch_tokens_not_given_is_decodings_budget_not_the_models():
    """Not given, ``--batch-tokens`` is Decoding's default even where the model's decoding
    says otherwise (as the help says)."""
    from qkv.cli._common import with_decoding_flags

    class Engine:
        decoding = Decoding(max_tokens=64)

        def with_decoding(self, **given):
            return self.decoding.replace(**given)

    args = build_parser().parse_args(["translate", "--model-dir", "m"])
    assert with_decoding_flags(Engine(), args).max_tokens == Decoding().max_tokens
    args = build_parser().parse_args(["translate", "--model-dir", "m", "--batch-tokens", "9"])
    assert with_decoding_flags(Engine(), args).max_tokens == 9


def test_a_deferred_help_is_read_when_shown_and_keeps_percent_signs():
    calls = []

    def text() -> str:
        calls.append(1)
        return "10% of the run"

    help_text = DeferredHelp(text)
    assert calls == []
    assert help_text % {} == "10% of the run" and str(help_text) == "10%% of the run"
    assert "%" in help_text and help_text.strip() == "10%% of the run"
    assert with_default("wait", lambda: 5.0) % {} == "wait (default: 5)"
    assert with_default("budget", lambda: 4096) % {} == "budget (default: 4096)"


def test_train_help_still_shows_the_config_defaults():
    from qkv.train import TrainConfig

    assert _shown_default(_helps("train")["--seed"]) == str(TrainConfig().seed)
