"""`servesim report RUN_DIR`: one self-contained HTML page, checked as text and in a real headless browser
(Chromium or Chrome; skipped when none is installed)."""
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from sim.cli.main import main
from sim.plots.run_plots import PLOTS

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


class Elements(HTMLParser):
    """Counts tags and collects every src/href."""

    def __init__(self):
        super().__init__()
        self.tags, self.links = {}, []

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self.links += [value for name, value in attrs if name in ("src", "href")]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    assert main(["run", "--num-prompts", "40", "--request-rate", "20", "--num-gpu-blocks-override", "600",
                 "--max-model-len", "8192", "--out", str(run_dir), "--table-format", "csv", "--plot-format", "none"]) == 0
    assert main(["report", str(run_dir)]) == 0
    return run_dir / "report.html"


def test_report_is_one_self_contained_page(report):
    page = Elements()
    page.feed(report.read_text())
    assert page.tags["svg"] == len(PLOTS) and page.tags["figure"] == len(PLOTS)
    assert not [link for link in page.links if not link.startswith("#")]  # nothing loaded from elsewhere
    text = report.read_text()
    assert "Latency" in text and "deployment.model" in text and "servesim 0.1.0" in text
    assert len(re.findall(r"<tr><td>req-\d+</td>", text)) == 40


def test_report_of_a_folder_that_is_no_run_is_one_error_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servesim: error: ") and "summary.json" in err and err.count("\n") == 1


def browser():
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if found is None:
        pytest.skip("no Chromium/Chrome installed (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def in_browser(report, tmp_path_factory):
    """One headless run: the DOM after the page's script ran (filtered by the URL), and a screenshot."""
    shot = tmp_path_factory.mktemp("shot") / "shot.png"
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,2600",
           f"--screenshot={shot}", "--dump-dom", f"{report.as_uri()}#filter=req-1"]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=180).stdout
    import matplotlib.image
    return dom, matplotlib.image.imread(shot)[..., :3]


def test_a_real_browser_runs_the_page_and_its_search(in_browser):
    dom, _ = in_browser
    assert 'data-ready="yes"' in dom  # the inline script ran to its end
    rows = re.findall(r'<tr( style="[^"]*")?><td>(req-\d+)</td>', dom)
    shown = [rid for style, rid in rows if "none" not in style]
    assert len(rows) == 40 and shown == ["req-1"] + [f"req-{i}" for i in range(10, 20)]
    assert re.search(r'id="count">(\d+) of 40 requests<', dom).group(1) == "11"
    assert dom.count("<svg") >= len(PLOTS)


def test_a_real_browser_draws_the_plots(in_browser):
    _, pixels = in_browser
    blue = (pixels[..., 2] > 0.6) & (pixels[..., 0] < 0.3)  # the plots' lines and bars (#1f77b4)
    orange = (pixels[..., 0] > 0.8) & (pixels[..., 1] > 0.35) & (pixels[..., 1] < 0.6) & (pixels[..., 2] < 0.35)
    assert blue.sum() > 2000 and orange.sum() > 500
    assert (pixels < 0.9).any(axis=2).mean() > 0.03  # not a blank page
