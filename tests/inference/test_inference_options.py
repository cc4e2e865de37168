"""qkv.inference.Decoding: one frozen value for every decoding option, checked once."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from qkv._errors import SettingError
from qkv.inference import CANDIDATES, Decoding, default_max_len, default_output_len


@pytest.mark.parametrize(
    "options, key, got",
    [
        ({"beam_size": 0}, "beam_size", "got 0"),
        ({"beam_size": True}, "beam_size", "got True"),
        ({"beam_size": 2.0}, "beam_size", "got 2.0"),
        ({"n_best": 0}, "n_best", "got 0"),
        ({"beam_size": 2, "n_best": 3}, "n_best", "at most beam_size (2), got 3"),
        ({"length_penalty": float("nan")}, "length_penalty", "got nan"),
        ({"length_penalty": "1"}, "length_penalty", "got '1'"),
        ({"no_repeat_ngram": -1}, "no_repeat_ngram", "got -1"),
        ({"max_output_len": 0}, "max_output_len", "got 0"),
        ({"output_len_cap": -3}, "output_len_cap", "got -3"),
        ({"max_tokens": 0}, "max_tokens", "got 0"),
        ({"chosen_on": 3}, "chosen_on", "got 3"),
        ({"early_stopping": 1}, "early_stopping", "got 1"),
        ({"early_stopping": "always"}, "early_stopping", "got 'always'"),
        ({"forced_eos": 1}, "forced_eos", "got 1"),
        ({"renormalize": "yes"}, "renormalize", "got 'yes'"),
        ({"suppress": 3}, "suppress", "got 3"),
        ({"suppress": [2, -1]}, "suppress", "got -1"),
    ],
)
def test_every_option_is_checked_and_named(options, key, got):
    with pytest.raises(SettingError, match=rf"^{key}: expected .*{re.escape(got)}") as err:
        Decoding(**options)
    assert err.value.key == key and isinstance(err.value, ValueError)


def test_the_value_is_frozen_and_replace_returns_a_new_one():
    d = Decoding(beam_size=4, length_penalty=0.6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.beam_size = 2  # type: ignore[misc]
    e = d.replace(length_penalty=1)
    assert (d.length_penalty, e.length_penalty, e.beam_size) == (0.6, 1.0, 4)
    assert isinstance(e.length_penalty, float)
    assert d.replace() is d and d.replace(beam_size=None, n_best=None) is d  # None keeps
    with pytest.raises(SettingError, match=r"^beam_size"):
        d.replace(beam_size=0)


def test_n_best_widens_the_beam_only_when_no_beam_is_given():
    assert Decoding().replace(n_best=3).beam_size == 3
    assert Decoding(beam_size=5).replace(n_best=3).beam_size == 5
    with pytest.raises(SettingError, match="n_best: expected at most beam_size"):
        Decoding().replace(beam_size=2, n_best=3)


def test_an_unknown_option_is_refused_and_max_len_says_what_it_became():
    with pytest.raises(TypeError, match="beam: not a decoding option"):
        Decoding().replace(beam=3)
    with pytest.raises(TypeError, match=r"max_len: .*the decode length is max_output_len"):
        Decoding().replace(max_len=7)
    with pytest.raises(TypeError, match="decoding: expected a qkv Decoding"):
        Decoding().resolve({"beam_size": 2})  # type: ignore[arg-type]


def test_resolve_starts_from_a_whole_value_then_the_keywords():
    default = Decoding(beam_size=4, no_repeat_ngram=3)
    assert default.resolve() is default
    assert default.resolve(Decoding(beam_size=2)) == Decoding(beam_size=2)
    assert default.resolve(Decoding(beam_size=2), n_best=2) == Decoding(beam_size=2, n_best=2)
    assert default.resolve(length_penalty=0.5).no_repeat_ngram == 3


@pytest.mark.parametrize("n", [1, 2, 7, 31])
def test_the_decode_length_rule(n):
    assert Decoding().output_limit(n) == default_output_len(n) == 2 * n + 10
    assert default_max_len is default_output_len  # the old name, kept
    assert Decoding(output_len_cap=12).output_limit(n) == min(2 * n + 10, 12)
    assert Decoding(max_output_len=5, output_len_cap=3).output_limit(n) == 5  # fixed wins
    assert Decoding(max_output_len=50).output_limit(n, positions=16) == 16  # the table wins
    assert Decoding().output_limit(n, positions=16) == min(2 * n + 10, 16)


def test_decoding_json_round_trip_keeps_every_option():
    d = Decoding(beam_size=4, length_penalty=0.6, no_repeat_ngram=3, chosen_on="10 sentences")
    data = json.loads(json.dumps(d.to_dict()))
    assert data == {
        "beam_size": 4,
        "length_penalty": 0.6,
        "no_repeat_ngram": 3,
        "chosen_on": "10 sentences",
    }
    assert Decoding.from_dict(data) == d
    odd = Decoding(beam_size=2, n_best=2, max_output_len=9, max_tokens=100, output_len_cap=4)
    assert Decoding.from_dict(json.loads(json.dumps(odd.to_dict()))) == odd
    hf = Decoding(beam_size=4, early_stopping="never", forced_eos=True, renormalize=True,
                  suppress=(7, 1))  # fmt: skip
    data = json.loads(json.dumps(hf.to_dict()))
    assert data["suppress"] == [1, 7] and data["early_stopping"] == "never"
    assert Decoding.from_dict(data) == hf and hash(Decoding.from_dict(data)) == hash(hf)
    assert Decoding.from_dict(None) == Decoding() == Decoding.coerce(None)
    assert Decoding.from_dict({"beam_size": 3}) == Decoding(beam_size=3)  # an older file


def test_a_bad_decoding_json_is_named():
    with pytest.raises(TypeError, match="decoding: expected a dict, got list"):
        Decoding.from_dict([1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="width: not a decoding option"):
        Decoding.from_dict({"width": 3})
    with pytest.raises(SettingError, match="beam_size: expected an int >= 1, got -1"):
        Decoding.from_dict({"beam_size": -1})


def test_search_options_and_what_a_greedy_engine_must_refuse():
    d = Decoding(beam_size=3, n_best=2, no_repeat_ngram=2, length_penalty=0.5)
    assert d.search_options() == {
        "beam_size": 3,
        "length_penalty": 0.5,
        "n_best": 2,
        "no_repeat_ngram": 2,
        "early_stopping": True,
        "forced_eos": False,
        "renormalize": False,
        "suppress": (),
    }
    assert d.beyond_greedy() == {"beam_size": 3, "n_best": 2, "no_repeat_ngram": 2}
    assert Decoding(length_penalty=0.2, max_output_len=4).beyond_greedy() == {}
    hf = Decoding(early_stopping=False, renormalize=True, forced_eos=True, suppress=[5, 3])
    assert hf.beyond_greedy() == {"forced_eos": True, "suppress": (3, 5)}
    assert Decoding().greedy and not Decoding(beam_size=2).greedy


def test_describe_and_the_candidates_a_run_tries():
    assert Decoding().describe() == "greedy"
    assert Decoding(beam_size=4, length_penalty=0.6, no_repeat_ngram=3).describe() == (
        "beam 4, length penalty 0.6, no 3-gram repeated"
    )
    assert [(c.beam_size, c.length_penalty) for c in CANDIDATES] == [(1, 1.0), (4, 0.6), (4, 1.0)]
    assert {c.no_repeat_ngram for c in CANDIDATES} == {3}


def test_setting_error_renamed_keeps_its_key():
    err = SettingError("max_output_len", "expected an int >= 1, got 0").renamed("--max-len")
    assert str(err) == "--max-len: expected an int >= 1, got 0" and err.key == "max_output_len"
