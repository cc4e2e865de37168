"""Shared fixtures; the float64 reference lives in tests/_reference.py.

* every test starts from one torch seed;
* every test runs tiny models on one intra-op thread (faster for them, far faster on a busy
  machine, where a second OpenMP thread spins waiting for a core: a tiny training run measured
  2.5k tokens/s on 2 threads and 13.8k on 1 beside two busy processes), set for each test and
  given back after it (a setting left behind would change the float sums of every later
  test), but for the tests of thread choices themselves (:data:`OWN_THREADS`); the processes
  tests start get ``OMP_NUM_THREADS=1`` from their environment unless a test sets it;
* ``corpus_file`` and ``trained`` (tiny runs of ``qkv train``, one per model kind) serve every
  folder that tests a trained model: the train, cli and serve tests. Every test that uses
  ``trained`` (directly or through another fixture) is marked ``slow``: the models are trained
  once per test run, so ``pytest -m "not slow"`` leaves them out; so are the tests named in
  :data:`SLOW_TESTS`, which train for many seconds themselves;
* a model exported to ONNX is traced once per run, whichever test and worker exports it first
  (tests/_onnx_cache.py); every later export of the same weights copies its two graphs.
"""

from __future__ import annotations

import os

# the processes tests start (a command, a notebook's kernel, a server) run on one thread too,
# unless the test gives their environment another choice; set before torch loads (OpenMP reads
# it then), so that one pytest process (PYTEST_WORKERS=0) runs as each xdist worker does, whose
# environment has it from the start (else tests that run transformers' generate, set to one
# torch thread, used two CPUs: twice the CPU time for the same wall time, and beside another
# such process 20 times the wall time)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path

import pytest
import torch
from _train_helpers import TINY, tiny_config

from qkv.data import bundled_pairs, write_pairs

