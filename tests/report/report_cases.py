#!/usr/bin/env python3
"""The report page in a real browser (issue 60; docs/report.md).

    report_cases.py CASE BUILD_DIR

page: report.sh's bad flags (one line, exit 2) and --dry-run's commands (--hosts 2 reaching compare,
moe and pipeline; --full's size study at scale_bench.sh's default); then mpi_scripts/report.sh --only
compare on a tiny model (2 rounds of 3 steps of the five trainers), and once with a trainer flag that
does not exist (the page says the study failed; report.sh exits 1); then
  - report.json matches mpi_scripts/report_schema.json (Debian's python3-jsonschema, /usr/bin/python3),
    and two broken copies of it (no commit; an outcome the page does not use) do not;
  - its figures are compare.json's: every ratio, interval and outcome of the first section is the
    study's own (won above 1, lost below, tied holding 1), every compare row is in the table;
  - headless Chromium (mpi_scripts/report_check.py) finds every image loaded, no empty table, no
    script error, no link to a missing file, and writes the screenshot;
  - the checker fails on copies of the page that were broken one way each: an image removed, a table
    removed (a study's, the first section's, the machine's), a table's rows removed, an image's data corrupted, a script error, a linked raw file
    deleted; each must fail with its own message (a checker that passes everything fails here).
The screenshot stays in BUILD_DIR/report-test/screenshot.png for CI to keep.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "mpi_scripts"))
import report_check  # noqa: E402

SKIP = 77
MODEL = ["--d-model", "64", "--layers", "2", "--heads", "4", "--head-dim", "16", "--d-ff", "128",
         "--seq-len", "32", "--batch", "8", "--eval-batches", "1"]


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kw)


def install_tools():
    p = sh(["bash", "-c", "source mpi_scripts/env.sh && pwm_install_report_tools"])
    if p.returncode != 0 and not os.access("/usr/bin/chromium", os.X_OK):
        print(f"no Chromium and it cannot be installed here: {p.stderr.strip()}")
        sys.exit(SKIP)
    assert p.returncode == 0, p.stderr


def mutate(src, dst, name, edit):
    """A copy of the report folder src at dst/name with index.html changed by edit (a function of
    the page's text and the folder, returning the new text)."""
    d = os.path.join(dst, name)
    shutil.copytree(src, d)
    page = os.path.join(d, "index.html")
    with open(page) as f:
        text = f.read()
    new = edit(text, d)
    assert new != text or name == "raw_file_deleted", f"{name}: the mutation changed nothing"
    with open(page, "w") as f:
        f.write(new)
    return page


def flags_and_commands():
    """Bad flags: one line, exit 2, before anything is installed; --dry-run: every study's command."""
    for args, msg in ((["--only", "bogus"], "--only takes compare moe pipeline failure dispatch sim size (got 'bogus')"),
                      (["--rounds"], "--rounds needs a value"), (["--hosts", "1"], "--hosts 1 is out of range"),
                      (["--only", "compare", "--skip", "moe"], "--only and --skip exclude each other"),
                      (["--only", "moe", "--steps", "4"], "--steps must be at least 5")):
        p = sh(["bash", "mpi_scripts/report.sh", *args])
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and msg in p.stderr, (args, p.returncode, p.stderr)
    p = sh(["bash", "mpi_scripts/report.sh", "--dry-run", "--hosts", "2", "--out", "/nonexistent/r"])
    assert p.returncode == 0, p.stderr
    cmds = dict(line.split(": ", 1) for line in p.stdout.splitlines()
                if re.match(r"^(compare|moe|pipeline|failure|dispatch|sim|size): ", line))
    assert sorted(cmds) == sorted(["compare", "moe", "pipeline", "failure", "dispatch", "sim", "size"]), p.stdout
    for s in ("compare", "moe", "pipeline"):
        assert "--hosts 2" in cmds[s] and f"--out /nonexistent/r/{s}" in cmds[s], cmds[s]
    assert "--rounds 3 --steps 5" in cmds["compare"] and "--moe-skew 0" in cmds["moe"], cmds
    assert "--no-hosts" not in cmds["sim"], cmds["sim"]
    assert "scale_bench.sh --out /nonexistent/r/size --sizes 4m\\,30m --rounds 2" in cmds["size"], cmds["size"]
    assert not os.path.exists("/nonexistent/r"), "--dry-run made its folder"
    peer = os.path.join(ROOT, "mpi_scripts", "report.sh")  # a file that exists, as the peer
    p = sh(["bash", "mpi_scripts/report.sh", "--dry-run", "--full", "--only", "size"],
           env=dict(os.environ, PWM_TORCH_DDP_PEER=peer))
    assert p.returncode == 0 and p.stdout.strip().endswith("scale_bench.sh --out " + os.path.join(ROOT, "results/report/size")), \
        f"--full's size study is not scale_bench.sh's default: {p.stdout}"
    # Without the PyTorch peer the sweep runs without DDP (the page says so) instead of failing.
    p = sh(["bash", "mpi_scripts/report.sh", "--dry-run", "--only", "size"], env=dict(os.environ, PWM_TORCH_DDP_PEER="/nonexistent"))
    assert p.returncode == 0 and p.stdout.strip().endswith("--rounds 2 --no-ddp"), p.stdout


def failed_study_fails_the_run(keep, env):
    """A study that fails (here compare, given a flag no trainer takes): the page is still written and
    says so, and report.sh exits 1 naming the study."""
    out = os.path.join(keep, "failed")
    cmd = ["bash", "mpi_scripts/report.sh", "--only", "compare", "--rounds", "1", "--steps", "3", "--out", out,
           "--", *MODEL, "--no-such-flag"]
    p = sh(cmd, env=env, timeout=300)
    print(f"$ {' '.join(cmd)}\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    assert p.returncode == 1, f"report.sh exited {p.returncode} with a failed study"
    assert "report.sh: 1 of 1 studies failed: compare (exit " in p.stderr, p.stderr
    with open(os.path.join(out, "index.html")) as f:
        assert "<span class=fail>exited " in f.read(), "the page does not say the study failed"


def case_page(build):
    flags_and_commands()
    install_tools()
    keep = os.path.join(build, "report-test")
    shutil.rmtree(keep, ignore_errors=True)
    out = os.path.join(keep, "report")
    env = dict(os.environ, BUILD_DIR=os.path.abspath(build))
    cmd = ["bash", "mpi_scripts/report.sh", "--only", "compare", "--rounds", "2", "--steps", "3", "--out", out,
           "--", *MODEL]
    p = sh(cmd, env=env, timeout=500)
    print(f"$ {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}")
    assert p.returncode == 0, f"report.sh failed ({p.returncode})"
    failed_study_fails_the_run(keep, env)
    assert re.search(r"report\.sh: \[1/1\] compare \(estimate \d+ min; about \d+ min left", p.stdout), \
        "no progress line naming the study and the time left"
    assert "report_check.py: " in p.stdout and " passed: " in p.stdout, "report.sh did not check its page"

    # The schema, with Debian's jsonschema.
    v = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "mpi_scripts/report_page.py"), "--validate",
                        os.path.join(out, "report.json"), os.path.join(ROOT, "mpi_scripts/report_schema.json")],
                       capture_output=True, text=True)
    assert v.returncode == 0, v.stderr
    # ... and the schema refuses a report without its commit, or with an outcome the page does not use.
    with open(os.path.join(out, "report.json")) as f:
        good = json.load(f)
    for what, bad in (("no commit", dict(good, meta={k: x for k, x in good["meta"].items() if k != "commit"})),
                      ("outcome 'better'", dict(good, verdicts=[dict(good["verdicts"][0], outcome="better")]))):
        path = os.path.join(keep, "bad_report.json")
        with open(path, "w") as f:
            json.dump(bad, f)
        v = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "mpi_scripts/report_page.py"), "--validate", path,
                            os.path.join(ROOT, "mpi_scripts/report_schema.json")], capture_output=True, text=True)
        assert v.returncode == 1 and "does not match" in v.stderr, f"{what}: --validate exited {v.returncode}: {v.stderr}"

    # The page's figures are the study's.
    with open(os.path.join(out, "report.json")) as f:
        doc = json.load(f)
    with open(os.path.join(out, "compare", "compare.json")) as f:
        cmp = json.load(f)
    names = [r["name"] for r in cmp["runs"]]
    assert names == ["spmd", "fused", "chained", "static", "pipeline"], names
    got = {v["candidate"]: v for v in doc["verdicts"]}
    assert sorted(got) == sorted(names[1:]), f"verdicts for {sorted(got)}, runs {names}"
    for r in cmp["runs"][1:]:
        v, want = got[r["name"]], r["vs_spmd"]
        assert (v["median"], v["lo"], v["hi"]) == (want["median"], want["lo"], want["hi"]), (v, want)
        expect = "won" if want["lo"] > 1 else "lost" if want["hi"] < 1 else "tied"
        assert v["outcome"] == expect, f"{r['name']}: {v['outcome']} for {want}"
    assert any(line.startswith("compare: against spmd") for line in doc["headline"]), doc["headline"]
    with open(os.path.join(out, "index.html")) as f:
        page = f.read()
    for r in cmp["runs"]:
        assert f"<td class=\"\">{r['name']}</td><td class=\"\">{r['tokens_per_s']:.0f}</td>" in page, \
            f"the page's table has no row {r['name']} with compare.json's {r['tokens_per_s']:.0f} tokens/s"
    st = doc["studies"][0]
    assert {"compare/loss.png", "compare/throughput.png"} <= set(st["images"]), st["images"]
    assert st["traces"], "no trace linked"
    assert doc["meta"]["cpu"]["model"] and doc["meta"]["commit"], doc["meta"]

    # The browser: the page as written passes, and its screenshot is a PNG.
    shot = os.path.join(keep, "screenshot.png")
    problems, summary = report_check.check(os.path.join(out, "index.html"), shot)
    assert not problems, problems
    assert summary["images"] >= 2 and summary["tables"] >= 3 and summary["svgs"] >= 1, summary
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
    assert os.path.getsize(shot) > 20000, f"the screenshot is {os.path.getsize(shot)} bytes: blank?"
    print(f"screenshot: {shot}; {summary}")

    # Broken copies: each must fail, with its own message.
    def drop_first(pattern):
        return lambda t, d: re.sub(pattern, "", t, count=1, flags=re.S)

    def raw_file_deleted(t, d):
        os.remove(os.path.join(d, "compare", "workload.json"))
        return t
    cases = {
        "image_removed": (drop_first(r"<figure><img .*?</figure>"),
                          "an image of report.json missing from the page"),
        "table_removed": (drop_first(r"<table><caption>Tokens/s against spmd.*?</table>"),
                          "a table of report.json missing from the page"),
        # A table no study lists (the first section's, the machine's): report.json's page_tables.
        "first_section_table_removed": (drop_first(r"<table><caption>Ratios against their reference.*?</table>"),
                                        "a table of the page (report.json's page_tables) missing from it"),
        "machine_table_removed": (drop_first(r"<table><caption>Where and what ran.*?</table>"),
                                  "a table of the page (report.json's page_tables) missing from it"),
        "table_rows_removed": (lambda t, d: re.sub(r"(<caption>Tokens/s against spmd[^<]*</caption><thead>.*?</thead>"
                                                   r"<tbody>).*?(</tbody>)", r"\1\2", t, count=1, flags=re.S),
                               "an empty table"),
        "image_corrupt": (lambda t, d: t.replace("src=\"data:image/png;base64,", "src=\"data:image/png;base64,AAAA", 1),
                          "an image that did not load"),
        "script_error": (lambda t, d: t.replace("</body>", "<script>no_such_function()</script></body>"),
                         "a script error"),
        "raw_file_deleted": (raw_file_deleted, "a link to a file that is not there: compare/workload.json"),
    }
    with tempfile.TemporaryDirectory(prefix="pwm_report_") as tmp:
        for name, (edit, message) in cases.items():
            broken = mutate(out, tmp, name, edit)
            problems, _ = report_check.check(broken, os.path.join(tmp, name + ".png"))
            print(f"{name}: {problems}")
            assert any(message in p for p in problems), f"{name}: the checker did not say '{message}': {problems}"
            # The command line fails too (exit 1), as CI and report.sh run it.
            c = subprocess.run([sys.executable, os.path.join(ROOT, "mpi_scripts/report_check.py"), broken,
                                os.path.join(tmp, name + "_cli.png")], capture_output=True, text=True)
            assert c.returncode == 1, f"{name}: report_check.py exited {c.returncode}:\n{c.stdout}"


def main():
    case, build = sys.argv[1], sys.argv[2]
    globals()["case_" + case](build)
    print(f"{case}: ok")


if __name__ == "__main__":
    main()
