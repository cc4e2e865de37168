"""TrainConfig: defaults < file < flags < --set; errors that name the key; resume rules."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from qkv._errors import SettingError
from qkv.cli import build_parser
from qkv.cli.train import train_config as _train_config
from qkv.train import (
    InverseSqrtSchedule,
    TrainConfig,
    inverse_sqrt_lr,
    load_config_file,
    parse_assignment,
    required_modules,
    sequence_loss,
)


def _args(*argv):
    return build_parser().parse_args(["train", *argv])


def test_file_then_flags_then_set(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        'max_steps = 300\nlr = 1\nseed = 4\n[model]\nkind = "bahdanau"\nnum_hiddens = 48\n'
        "embed_size = 16\n"
    )
    config, resume = _train_config(
        _args(
            "--config",
            str(cfg),
            "--max-steps",
            "7",
            "--set",
            "model.embed_size=24",
            "--out",
            str(tmp_path / "o"),
        )
    )
    assert not resume
    assert config.max_steps == 7  # the flag beats the file
    assert config.seed == 4 and config.lr == 1.0 and isinstance(config.lr, float)
    assert config.model == "bahdanau"
    assert config.model_options == {"num_hiddens": 48, "embed_size": 24}
    assert config.model_config(10, 12).embed_size == 24


def test_yaml_file(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("max_tokens: 2048\nbf16: true\nmodel:\n  num_heads: 2\nbetas: [0.9, 0.99]\n")
    config, _ = _train_config(_args("--config", str(cfg), "--out", str(tmp_path / "o")))
    assert config.max_tokens == 2048 and config.bf16 is True
    assert config.model_options == {"num_heads": 2} and config.betas == (0.9, 0.99)
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_flags_without_file_keep_defaults(tmp_path):
    config, _ = _train_config(_args("--model", "bahdanau", "--bf16", "--out", str(tmp_path)))
    assert config.model == "bahdanau" and config.bf16
    assert config.max_steps == TrainConfig().max_steps


def test_bf16_is_automatic_unless_a_flag_says(tmp_path):
    """No flag: None (the speed probe decides); --bf16 on, --no-bf16 off, --set either way or
    back to automatic; a flag beats the file; anything but true, false or None is refused,
    naming the setting."""
    assert _train_config(_args("--out", "o"))[0].bf16 is None and TrainConfig().bf16 is None
    assert _train_config(_args("--bf16", "--out", "o"))[0].bf16 is True
    assert _train_config(_args("--no-bf16", "--out", "o"))[0].bf16 is False
    assert _train_config(_args("--set", "bf16=false", "--out", "o"))[0].bf16 is False
    assert _train_config(_args("--bf16", "--set", "bf16=null", "--out", "o"))[0].bf16 is None
    cfg = tmp_path / "run.toml"
    cfg.write_text("bf16 = true\n")
    assert _train_config(_args("--config", str(cfg), "--out", "o"))[0].bf16 is True
    assert _train_config(_args("--config", str(cfg), "--no-bf16", "--out", "o"))[0].bf16 is False
    with pytest.raises(SettingError, match="bf16: expected true, false or None"):
        TrainConfig(bf16="yes")


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"max_stepz": 3}, "unknown key 'max_stepz'"),
        ({"max_steps": 0}, "max_steps: expected an int >= 1"),
        ({"lr": -1.0}, "lr: expected a positive"),
        ({"model": "gpt"}, "model: expected one of"),
        ({"model.num_layers": 2}, "model_options: unknown model keys"),
        ({"model.num_heads": 3}, "num_hiddens: expected a multiple of num_heads"),
        ({"label_smoothing": 1.5}, "label_smoothing"),
        ({"valid": 1.5}, "valid: expected a fraction"),
    ],
)
def test_bad_settings_name_the_key(changes, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig().updated(changes)


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("max_steps = = 3")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config_file(bad)
    with pytest.raises(ValueError, match=r"\.toml, \.yaml or \.yml"):
        (tmp_path / "x.ini").write_text("")
        load_config_file(tmp_path / "x.ini")
    with pytest.raises(FileNotFoundError, match="--config"):
        load_config_file(tmp_path / "missing.yaml")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="table of settings"):
        load_config_file(lst)


def test_parse_assignment():
    assert parse_assignment("lr=3e-4") == ("lr", 3e-4)
    assert parse_assignment("bf16=true") == ("bf16", True)
    assert parse_assignment("data=some file.tsv") == ("data", "some file.tsv")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_assignment("lr")


def test_cli_reports_bad_settings(tmp_path, capsys):
    from qkv.cli import main

    assert main(["train", "--out", str(tmp_path), "--set", "max_steps=-2"]) == 2
    err = capsys.readouterr().err
    assert "qkv train: error: max_steps: expected an int >= 1" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("minutes", ["inf", "1e400"])
def test_a_time_budget_must_be_finite(tmp_path, capsys, minutes):
    from qkv.cli import main

    data = tmp_path / "pairs.tsv"
    data.write_text("go .\tva !\n")
    argv = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--max-minutes", minutes]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv train: error: --max-minutes: expected a positive finite number")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- schedule and loss
def test_inverse_sqrt_schedule():
    assert inverse_sqrt_lr(1, peak_lr=1.0, warmup_steps=4) == 0.25
    assert inverse_sqrt_lr(4, peak_lr=1.0, warmup_steps=4) == 1.0
    assert math.isclose(inverse_sqrt_lr(16, peak_lr=1.0, warmup_steps=4), 0.5)
    assert math.isclose(inverse_sqrt_lr(9, peak_lr=2.0, warmup_steps=0), 2.0 / 3.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    sched = InverseSqrtSchedule(opt, peak_lr=1.0, warmup_steps=2)
    assert [sched.step() for _ in range(3)] == [0.5, 1.0, math.sqrt(2 / 3)]
    assert opt.param_groups[0]["lr"] == math.sqrt(2 / 3)
    with pytest.raises(ValueError, match="step"):
        inverse_sqrt_lr(0, peak_lr=1.0, warmup_steps=2)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_sequence_loss_matches_cross_entropy(eps):
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0
    target[2, 1:] = 0
    loss, nll, n = sequence_loss(logits, target, label_smoothing=eps)
    ref = F.cross_entropy(
        logits.reshape(-1, 11),
        target.reshape(-1),
        ignore_index=0,
        label_smoothing=eps,
        reduction="sum",
    )
    plain = F.cross_entropy(
        logits.reshape(-1, 11), target.reshape(-1), ignore_index=0, reduction="sum"
    )
    assert n == int((target != 0).sum())
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(nll.double(), plain, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="target"):
        sequence_loss(logits, target[:, :2])


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.35])
def test_sequence_loss_gradient_is_the_formulas(eps):
    # d loss / d logits = keep * (softmax - (1 - eps) onehot - eps / V), checked numerically
    logits = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 7, (2, 5))
    target[1, 3:] = 0
    torch.autograd.gradcheck(lambda x: sequence_loss(x, target, label_smoothing=eps)[0], (logits,))
    loss, nll, _ = sequence_loss(logits, target, label_smoothing=eps)
    assert loss.dtype == torch.float64 and not nll.requires_grad
    (3.0 * loss).backward()
    p = logits.detach().softmax(-1)
    onehot = F.one_hot(target, 7).double()
    expected = 3.0 * (target != 0).unsqueeze(-1) * (p - (1 - eps) * onehot - eps / 7)
    torch.testing.assert_close(logits.grad, expected)


def _vocabulary_sized_results(fn, numel: int) -> int:
    """How many (B, Lt, V)-sized tensors the aten operators run by ``fn`` make anew (not in
    place, not views)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    made = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # in place (mul_) or a view (view, detach): no new memory
            if all(r.alias_info is None for r in func._schema.returns):
                made.extend(t for t in torch.utils._pytree.tree_leaves(out)
                            if isinstance(t, torch.Tensor) and t.numel() >= numel)  # fmt: skip
            return out

    with Count():
        fn()
    return len(made)


