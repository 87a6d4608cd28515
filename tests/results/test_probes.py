"""The probe reader (attention_tutorial.results.probes) on made-up entries, and the flash page's claims on the
causal pipelined kernel held to the H200 probe files they cite (scripts/issue17_probe*_h200.json)."""

import json
from pathlib import Path

import pytest

from attention_tutorial.results import probes

ROOT = Path(__file__).resolve().parents[2]


def page() -> str:
    return (ROOT / "docs" / "flash_from_scratch.md").read_text()


C7513 = (
    "ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non "
    "wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage"
)


def entry(variant="pipe", mask="causal", ours=(400.0, 500.0), cudnn=(500.0, 500.0), warned=False, spill=0, rc=0):
    row = {"variant": variant, "causal": mask == "causal"}
    for key, value in (("ours", ours[0]), ("ours2", ours[1]), ("cudnn", cudnn[0]), ("cudnn2", cudnn[1])):
        row[key] = [value, value * 0.9, value * 1.1]
    code = {"ptxas_wgmma": [C7513] if warned else [],
            "spill_lines": [f"{spill} bytes spill stores, {spill} bytes spill loads"]}  # fmt: skip
    return {"variant": variant, "mask": mask, "rc": rc, "code": code, "rows": [row]}


def test_ratios_are_ours_over_cudnn_within_each_run():
    assert probes.ratios(entry(ours=(400.0, 450.0), cudnn=(500.0, 600.0))) == pytest.approx((0.8, 0.75))


def test_spread_pairs_our_slow_with_their_fast_and_our_fast_with_their_slow():
    # entry(): slow = 0.9 × median, fast = 1.1 × median, in TFLOP/s
    low, high = probes.spread(entry(ours=(400.0, 450.0), cudnn=(500.0, 600.0)))
    assert low == pytest.approx(min(360 / 550, 405 / 660)) and high == pytest.approx(max(440 / 450, 495 / 540))


def test_a_failed_run_has_no_ratio():
    failed = entry()
    failed["rows"] = [{"variant": "pipe", "causal": True, "error": "XlaRuntimeError: boom"}]
    assert probes.ratios(failed) is None
    assert probes.ratios(entry(rc=1)) is None
    assert "did not run" in probes.probe_line(failed, "f.json")


def test_warnings_and_spills_are_read_from_ptxas_lines():
    assert probes.ptxas_warnings(entry(warned=True)) == ["C7513"]
    assert probes.ptxas_warnings(entry()) == []
    assert probes.spills(entry(spill=480)) and not probes.spills(entry(spill=0))


def test_probe_line_words_the_variant_the_mask_both_runs_and_the_file():
    line = probes.probe_line(entry("pipe_dyn", "noncausal", ours=(370.0, 380.0), warned=True, spill=8), "p.json")
    assert line == (
        "- pipelined, its loop bound hidden from the compiler (the same value), no mask: 74 % and 76 % of cuDNN's "
        "speed (spread 61–93 %); `ptxas` warning C7513, registers spilled (`scripts/p.json`)"
    )
    checked = entry()
    checked["rows"][0]["max_abs_diff_vs_cudnn"] = 0.001953125
    assert "; largest difference from cuDNN's output 2.0e-03 (" in probes.probe_line(checked, "p.json")
    checked["rows"][0]["max_abs_diff_vs_cudnn"] = float("nan")  # a diagnostic with wrong numbers says nothing
    assert "difference" not in probes.probe_line(checked, "p.json")
    assert probes.probe_line(entry(), "p.json", "my words").startswith("- my words, causal: 80 % and 100 %")


