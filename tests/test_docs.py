"""The docs site: generated from the cards, built with --strict, and checked in a real browser (Debian's chromium)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.helpers import REPO, free_port
from zoo import catalog

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "zoo"), "docs"], cwd=REPO, check=True, capture_output=True)
    build = subprocess.run([str(bin_dir / "mkdocs"), "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            requests.get(url, timeout=1)
            break
        except requests.ConnectionError:
            time.sleep(0.1)
    yield url, out
    server.kill()
    server.wait()


def test_every_entry_has_a_page_generated_from_its_card(site):
    _, out = site
    home = (out / "index.html").read_text()
    assert all(f'href="models/{name}/"' in home for name in catalog.entries())  # the catalog preview on the home page
    bench = (out / "reference" / "benchmarks" / "index.html").read_text()
    assert "Full report" in bench and "<td>" not in bench.split("Validation report")[-1]  # summary, not 200 rows
    assert (out / "reference" / "results" / "validation" / "index.html").exists()
    for name, entry in catalog.entries().items():
        page = (out / "models" / name / "index.html").read_text()
        fp32 = entry.card.variants["fp32"]
        assert (f"zoo fetch {name} --variant fp32" in page) == fp32.built
        if fp32.built:  # sizes sort by bytes, accuracies carry their interval, hashes sit in a details block
            assert f'data-sort="{fp32.size}"' in page and "95% CI" in page and "<details" in page
        assert not re.search(r"per class: [^<]*\d{4}", page)  # 48,000 as in the splits line, not 48000
        if "retrained by its recipe" in page:  # the footnote right under the variants table, before the next heading
            assert page.index("retrained by its recipe") < page.index('id="which-variant-to-use"')
        metric = entry.card.metric("fp32")
        if metric is not None:
            assert f">{metric:.4f}<" in page


def _chromium(playwright):
    assert shutil.which("chromium") or Path(CHROMIUM).exists(), "Debian's chromium is missing: `make setup` installs it"
    return playwright.chromium.launch(executable_path=CHROMIUM, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"])


# Per page: tables that run past the article outside any scroll box; wide tables and code blocks without the
# "scroll sideways" hint (docs/js/overflow.js, docs/css/zoo.css); code text under a copy button.
LAYOUT = """() => {
  const article = document.querySelector('article').getBoundingClientRect();
  const scrollBox = (el) => { for (let p = el.parentElement; p && p.tagName !== 'ARTICLE'; p = p.parentElement) {
      if (['auto', 'scroll'].includes(getComputedStyle(p).overflowX)) return p; } return null; };
  const hinted = (box, where) => box.classList.contains('zoo-overflows')
      && getComputedStyle(box, where).content.includes('scroll sideways');
  const found = {cut: [], unhinted: [], covered: []};
  for (const table of document.querySelectorAll('article table')) {
    const box = scrollBox(table), name = table.innerText.slice(0, 30);
    if (!box && table.getBoundingClientRect().right > article.right + 1) found.cut.push(name);
    if (box && box.scrollWidth > box.clientWidth + 1 && !hinted(box, '::before')) found.unhinted.push(name);
  }
  for (const code of document.querySelectorAll('article pre > code')) {
    const pre = code.parentElement, name = code.innerText.slice(0, 30);
    if (code.scrollWidth > code.clientWidth + 1 && !hinted(pre, '::after')) found.unhinted.push(name);
    const button = pre.querySelector('.md-clipboard');
    if (!button) continue;
    const b = button.getBoundingClientRect(), text = document.createRange();
    text.selectNodeContents(code);
    if ([...text.getClientRects()].some(r => r.width > 0 && r.right > b.left && r.left < b.right
                                        && r.bottom > b.top && r.top < b.bottom)) found.covered.push(name);
  }
  return found;
}"""


def test_pages_fit_a_laptop_and_a_phone_and_ask_nothing_of_the_network(site):
    """At 1280 and 390 px every table and code block fits or says it scrolls, no copy button covers code, and no page
    requests anything from outside the site (it is read offline, and from a mirror)."""
    from playwright.sync_api import sync_playwright

    url, _ = site
    pages = ["", "models/", "reference/recipes/", "reference/benchmarks/", "reference/variants/", "guides/",
             "guides/launchers/", "reference/results/validation/"] + [f"models/{name}/" for name in catalog.entries()]
    elsewhere, problems = [], {}
    with sync_playwright() as p:
        browser = _chromium(p)
        for width in (1280, 390):
            page = browser.new_page(viewport={"width": width, "height": 844})
            page.on("request", lambda r: None if r.url.startswith((url, "data:")) else elsewhere.append(r.url))
            for path in pages:
                page.goto(f"{url}/{path}", wait_until="networkidle")
                found = page.evaluate(LAYOUT)
                if any(found.values()):
                    problems[f"{width}px /{path}"] = found
            page.close()
        browser.close()
    assert not problems, problems
    assert not elsewhere, elsewhere


def test_browser_search_finds_entry_and_shows_card_accuracy(site, tmp_path):
    from playwright.sync_api import sync_playwright

    url, _ = site
    name = "mnist1d-cnn" if "mnist1d-cnn" in catalog.entries() else next(iter(catalog.entries()))
    card = catalog.get_card(name)
    with sync_playwright() as p:
        browser = _chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{url}/models/", wait_until="networkidle")
        assert "Models" in page.title()
        # Readable at 1280 px: no table scrolls sideways; sizes sort by bytes, not by their printed number.
        overflow = "[...document.querySelectorAll('.md-typeset__scrollwrap')].some(w => w.scrollWidth > w.clientWidth)"
        assert not page.evaluate(overflow)
        page.locator("th", has_text="size (fp32)").click()
        sizes = page.evaluate("[...document.querySelectorAll('article tbody tr')].map(r => "
                              "r.querySelector('[data-sort]')).filter(Boolean).map(s => Number(s.dataset.sort))")
        assert sizes == sorted(sizes) and len(sizes) >= 2
        page.locator("label.md-search__icon, .md-search__input").first.click()
        search = page.locator("input.md-search__input")
        search.press_sequentially(name, delay=50)
        result = page.locator(f".md-search-result__link[href*='models/{name}/']").first
        result.wait_for(timeout=20_000)
        result.click()
        page.wait_for_load_state("networkidle")
        assert page.locator("h1").first.inner_text() == name
        assert not page.evaluate(overflow)
        shown = page.locator('span.metric[data-variant="fp32"]').first.inner_text()
        assert shown == f"{card.metric('fp32'):.4f}"
        page.screenshot(path=str(tmp_path / "card.png"), full_page=True)
        browser.close()
    assert (tmp_path / "card.png").stat().st_size > 10_000


def test_an_unbuilt_entry_says_so_and_offers_no_fetch(site, tmp_path):
    """bert-base is planned, not built: a notice with how to build it and an estimate, no `zoo fetch` that must fail,
    and validation reports it as not built rather than counting a pass."""
    from zoo import docs
    from zoo.validate import validate_entry

    _, out = site
    page = (out / "models" / "bert-base" / "index.html").read_text()
    assert "Not built yet" in page and "zoo build bert-base" in page and "PFLOP" in page
    assert "zoo fetch bert-base" not in page and "None thread" not in page
    # Derived from the recipe and the architecture: one parameter count, no metrics, opsets or hashes before a build.
    card = catalog.get_card("bert-base")
    assert f"{card.num_params:,}" in page and "M parameters" not in page and " MB)" not in page
    assert "95% CI" not in page and "<th>opset</th>" not in page and "<th>sha256</th>" not in page
    index = (out / "models" / "index.html").read_text()
    assert "17, 20" not in index.split('href="bert-base/"')[1].split("</tr>")[0]
    assert "zoo export bert-base --variant" not in page  # nothing to remake before fp32 exists
    rows = validate_entry(catalog.get_entry("bert-base"), tmp_path)
    assert [(r.check, r.verdict) for r in rows] == [("built", "planned")] and not rows[0].skipped
    rows_json = {"rows": [{"entry": r.entry, "variant": r.variant, "check": r.check, "ok": r.ok, "skipped": r.skipped}
                          for r in rows]}
    assert docs.validation_verdicts(rows_json, "bert-base") == {"*": "not built"}


def test_model_pages_show_the_classic_tools_measured_on_this_build():
    """benchmarks/baselines.py's rows reach a model page only for the files whose sha256 is the card's."""
    import json

    from zoo.docs import RESULTS, report_runs, baselines_section

    card = catalog.get_card("digits-cnn")
    fp32 = card.variants["fp32"]
    def run(cpu: str, sha256: str, svc: float) -> dict:
        return {"cpu": {"model": cpu}, "threads": 1, "tasks": {"digits": {"test_examples": 360, "rows": [
            {"tool": "scikit-learn SVC (RBF, C=10, raw pixels)", "kind": "baseline", "accuracy": svc,
             "ms_per_text": 0.2},
            {"tool": "digits-cnn", "variant": "fp32", "kind": "entry", "sha256": sha256, "accuracy": 1.0,
             "ms_per_text": 0.03}]}}}

    # Two runs: an older build measured on one machine, this build on another; the page shows this build's run,
    # with the classic tool as measured next to it.
    results = {"runs": [run("Old CPU", "0" * 64, 0.5), run("Some CPU", fp32.sha256, 0.983)]}
    lines = "\n".join(baselines_section(card, results))
    assert "Against the classic tools" in lines and "Some CPU, 1 thread" in lines and "Old CPU" not in lines
    assert "| scikit-learn SVC (RBF, C=10, raw pixels) | 98.3 | 0.200 |" in lines and "| **digits-cnn fp32** | 100.0 |" in lines
    record = results["runs"][1]
    record["tasks"]["digits"]["rows"][1]["sha256"] = "0" * 64  # measured on another build: not shown as this one's
    assert baselines_section(card, results) == []
    record["tasks"]["digits"]["not_measured"] = [{"tool": "digits-cnn", "variant": "fp32", "sha256": fp32.sha256,
                                                  "reason": "not in the store"}]
    assert "Not measured on this build by `python benchmarks/baselines.py`: not in the store" in \
        "\n".join(baselines_section(card, results))
    # The committed results are of the catalog's current files: every built entry of a task with a classic tool.
    tasks = [task for run in report_runs(json.loads((RESULTS / "baselines.json").read_text()))
             for task in run["tasks"].values()]
    measured = {(r["tool"], r["variant"], r["sha256"]) for task in tasks for r in task["rows"] if r["kind"] == "entry"}
    # A file the benchmark could not fetch is listed with its reason (and said so on its page), never silently left out.
    measured |= {(r["tool"], r["variant"], r["sha256"]) for task in tasks for r in task.get("not_measured", [])
                 if r["reason"]}
    for name, entry in catalog.entries().items():
        if entry.card.task == "language-identification" or entry.card.dataset.name == "digits":
            for key, v in entry.card.variants.items():
                if v.built and key in ("fp32", "int8-qat", "int8-ptq", "int8-dynamic", "fp16"):
                    assert (name, key, v.sha256) in measured, f"{name} {key}: run python benchmarks/baselines.py"


def test_a_language_id_page_says_when_to_prefer_the_classic_tool():
    """From the measured rows: which tool is more accurate on which held-out domain, how many times faster the classic
    tool is than the entry's fastest variant, and when to pick which."""
    from zoo.docs import baselines_section

    card = catalog.get_card("bert-tiny")
    domains = ["fortunes", "second-domain", "software messages"]

    def row(tool: str, kind: str, accuracy: list[float], ms: float, variant: str | None = None) -> dict:
        sets = {s: {"accuracy": a, "by_language": {}, "by_length": {}} for s, a in zip(domains, accuracy)}
        return {"tool": tool, "kind": kind, "variant": variant, "sha256": card.variants[variant].sha256 if variant else None,
                "version": "1.1.6", "sets": sets, "ms_per_text": ms}

    def page(entry_accuracy: list[float]) -> str:
        rows = [row("langid.py", "baseline", [0.987, 0.99, 0.95], 0.1),
                row("bert-tiny", "entry", entry_accuracy, 0.8, "fp32"), row("bert-tiny", "entry", entry_accuracy, 0.5,
                                                                           "int8-dynamic")]
        task = {"test_sets": {s: 2400 for s in domains}, "domains": domains, "labels": [], "rows": rows}
        return "\n".join(baselines_section(card, {"runs": [{"cpu": {"model": "Some CPU"}, "threads": 1,
                                                             "tasks": {"language-identification": task}}]}))

    ahead = page([0.992, 0.992, 0.96])
    assert ("**Against langid.py:** bert-tiny fp32 is at least as accurate on every test set (fortunes, second-domain, "
            "software messages) and 5.0x slower than langid.py (int8-dynamic, its fastest: 0.50 vs 0.10 ms per text). "
            "Prefer bert-tiny where accuracy on unfamiliar text counts; prefer langid.py where throughput counts") in ahead
    assert "software messages: coreutils, GNU C library and tar messages" in ahead
    behind = page([0.992, 0.98, 0.90])
    assert ("**Against langid.py:** langid.py is more accurate on second-domain, software messages (while bert-tiny "
            "fp32 leads on fortunes), and bert-tiny is 5.0x slower") in behind