def test_sequence_loss_backward_makes_one_vocabulary_sized_tensor():
    # the memory a 32k vocabulary costs: autograd's composition of the same loss (log-softmax,
    # gather, mean, where) makes a gradient for the log-probabilities, one for the gather, one for
    # the mean, then the logits'; the loss's own backward makes the logits' gradient only
    logits = torch.randn(3, 4, 50, requires_grad=True)
    target = torch.randint(1, 50, (3, 4))
    loss, _, _ = sequence_loss(logits, target, label_smoothing=0.1)
    assert _vocabulary_sized_results(loss.backward, logits.numel()) == 1
    assert logits.grad.dtype == logits.dtype and torch.isfinite(logits.grad).all()
    half = logits.detach().bfloat16().requires_grad_()
    sequence_loss(half, target)[0].backward()
    assert half.grad.dtype == torch.bfloat16


def test_yaml_numbers_written_without_a_dot(tmp_path):
    # PyYAML reads 1e-3 (no dot) as a string; a config file means the number
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "lr: 1e-3\nadam_eps: 1E-9\nmax_minutes: 5e1\nvalid: '40'\nmax_steps: '300'\n"
        "betas: [0.9, 98e-2]\nmodel:\n  dropout: 1e-1\n  num_heads: '2'\n"
    )
    config, _ = _train_config(_args("--config", str(cfg), "--out", str(tmp_path / "o")))
    assert config.lr == 1e-3 and isinstance(config.lr, float)
    assert config.adam_eps == 1e-9 and config.max_minutes == 50.0
    assert config.valid == 40 and config.max_steps == 300 and config.betas == (0.9, 0.98)
    assert config.model_options == {"dropout": 0.1, "num_heads": 2}
    cfg.write_text("lr: fast\n")
    with pytest.raises(
        ValueError, match="lr: expected a positive finite number, or None \\(auto\\), got 'fast'"
    ):
        _train_config(_args("--config", str(cfg), "--out", str(tmp_path / "o")))
    cfg.write_text("max_steps: 1e3\n")  # not an int
    with pytest.raises(ValueError, match="max_steps"):
        _train_config(_args("--config", str(cfg), "--out", str(tmp_path / "o")))