HERE = Path(__file__).parent
#: test files that choose or check torch's threads themselves: they keep the process's
OWN_THREADS = frozenset(
    {"test_runtime.py", "cli/test_cli_openmp.py", "bench/test_bench_threads.py"}
)
#: fixtures that train models for the run: a test needing one is slow
TRAINING_FIXTURES = frozenset(
    {
        "trained",
        "marian_trained",
        "trained_runs",  # export/test_export_huggingface.py: two SentencePiece runs
        "trained_exports",  # export/test_export_published.py: a run exported to every format
        "quick_demo",  # demos/test_demos_translate.py: `qkv demo --quick`
    }
)
#: tests marked slow by name, per file (relative to tests/; a name no longer in its file is an
#: error), so that `make test-quick` (-m "not slow") stays a quick loop while `make test` runs
#: them all: each takes 2.5 s or more on a busy 2-core machine (`pytest -m "not slow"
#: --durations=0`), because it
#: * trains for many seconds by design (a budget in minutes, a run killed and resumed, the demo);
#: * starts `qkv` (or Python with torch) in subprocesses: commands, servers, thread choices;
#: * exports with torch.export or ONNX, or runs gradcheck;
#: * executes notebooks in a kernel, or draws every demo's figures.
SLOW_TESTS = {
    # trains for many seconds by design
    "train/test_train_resume.py": {
        "test_killed_and_resumed_run_matches_an_uninterrupted_one",
        "test_logged_losses_after_a_kill_between_progress_lines",
    },
    "train/test_train_auto.py": {
        "test_a_timed_run_plans_its_length_and_decays_within_the_budget",
        "test_a_timed_run_resumed_keeps_its_budget_and_its_final_model",
        "test_final_model_carries_the_decoding_chosen_on_validation",
    },
    "train/test_train_data.py": {
        "test_data_that_changed_under_a_run_names_the_file_and_the_way_out",
        "test_a_run_trains_on_named_jsonl_fields",
    },
    "train/test_train_init_from.py": {
        "test_a_run_from_another_starts_at_update_0_with_its_validation_loss"
    },
    "train/test_train_loop.py": {"test_threads_are_the_runs_own"},
    "train/test_train_prepared.py": {
        "test_a_run_on_prepared_data_killed_mid_epoch_resumes_exactly",
        "test_a_run_that_prepares_says_so_in_one_line",
        "test_a_setting_the_corpus_was_not_made_with_is_named",
        "test_cleaning_drops_copies_long_ratios_and_duplicates_of_the_training_pairs",
        "test_a_changed_source_file_is_named",
        "test_workers_fork_only_a_process_of_one_thread",
        "test_a_second_prepare_is_a_no_op_and_other_settings_prepare_again",
        "test_a_run_on_a_large_file_prepares_it_and_trains_on_the_same_batches",
        "test_which_data_files_a_run_prepares_into_its_folder",
        "test_evaluate_scores_the_held_out_parts_of_a_prepared_run",
        "test_prepared_data_gives_the_batches_of_the_file",
        "test_a_killed_prepare_continues_where_it_stopped",
        "test_a_prepare_killed_while_reading_reads_again_and_gives_the_same_folder",
        "test_a_linked_tokenizers_folder_is_replaced_by_a_new_prepare_and_its_target_kept",
        "test_a_prepares_workers_do_not_run_the_runs_signal_handlers",
    },
    "train/test_train_subwords.py": {
        "test_the_cli_names_the_flags",
        "test_sampling_changes_training_and_never_validation",
        "test_sampling_is_refused_on_a_prepared_corpus",
        "test_a_run_trains_with_one_model_per_side",
        "test_a_run_trains_with_the_users_joint_model",
        "test_a_run_whose_sampling_lengthens_the_sentences_says_so_before_its_schedule",
    },
    "decoding/test_decoding_search.py": {
        "test_beam_finds_at_least_the_greedy_score_without_length_penalty"
    },
    "bench/test_bench_scale.py": {"test_ddp_floor_trains_the_run_model_on_random_batches"},
    # commands, servers and thread choices in subprocesses
    "cli/test_cli_openmp.py": {
        "test_the_choice_reaches_torch_and_is_logged",
        "test_the_users_wait_policy_reaches_torch_and_none_is_imposed",
        "test_importing_qkv_changes_nothing_and_loads_torch_on_first_use",
        "test_a_thread_count_torch_caps_is_reported_as_torch_runs_it",
        "test_an_invalid_omp_num_threads_is_warned_about_in_one_line",
    },
    "cli/test_cli_prepare.py": {
        "test_prepare_prints_the_folder_and_a_second_run_does_nothing",
        "test_bad_input_is_one_line_naming_the_flag",
        "test_a_mostly_unreadable_file_is_refused_as_a_run_refuses_it",
    },
    "train/test_train_languages.py": {
        "test_cli_aligned_files_valid_and_pair",
        "test_a_japanese_target_without_mecab_is_one_line_before_training",
    },
    "train/test_train_lock.py": {
        "test_a_second_trainer_is_refused_naming_the_holder",
        "test_the_cli_refuses_a_second_trainer_in_one_line",
    },
    "train/test_train_logging.py": {"test_an_application_without_logging_sees_warnings_only"},
    "train/test_train_verdict.py": {
        "test_cli_exit_status_says_the_model_learned_nothing",
        "test_a_good_tiny_run_says_it_learned",
    },
    "serve/test_serve_cli.py": {
        "test_a_signal_finishes_the_requests_in_flight_then_exits_0",
        "test_the_shutdown_timeout_answers_503_and_exits_1",
    },
    "serve/test_serve_pairs.py": {
        "test_qkv_serve_models_dir_serves_every_pair",
        "test_the_memory_cap_unloads_the_least_recently_used_and_reloads",
    },
    "test_deps.py": {
        "test_train_without_the_extra_fails_before_training",
        "test_a_demo_without_the_extra_in_a_base_install",
    },
    "data/test_data_readers_encodings.py": {
        "test_large_files_are_streamed_not_loaded_whole",
        "test_large_csv_is_streamed",
    },
    "functional/test_functional_memory_guard.py": {
        "test_a_real_ulimit_v_turns_an_allocation_into_a_clear_error"
    },
    # torch.export, ONNX, gradcheck, transformers' generate on an export
    "export/test_export_huggingface.py": {
        "test_transformers_generates_qkvs_tokens",
        "test_the_cli_writes_a_hub_ready_folder",
    },
    "export/test_export_onnx.py": {
        "test_torch_export_of_a_transformer_encoder_equals_eager",
        "test_torch_export_of_the_step_takes_any_past_length_from_0",
        "test_torch_export_of_multihead_attention_equals_eager",
        "test_torch_export_of_vit_attention_equals_eager",
    },
    "nn/test_nn_window_export.py": {"test_onnx_export_of_multihead_attention_runs_in_onnxruntime"},
    "functional/test_functional_chunked.py": {"test_bfloat16_gradients_accumulate_in_float32"},
    "functional/test_functional_chunked_dropout.py": {"test_gradcheck_with_dropout"},
    # notebooks in a kernel, every demo's figures
    "notebooks/test_notebooks.py": {"test_notebook_runs"},
    "viz/test_viz_demos.py": {"test_demo_writes_its_figures"},
    "demos/test_demos_seeds.py": {
        "test_one_head_cannot_fetch_two_neighbours_two_can",
        "test_vit_squares_and_maps",
    },
    # a run trained for one message, a process started, and figures, samples and documents
    # at full size (a 500-token map, sampling statistics, random Word files)
    "viz/test_viz_heatmaps.py": {
        "test_plot_attention_size_is_bounded_at_500_tokens",
    },
    "train/test_train_languages_known.py": {
        "test_a_vocabulary_the_user_gave_too_small_is_one_line_naming_the_setting",
    },
    "data/test_data_subwords.py": {
        "test_unigram_sampling_draws_kudos_distribution",
    },
    "notebooks/test_notebooks_progress.py": {
        "test_the_terminal_output_is_unchanged_outside_a_notebook",
    },
    "text/test_text_office.py": {
        "test_random_word_files_keep_every_run_and_its_formatting",
    },
}