def test_probe_lines_reads_files_says_what_is_missing_and_rejects_what_is_no_probe(tmp_path, monkeypatch):
    (tmp_path / "a.json").write_text(json.dumps([entry("pipe", "causal", warned=True), entry("pipe", "noncausal")]))
    read = []
    monkeypatch.setattr(probes, "load_probe", lambda path, real=probes.load_probe: read.append(path) or real(path))
    text = probes.probe_lines([("a.json", "pipe", "causal"), ("a.json", "pipe_dyn", "causal"),
                               ("b.json", "pipe", "causal", "mine"), ("a.json", "pipe_dyn", "noncausal")],
                              folder=tmp_path)  # fmt: skip
    assert read == [tmp_path / "a.json"]  # each file read once
    lines = text.splitlines()
    assert lines[3].endswith(", no mask: not in `scripts/a.json`")  # the mask worded as probe_line words it
    assert lines[0].endswith("`ptxas` warning C7513 (`scripts/a.json`)")
    assert (
        lines[1]
        == "- pipelined, its loop bound hidden from the compiler (the same value), causal: not in `scripts/a.json`"
    )
    assert lines[2] == "- mine, causal: `scripts/b.json` is missing"
    (tmp_path / "c.json").write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match=r"c\.json is not a probe file"):
        probes.probe_lines([("c.json", "pipe", "causal")], folder=tmp_path)
    (tmp_path / "d.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"d\.json is not a probe file"):
        probes.load_probe(tmp_path / "d.json")
    (tmp_path / "e.json").write_text("[{")
    with pytest.raises(ValueError, match=r"e\.json is not a probe file: not JSON"):
        probes.load_probe(tmp_path / "e.json")


def test_files_with_provenance_read_like_the_bare_lists(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps({"provenance": {"commit": "abc"}, "entries": [entry(warned=True)]}))
    assert probes.ptxas_warnings(probes.find(probes.load_probe(tmp_path / "p.json"), "pipe", "causal")) == ["C7513"]


MACHINE = {"gpu": "NVIDIA H200", "driver": "580.159.04", "jax": "0.11.2", "jaxlib": "0.11.2", "cudnn": "9.19.0",
           "transformer_engine": None, "python": "3.12.3", "created": "2026-12-03T18:30:00+00:00"}  # fmt: skip


def test_probe_lines_end_with_where_each_file_comes_from(tmp_path):
    prov = {**MACHINE, "commit": "0123456789abcdef", "dirty": True}
    (tmp_path / "new.json").write_text(json.dumps({"provenance": prov, "entries": [entry()]}))
    (tmp_path / "old.json").write_text(json.dumps([entry()]))
    (tmp_path / "old2.json").write_text(json.dumps([entry()]))
    (tmp_path / "bad.json").write_text(
        json.dumps({"provenance": {"error": "no GPU", "commit": None}, "entries": [entry()]})
    )
    picks = [("new.json", "pipe", "causal"), ("old.json", "pipe", "causal"), ("new.json", "pipe", "causal", "again"),
             ("old2.json", "pipe", "causal"), ("bad.json", "pipe", "causal"), ("gone.json", "pipe", "causal")]  # fmt: skip
    text = probes.probe_lines(picks, folder=tmp_path)
    bullets, origin = text.split("\n\n")
    assert len(bullets.splitlines()) == len(picks)
    assert origin == (
        "Where they come from: `scripts/new.json`: NVIDIA H200 (driver 580.159.04), JAX 0.11.2 / jaxlib 0.11.2, "
        "cuDNN 9.19.0, Python 3.12.3, recorded 2026-12-03, the code it ran not recorded (the GPU machine's git "
        "reported commit 0123456 with changes, which can be older than its files); `scripts/bad.json`: its "
        "versions unread; `scripts/old.json`, `scripts/old2.json` were written before the probe kept its provenance: "
        "the GPU's driver and versions were not saved with them."
    )
    one = probes.probe_lines([("old.json", "pipe", "causal")], folder=tmp_path)
    assert one.endswith("`scripts/old.json` was written before the probe kept its provenance: the GPU's driver and "
                        "versions were not saved with them.")  # fmt: skip
    assert "Where" not in probes.probe_lines([("gone.json", "pipe", "causal")], folder=tmp_path)


def _probe_script(monkeypatch, head_dim=None):
    import importlib.util

    if head_dim is None:
        monkeypatch.delenv("PROBE_HEAD_DIM", raising=False)
    else:
        monkeypatch.setenv("PROBE_HEAD_DIM", str(head_dim))
    spec = importlib.util.spec_from_file_location("probe_script", ROOT / "scripts" / "gpu_issue17_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its top level imports the standard library only
    return module


def test_the_probe_shape_named_on_the_page_is_the_probe_scripts(monkeypatch):
    b, t, n, h = _probe_script(monkeypatch).SHAPE
    assert probes.PROBE_SHAPE == f"B = {b}, T = S = {t}, N = {n}, H = {h}, bfloat16"
    assert _probe_script(monkeypatch, 256).SHAPE == (b, t, n, 256)  # the H = 256 probe: only H differs


def test_probe_dir_is_the_repository_scripts_folder():
    assert probes.probe_dir() == ROOT / "scripts"


def _probe(name, variant, mask):
    found = probes.find(probes.load_probe(ROOT / "scripts" / name), variant, mask)
    assert found is not None, (name, variant, mask)
    assert name in page()  # the page cites the file it draws on
    return found


def test_the_page_claims_on_the_causal_pipelined_kernel_hold_in_the_h200_probes():
    """The flash page says: dropping every mask kept C7513 on the causal pipelined kernel; a bound hidden from the
    compiler alone brings the warning and the slowdown to the unmasked kernel; static trip counts remove it from the
    causal one, which now runs without it; unrolling by two did not help. Each must hold in the files it cites, the
    speed claims outside the two runs' spread."""
    for variant in ("pipe", "pipe_nowhere"):
        assert probes.ptxas_warnings(_probe("issue17_probe_nomask_h200.json", variant, "causal")) == ["C7513"]
    seen = _probe("issue17_probe2_h200.json", "pipe", "noncausal")
    hidden = _probe("issue17_probe2_h200.json", "pipe_dyn", "noncausal")
    assert probes.ptxas_warnings(seen) == [] and probes.ptxas_warnings(hidden) == ["C7513"]
    assert max(probes.ratios(hidden)) < min(probes.ratios(seen))
    former = _probe("issue17_probe2_h200.json", "pipe", "causal")
    static = _probe("issue17_probe2_h200.json", "pipe_static", "causal")
    now = _probe("issue17_probe3_h200.json", "pipe", "causal")
    assert probes.ptxas_warnings(former) == ["C7513"] and probes.ptxas_warnings(static) == [] == probes.ptxas_warnings(
        now
    )
    assert max(probes.ratios(former)) < min(probes.ratios(static)) <= max(probes.ratios(now))
    unrolled = _probe("issue17_probe_dyn_h200.json", "pipe_unroll2", "causal")
    assert probes.ptxas_warnings(unrolled) == ["C7513"] and max(probes.ratios(unrolled)) < min(probes.ratios(static))


def test_the_page_fp8_stages_claim_holds_in_the_h200_tuning():
    """'three or four stages instead of two gained nothing at T = 8192': in the cited tuning file, p in registers,
    neither more stages' TFLOP/s is above two stages' by more than 2 %, with and without the mask."""
    assert "fp8_tuning_h200.json" in page()
    rows = json.loads((ROOT / "scripts" / "fp8_tuning_h200.json").read_text())
    tune = (ROOT / "scripts" / "tune.py").read_text()  # the file's rows predate their shape field: the script's
    assert 'B, T, N = (4, 8192, 16) if kernel in ("pipe", "fp8")' in tune and "T = 8192" in page()
    for causal in (False, True):
        speed = {r["config"]: r["tflops"] for r in rows if r["causal"] is causal and "registers" in r["config"]}
        two = speed["FP8 64x128 stages 2 p via registers"]
        more = [speed[f"FP8 64x128 stages {n} p via registers"] for n in (3, 4)]
        assert two and all(m is not None and m < 1.02 * two for m in more), speed


def test_the_first_probes_both_masks_in_one_entry_read_as_one_entry_per_mask(tmp_path):
    both = entry(ours=(300.0, 300.0))
    both["rows"].append({**entry(mask="noncausal")["rows"][0], "causal": False})
    both["rows"][0]["causal"] = True
    del both["mask"]
    (tmp_path / "old.json").write_text(json.dumps([both]))
    entries = probes.load_probe(tmp_path / "old.json")
    assert [(e["mask"], len(e["rows"])) for e in entries] == [("causal", 1), ("noncausal", 1)]
    assert probes.ratios(probes.find(entries, "pipe", "causal")) == pytest.approx((0.6, 0.6))
    assert probes.ratios(probes.find(entries, "pipe", "noncausal")) == pytest.approx((0.8, 1.0))
    both_warned = {**both, "code": entry(warned=True)["code"]}
    (tmp_path / "old2.json").write_text(json.dumps([both_warned]))
    line = probes.probe_line(probes.find(probes.load_probe(tmp_path / "old2.json"), "pipe", "noncausal"), "old2.json")
    assert "`ptxas` warning C7513 (ptxas's output covers both masks' kernels, compiled together)" in line


def test_the_page_pipelined_tuning_claim_holds_in_the_h200_tuning():
    """'at H = 128 the only pipelined tiles with 128-key blocks that fit, and 64-key blocks were slower'
    (scripts/pipe_tuning_h200.json): three stages did not compile, and every 64-key block ran below the default."""
    from attention_tutorial.kernels.mosaic_flash import MosaicConfig

    text = " ".join(page().split())
    assert "at H = 128 the only pipelined tiles with 128-key blocks that fit, and 64-key blocks were slower" in text
    cfg = MosaicConfig()
    assert (cfg.block_q, cfg.block_kv, cfg.stages) == (64, 128, 2)
    rows = json.loads((ROOT / "scripts" / "pipe_tuning_h200.json").read_text())
    for causal in (False, True):
        speed = {r["config"]: r["tflops"] for r in rows if r["causal"] is causal and r["H"] == 128}
        chosen = speed["64x128 stages 2 pipelined"]
        assert chosen and speed["64x128 stages 3 pipelined"] is None
        smaller = [v for k, v in speed.items() if k.startswith("64x64") and k.endswith("pipelined")]
        assert len(smaller) == 3 and max(smaller) < chosen


def test_files_without_provenance_give_the_day_git_first_committed_them(tmp_path, monkeypatch):
    import os
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("needs git")
    (tmp_path / "old.json").write_text(json.dumps([entry()]))

    def git(*args, author="2026-11-30T12:00:00Z", committer="2026-12-01T12:00:00Z", cwd=tmp_path):
        env = {"GIT_AUTHOR_DATE": author, "GIT_COMMITTER_DATE": committer, "GIT_AUTHOR_NAME": "t",
               "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
               "HOME": str(tmp_path), "PATH": os.environ["PATH"]}  # fmt: skip
        subprocess.run(["git", *args], cwd=cwd, env=env, check=True)

    git("init", "-q"), git("add", "old.json"), git("commit", "-q", "-m", "probe")
    (tmp_path / "new.json").write_text(json.dumps([entry()]))  # not committed: no day
    words = probes.provenance_words([tmp_path / "old.json", tmp_path / "new.json"])
    # the author's day (when the probe's file was made), not the committer's (which a rebase moves)
    assert words.startswith("`scripts/old.json` (committed 2026-11-30), `scripts/new.json` were written before")
    # a rename later keeps the first day
    git("mv", "old.json", "moved.json"), git("commit", "-q", "-m", "mv", author="2026-12-02T12:00:00Z")
    assert "(committed 2026-11-30)" in probes.provenance_words([tmp_path / "moved.json"])
    shallow = tmp_path / "shallow"
    git("clone", "-q", "--depth", "1", f"file://{tmp_path}", str(shallow))
    assert "committed" not in probes.provenance_words([shallow / "moved.json"])  # its one commit is not the first
    # a git too old for %as prints the format back: no day rather than "(committed %as)"
    real = subprocess.run

    def old_git(cmd, **kw):
        if "log" in cmd:
            return subprocess.CompletedProcess(cmd, 0, "%as\n", "")
        return real(cmd, **kw)

    monkeypatch.setattr(subprocess, "run", old_git)
    assert "committed" not in probes.provenance_words([tmp_path / "moved.json"])


def test_old_layout_reading_rejects_what_is_no_probe_and_notes_shared_code_only_for_two_masks(tmp_path):
    for bad in ([{}], [{"variant": "x"}], [{"impl": "cudnn", "median_ms": 1.0}]):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="not a probe file"):
            probes.load_probe(tmp_path / "bad.json")
    one = entry(warned=True)
    del one["mask"]
    one["rows"][0]["causal"] = False
    (tmp_path / "one.json").write_text(json.dumps([one]))
    line = probes.probe_line(probes.find(probes.load_probe(tmp_path / "one.json"), "pipe", "noncausal"), "one.json")
    assert "covers both masks" not in line and "`ptxas` warning C7513" in line


def test_a_wrong_numbers_variant_shows_no_difference_whatever_words_it_is_given():
    nowhere = entry("pipe_nowhere")
    nowhere["rows"][0]["max_abs_diff_vs_cudnn"] = 3.7
    assert "difference" not in probes.probe_line(nowhere, "p.json", "pipelined, no mask code")


def test_ceiling_words_bound_the_kernel_by_its_ceiling_without_exponentials():
    def e(ours, cudnn=(500.0, 500.0), variant="pipe", narrow=False):
        got = entry(variant, "causal", ours=ours, cudnn=cudnn)
        if narrow:  # slow and fast within 1 % of the median
            for key in ("ours", "ours2", "cudnn", "cudnn2"):
                got["rows"][0][key] = [got["rows"][0][key][0] * f for f in (1.0, 0.99, 1.01)]
        return got

    slow = e((450.0, 460.0))  # 90 % and 92 % of cuDNN
    words = probes.ceiling_words(slow, e((560.0, 570.0), variant="pipe_noexp"), 1.05, "pipelined, causal")
    assert words == ("pipelined, causal: with its exponentials the medians stay below 105 % (90 % and 92 %), without "
                     "them they clear it (112 % and 114 %), so by the medians the exponentials it does not hide are "
                     "what keeps it below 105 %; but the ceiling's spreads reach below it, so whether hiding every "
                     "exponential would reach it these records do not settle")  # fmt: skip
    tight = probes.ceiling_words(slow, e((560.0, 570.0), narrow=True), 1.05)
    assert tight.endswith("are what keeps it below 105 %; the ceiling's spreads clear it too")
    assert probes.ceiling_words(slow, e((500.0, 510.0), narrow=True), 1.05).endswith(
        "even without the exponentials the medians stay below 105 % (100 % and 102 %), so by the medians more than the "
        "exponentials stands between it and 105 %"
    )
    # the same medians with a spread that reaches the target: hedged, as the other way round is
    assert probes.ceiling_words(slow, e((510.0, 520.0)), 1.05).endswith(
        "stands between it and 105 %; the ceiling's spread reaches it, though, so these records do not settle it"
    )
    # the kernel's own runs either side of the target: not settled, whatever the ceiling
    assert probes.ceiling_words(e((520.0, 530.0)), e((600.0, 600.0)), 1.05).endswith(
        "with its exponentials the two runs' medians fall either side of 105 % (104 % and 106 %): not settled"
    )
    # a "ceiling" no faster than the kernel bounds nothing
    assert probes.ceiling_words(e((450.0, 460.0)), e((440.0, 450.0)), 1.05).endswith(
        "without the exponentials it runs no faster (88 % and 90 % against 90 % and 92 %), so this ceiling bounds "
        "nothing"
    )
    assert probes.ceiling_words(slow, e((510.0, 530.0)), 1.05).endswith(
        "fall either side of 105 % (102 % and 106 %): not settled"
    )
    # 99.7 % would print as 100 %, on the wrong side of a 100 % target: a decimal then
    assert probes.ceiling_words(slow, e((498.5, 510.5)), 1.0).endswith("either side of 100 % (99.7 % and 102.1 %): "
                                                                       "not settled")  # fmt: skip
    assert probes.ceiling_words(e((530.0, 540.0)), e((600.0, 600.0)), 1.05).endswith(
        "reaches 105 % already, exponentials and all (106 % and 108 %)"
    )
    assert probes.ceiling_words(slow, None, 0.9).endswith("its ceiling did not run, so these records do not bound it")
    assert probes.ceiling_words(entry(rc=1), slow, 0.9).startswith("it: the kernel did not run")
    # FP8's goal is 90 %: the same words at that target
    assert "without them they clear it (94 % and 96 %)" in probes.ceiling_words(
        e((400.0, 410.0)), e((470.0, 480.0), narrow=True), 0.90
    )


def test_ceiling_lines_pair_picks_from_the_files_and_say_what_is_missing(tmp_path):
    (tmp_path / "k.json").write_text(json.dumps([entry("plain", "causal", ours=(450.0, 460.0))]))
    (tmp_path / "c.json").write_text(json.dumps({"provenance": {}, "entries": [
        entry("plain_noexp", "causal", ours=(600.0, 600.0))]}))  # fmt: skip
    text = probes.ceiling_lines([
        ("plain, causal", ("k.json", "plain", "causal"), ("c.json", "plain_noexp", "causal")),
        ("plain, no mask", ("k.json", "plain", "noncausal"), ("gone.json", "plain_noexp", "noncausal")),
    ], 1.05, folder=tmp_path)  # fmt: skip
    first, second = text.splitlines()
    assert first.startswith("- plain, causal: with its exponentials the medians stay below 105 % (90 % and 92 %)")
    assert second == ("- plain, no mask: not in the probe files (`scripts/k.json` has no plain, no mask; "
                      "`scripts/gone.json` is missing)")  # fmt: skip
    assert first.endswith("(`scripts/k.json` and `scripts/c.json`)")  # each line names its files


def test_fp8_probe_lines_give_both_errors_against_float32_not_the_difference_from_cudnn():
    fp8 = entry("fp8_regs", "noncausal")
    fp8["rows"][0].update(rel_error_ours=0.0536, rel_error_cudnn_fp8=0.0596, max_abs_diff_vs_cudnn=0.16)
    line = probes.probe_line(fp8, "p.json")
    assert "relative error against float32 0.054 (cuDNN's FP8: 0.060)" in line and "difference" not in line
    noexp = entry("fp8_regs_noexp", "noncausal")
    noexp["rows"][0].update(rel_error_ours=float("nan"), rel_error_cudnn_fp8=0.0596, max_abs_diff_vs_cudnn=0.5)
    assert "error" not in probes.probe_line(noexp, "p.json") and "difference" not in probes.probe_line(noexp, "p.json")


def test_probes_name_the_code_they_ran_by_a_digest_of_the_sources_that_needs_no_git(tmp_path):
    for name, text in (("attention_tutorial/kernels/k.py", "a = 1\n"), ("scripts/probe.py", "b = 2\n"),
                       ("docs/page.md", "not code"), ("scripts/data.json", "{}")):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    first = probes.sources_digest(tmp_path)
    assert len(first) == 64 and first == probes.sources_digest(tmp_path)  # no git needed, the same each time
    (tmp_path / "docs/page.md").write_text("changed")
    (tmp_path / "scripts/data.json").write_text("[]")
    assert probes.sources_digest(tmp_path) == first  # only the Python code counts
    (tmp_path / "attention_tutorial/kernels/k.py").write_text("a = 2\n")
    assert probes.sources_digest(tmp_path) != first
    (tmp_path / "p.json").write_text(json.dumps({"provenance": {**MACHINE, "sources_sha256": first,
                                                                "commit": "0123456789", "dirty": True},
                                                 "entries": [entry()]}))  # fmt: skip
    assert probes.provenance_words([tmp_path / "p.json"]).endswith(f"recorded 2026-12-03, sources sha256 {first[:12]}.")


def test_the_probe_script_records_the_digest_of_the_repository_it_runs_in(monkeypatch):
    prov = _probe_script(monkeypatch).provenance(["plain"])  # its versions from a child process: no GPU needed
    assert prov["sources_sha256"] == probes.sources_digest(ROOT) and prov["variants"] == ["plain"]
    assert prov["tiles"] == {"plain": {"block_q": 64, "block_kv": 128, "stages": 2},
                             "pipe": {"block_q": 64, "block_kv": 128, "stages": 2}}  # fmt: skip
    wide = _probe_script(monkeypatch, 256).provenance(["plain"])  # the H = 256 probe keeps H = 256's own tiles
    assert wide["shape"]["head_dim"] == 256 and wide["tiles"]["plain"]["block_kv"] == 64


def test_the_page_h256_work_per_step_claim_holds():
    """'Nor does the work between two waits: 64 keys of 256 dimensions are as many multiply-adds per step as 128 keys
    of 128': the default tiles at H = 256 and H = 128, pipelined or not; and the H = 256 probe files the page cites
    were run at H = 256."""
    from attention_tutorial.kernels.mosaic_flash import default_config

    text = " ".join(page().split())
    assert "64 keys of 256 dimensions are as many multiply-adds per step as 128 keys of 128" in text
    for pipeline in (False, True):
        wide, narrow = default_config(256, pipeline=pipeline), default_config(128, pipeline=pipeline)
        assert (wide.block_kv, narrow.block_kv) == (64, 128) and wide.block_q == narrow.block_q
        assert wide.block_kv * 256 == narrow.block_kv * 128
    for name in ("issue17_probe5_h256_h200.json", "issue17_probe6_h256_h200.json"):
        assert name in text
        assert json.loads((ROOT / "scripts" / name).read_text())["provenance"]["shape"]["head_dim"] == 256


def test_per_cents_print_each_value_on_its_own_side_of_the_target_and_bad_timings_give_no_ratio():
    assert probes._pcts((0.96, 0.99), 1.0) == "96 % and 99 %"
    assert probes._pcts((0.997, 1.021), 1.0) == "99.7 % and 102.1 %"
    assert probes._pcts((0.9996, 1.02), 1.0) == "99.96 % and 102.00 %"
    assert probes._pcts((1.0496, 1.06), 1.05) == "104.96 % and 106.00 %"
    for bad in (float("nan"), 0.0):
        broken = entry()
        broken["rows"][0]["cudnn"][0] = bad
        assert probes.ratios(broken) is None and probes.spread(broken) is None
        assert probes.ceiling_words(broken, entry(), 1.0).endswith("the kernel did not run, so these records do not "
                                                                   "bound it")  # fmt: skip


def test_fp8_probe_lines_flag_a_non_finite_error_and_a_missing_cudnn_error():
    broken = entry("fp8_regs", "noncausal")
    broken["rows"][0].update(rel_error_ours=float("nan"), rel_error_cudnn_fp8=0.0596, max_abs_diff_vs_cudnn=0.1)
    assert "relative error against float32 not a finite number (wrong numbers) (cuDNN's FP8: 0.060)" in (
        probes.probe_line(broken, "p.json"))  # fmt: skip
    alone = entry("fp8_regs", "noncausal")
    alone["rows"][0].update(rel_error_ours=0.0536, rel_error_cudnn_fp8=None, max_abs_diff_vs_cudnn=0.1)
    line = probes.probe_line(alone, "p.json")
    assert "relative error against float32 0.054 (cuDNN's FP8: not recorded)" in line and "difference" not in line
    nan_out = entry("pipe", "causal")
    nan_out["rows"][0]["max_abs_diff_vs_cudnn"] = float("nan")  # a kernel meant to be right, NaN output
    assert "its output is not finite (wrong numbers)" in probes.probe_line(nan_out, "p.json")


def test_head_gain_words_say_who_gains_more_only_outside_the_spreads():
    def e(ours, cudnn, width=0.01):
        got = entry("plain", "noncausal", ours=ours, cudnn=cudnn)
        for key in ("ours", "ours2", "cudnn", "cudnn2"):
            got["rows"][0][key] = [got["rows"][0][key][0] * f for f in (1.0, 1 - width, 1 + width)]
        return got

    small, large = e((570.0, 575.0), (590.0, 595.0)), e((580.0, 585.0), (640.0, 645.0))
    words = probes.head_gain_words(small, large, 128, 256)
    assert words == ("cuDNN runs at 590 and 595 TFLOP/s at H = 128, 640 and 645 at H = 256; ours at 570 and 575 "
                     "TFLOP/s at H = 128, 580 and 585 at H = 256: cuDNN gains more from the larger head than ours "
                     "does")  # fmt: skip
    wide = probes.head_gain_words(e((570.0, 575.0), (590.0, 595.0), 0.05), e((585.0, 590.0), (640.0, 645.0), 0.05),
                                  128, 256)  # fmt: skip
    assert wide.endswith("within the spreads the two gain alike")
    assert probes.head_gain_words(large, small, 256, 128).endswith("ours gains more from the larger head than cuDNN "
                                                                   "does")  # fmt: skip
    assert "did not run" in probes.head_gain_words(entry(rc=1), large, 128, 256)


def test_head_gain_lines_read_both_files_and_say_what_is_missing(tmp_path):
    (tmp_path / "a.json").write_text(
        json.dumps([entry("plain", "noncausal", ours=(570.0, 575.0), cudnn=(590.0, 595.0))])
    )
    (tmp_path / "b.json").write_text(
        json.dumps([entry("plain", "noncausal", ours=(580.0, 585.0), cudnn=(640.0, 645.0))])
    )
    text = probes.head_gain_lines([("plain", ("a.json", "plain"), ("b.json", "plain")),
                                   ("pipe", ("a.json", "pipe"), ("b.json", "plain")),
                                   ("gone", ("a.json", "plain"), ("c.json", "plain"))], 128, 256, folder=tmp_path)  # fmt: skip
    plain, pipe, gone = text.splitlines()
    assert plain.startswith("- plain: cuDNN runs at 590 and 595 TFLOP/s at H = 128, 640 and 645 at H = 256; ours at")
    assert plain.endswith("(`scripts/a.json`, `scripts/b.json`)")
    assert "did not run" in pipe and gone == "- gone: `scripts/c.json` is missing"


def test_the_page_says_the_probed_fp8_path_is_the_package_default():
    """'the FP8 forward with p in registers (the package's default)': the probe's fp8_regs variant and
    mosaic_fp8_attention's default."""
    import inspect

    from attention_tutorial.kernels.mosaic_fp8 import mosaic_fp8_attention

    assert "the FP8 forward with p in registers (the package's default)" in " ".join(page().split())
    assert inspect.signature(mosaic_fp8_attention).parameters["p_via"].default == "registers"
    assert "p in registers" in probes.VARIANTS["fp8_regs"]