# ---------------------------------------------------------------- the CLI shows these defaults
def _train_flag_helps() -> dict[str, str]:
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    train = sub.choices["train"]
    return {a.option_strings[0]: a.help % {} for a in train._actions if a.option_strings}


def test_every_train_flag_shows_the_config_default():
    import dataclasses
    import re

    from qkv.cli.train import TRAIN_FLAGS as _TRAIN_FLAGS

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    helps = _train_flag_helps()
    for flag, (key, typ, _) in _TRAIN_FLAGS.items():
        assert key in defaults, f"{flag}: {key} is not a TrainConfig field"
        m = re.search(r"\(default: (.*)\)$", helps[flag])
        assert m, f"{flag}: no default in {helps[flag]!r}"
        shown, default = m.group(1), defaults[key]
        if default is None:  # what "not set" means, never a number that could drift
            assert not re.fullmatch(r"[\d.]+", shown), (flag, shown)
        elif default == "auto":
            assert shown.startswith("auto: "), (flag, shown)
        else:
            assert typ(shown) == default, f"{flag}: --help says {shown}, TrainConfig {default!r}"


def test_model_choices_are_the_model_kinds():
    from qkv.cli.train import MODEL_KINDS as _MODEL_KINDS
    from qkv.nn.seq2seq import MODEL_KINDS

    assert _MODEL_KINDS == MODEL_KINDS


def test_list_is_an_option_of_demo_only(capsys):
    from qkv.cli import main

    assert main(["demo", "--list"]) == 0
    assert "translate" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["translate", "--model-dir", "x", "--list"])
    assert info.value.code == 2 and "--list" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("changes", "modules"),
    [
        ({}, ["safetensors", "sacrebleu"]),  # the bundled corpus: its word tokenizer
        ({"data": "pairs.tsv"}, ["safetensors", "sacrebleu", "sentencepiece"]),  # auto: subwords
        ({"data": "pairs.tsv", "tokenizer": "word"}, ["safetensors", "sacrebleu"]),
        ({"tokenizer": "sentencepiece"}, ["safetensors", "sacrebleu", "sentencepiece"]),
        ({"tensorboard": True}, ["safetensors", "sacrebleu", "tensorboard"]),
    ],
)
def test_required_modules_are_what_a_run_of_the_config_imports(changes, modules):
    assert required_modules(TrainConfig().updated(changes)) == modules


def test_max_len_is_the_pair_limits_old_name():
    """A config file, ``--set`` or an older run's train.json may say ``max_len``: it sets
    ``max_pair_len`` (``max_len`` names a model's position table, ``model.max_len``)."""
    assert TrainConfig.from_dict({"max_len": 40}).max_pair_len == 40
    assert TrainConfig().updated({"max_len": 33}).max_pair_len == 33
    assert TrainConfig().updated({"model.max_len": 300}).model_options["max_len"] == 300
    assert "max_len" not in TrainConfig().to_dict()
    with pytest.raises(ValueError, match="max_pair_len"):
        TrainConfig().updated({"max_len": 1})