#: the files that take longest (seconds of a 2-core machine's `pytest --durations=0`, summed per
#: file), longest first: collected first, so that pytest-xdist (`--dist loadfile
#: --no-loadscope-reorder`, as the Makefile runs it) hands them out first and the many short
#: files fill the end of every worker's share, instead of one long file running on alone at the
#: end (xdist's own order, by number of tests, sends long files of few tests last)
LONGEST_FIRST = (
    "interop/test_interop_import_exact.py",  # 77 s: 4 MarianMTModels trained by transformers
    "export/test_export_onnx.py",  # 66 s: two ONNX traces (5-9 s quiet, 17 under load)
    "notebooks/test_notebooks.py",  # 38 s
    "train/test_train_prepared.py",  # 37 s
    "train/test_train_ddp.py",  # 33 s: two torchrun runs of two processes
    "cli/test_cli_openmp.py",  # 31 s
    "test_docs.py",  # 31 s
    "train/test_train_subwords.py",  # 29 s
    "train/test_train_auto.py",  # 27 s
    "export/test_export_huggingface.py",  # 26 s
    "export/test_export_published.py",  # 24 s
    "serve/test_serve_pairs.py",  # 23 s
    "serve/test_serve_bodies.py",  # 22 s: slow clients, a byte a second
    "viz/test_viz_demos.py",  # 22 s
    "nn/test_nn_learning.py",  # 20 s
    "train/test_train_verdict.py",  # 20 s
    "functional/test_functional_chunked.py",  # 20 s
    "train/test_train_signals.py",  # 19 s
    "demos/test_demos_translate.py",  # 18 s
    "serve/test_serve_cli.py",  # 17 s
    "train/test_train_resume.py",  # 17 s
    "data/test_data_subwords.py",  # 17 s
    "notebooks/test_notebooks_progress.py",  # 14 s
    "train/test_train_loop.py",  # 14 s
    "export/test_export_lengths.py",  # 14 s
    "data/test_data_readers_encodings.py",  # 13 s
)


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(1234)
    yield


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (restored after it)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    checked: set[str] = set()
    rank = {rel: i for i, rel in enumerate(LONGEST_FIRST)}
    gone = sorted(set(LONGEST_FIRST) - {p.relative_to(HERE).as_posix() for p in HERE.rglob("test_*.py")})  # fmt: skip
    if gone:
        raise pytest.UsageError(f"tests/conftest.py: LONGEST_FIRST names {gone}, not in tests/")
    order = {}
    for item in items:
        try:
            rel = item.path.relative_to(HERE).as_posix()
        except ValueError:  # a test outside tests/
            continue
        order[item.nodeid] = rank.get(rel, len(rank))
        if rel not in OWN_THREADS:
            item.add_marker(pytest.mark.usefixtures("one_thread"))
        slow = SLOW_TESTS.get(rel, set())
        if slow and rel not in checked:
            checked.add(rel)
            missing = sorted(n for n in slow if not hasattr(item.module, n))
            if missing:
                raise pytest.UsageError(f"tests/conftest.py: SLOW_TESTS names {missing}, which {rel} lacks")  # fmt: skip
        name = getattr(item, "originalname", item.name)
        if name in slow or TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: order.get(item.nodeid, len(rank)))  # stable: a file's own order


@pytest.fixture(scope="session", autouse=True)
def _onnx_traced_once_per_model(tmp_path_factory):
    """Each distinct model is traced into ONNX graphs once per run, its graphs copied to every
    later export of it (tests/_onnx_cache.py: the trace is deterministic; the rest of an export
    runs every time), across pytest-xdist's workers (their temporary folders' common parent)."""
    from _onnx_cache import caching

    import qkv.export.onnx as onnx_export  # onnx itself loads on the first export only

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "onnx-graphs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_export, "_export_graphs", caching(onnx_export._export_graphs, root))
        yield


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """The first 600 bundled pairs as a fra-format file."""
    path = tmp_path_factory.mktemp("corpus") / "en-fr.txt"
    write_pairs(path, bundled_pairs()[:600])
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory, corpus_file) -> dict[str, Path]:
    """A run folder per model kind, trained for 30 updates on ``corpus_file``."""
    from qkv.train import train

    runs = {}
    for kind in TINY:
        out = tmp_path_factory.mktemp(f"run-{kind}")
        train(tiny_config(kind, data=str(corpus_file)), out, progress=False)
        runs[kind] = out
    return runs


@pytest.fixture(scope="session")
def marian_folder(tmp_path_factory) -> Path:
    """An untrained MarianMTModel folder made by transformers (OPUS-MT's layout, swish, tied
    embeddings; tests/_hf_models.py), for what needs a folder and not its translations."""
    pytest.importorskip("transformers")
    from _hf_models import build_marian

    folder, _ = build_marian(tmp_path_factory.mktemp("marian"), "swish-tied", steps=0)
    return folder


@pytest.fixture(scope="session")
def marian_trained(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """Every configuration of tests/_hf_models.py's KINDS as a MarianMTModel folder trained
    briefly by transformers, with its test sources: ``{name: (folder, sources)}``."""
    pytest.importorskip("transformers")
    from _hf_models import KINDS, build_marian

    root = tmp_path_factory.mktemp("marian-trained")
    return {name: build_marian(root, name) for name in KINDS}