def test_the_benchmarks_page_reads_as_a_page(site):
    """Short headings, each with text under it; one wording of the validation result on both pages that show it; no
    wording about how this project's sessions run."""
    _, out = site
    bench = (out / "reference" / "benchmarks" / "index.html").read_text()
    headings = re.findall(r"<h2[^>]*>(.*?)</h2>\s*(<[a-z0-9]+)", bench, flags=re.S)
    assert headings and all(len(re.sub(r"<[^>]+>", "", h)) <= 80 and after != "<h2" for h, after in headings), headings
    for report in (out / "reference" / "results").glob("*/index.html"):  # the full reports: their titles in the nav
        title = re.search(r"<h1[^>]*>(.*?)</h1>", report.read_text(), flags=re.S).group(1)
        assert len(re.sub(r"<[^>]+>", "", title)) <= 80, (report, title)
    result = re.search(r"[\d,]+ checks? passed, \d+ failed, \d+ skipped", bench).group(0)
    assert result in (out / "models" / "index.html").read_text()
    assert not re.search(r"\b(session|lent)\b", re.sub(r"<[^>]+>", " ", bench)), "internal wording on the page"


def test_the_readme_is_a_front_door():
    """The README stays short and sends readers to the guides: every guide is linked from it, every link resolves."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 130, "the README grew: move the detail into a guide under docs/guides/"
    links = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    assert all((REPO / link).is_file() for link in links), [link for link in links if not (REPO / link).is_file()]
    guides = {f"docs/guides/{p.name}" for p in (REPO / "docs" / "guides").glob("*.md")}
    assert guides <= links, f"guides the README does not link: {sorted(guides - links)}"


def test_the_guides_start_with_the_quickstart(site):
    """The guides' section opens with the Quickstart (the section's index page), not with the alphabetically first."""
    _, out = site
    guides = [href for href in re.findall(r'href="(guides/[^"]*)"', (out / "index.html").read_text())]
    assert guides and guides[0] == "guides/", guides
    assert ">Quickstart</h1>" in (out / "guides" / "index.html").read_text()


def test_a_transformer_page_says_where_int8_time_goes_and_the_cpu_limit():
    """The model page of a BERT entry explains its int8-qat speed from the committed profiles (where the time goes,
    the CPU's int8 peak, the bound), only when they measured this build's file: never a stale explanation."""
    import json

    from zoo.docs.common import RESULTS
    from zoo.docs.model_page import int8_time
    from zoo.evaluate import int8_bound
    from zoo.provenance import cpu_kind, int8_peak

    profiles = json.loads((RESULTS / "profiles.json").read_text())
    card = catalog.get_card("bert-tiny")
    lines = " ".join(int8_time(card, profiles))
    assert profiles["runs"], "profiles.json holds no run"
    for run in profiles["runs"]:  # one sentence per CPU kind that measured this build's file
        peak = int8_peak(run["cpu"]["flags"])[0]
        bound = int8_bound(run["entries"]["bert-tiny"]["fp32-fused"]["per_op_us"], peak)
        assert f"on {cpu_kind(run['cpu'])}" in lines and f"at most {peak:.2f}x" in lines and f"{bound:.2f}x" in lines
    assert "integer kernels" in lines, lines
    stale = json.loads(json.dumps(profiles))
    for run in stale["runs"]:
        run["entries"]["bert-tiny"]["int8-qat"]["sha256"] = "0" * 64
    assert int8_time(card, stale) == [] and int8_time(catalog.get_card("digits-cnn"), profiles) == []
