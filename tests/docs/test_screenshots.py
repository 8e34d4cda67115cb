"""The site as a reader sees it: built with `mkdocs build --strict`, served over HTTP, and opened in headless
Chromium. For the home page, the CLI reference and the inventory page, a screenshot that is a page, not a blank
(the size asked for, the theme's indigo header, text and drawing over the white), the DOM Chromium rendered
with the page's real content (the three commands and the diagram, every option of `serve`, the Native and
Ansible tabs), mkdocs-material's stylesheet and script at work (its header, the copy buttons its script adds),
and no request of the page's answered with an error (a missing stylesheet, image or script fails).

scripts/dev-setup.sh installs chromium (Debian's package), so CI never skips this; the screenshots are kept under
pytest's temporary directory (the paths are printed: `pytest -s` shows them)."""
import functools
import html
import http.server
import re
import shutil
import subprocess
import threading
from pathlib import Path

import click
import pytest

from bootstrap.cli import main
from tests.support.docsite import build_site

ROOT = Path(__file__).resolve().parents[2]
#: name -> the page's path on the site
PAGES = {"home": "", "cli": "cli/", "inventory": "inventory/"}
WIDTH, HEIGHT = 1280, 1600
#: seconds for one Chromium run (it takes 2-3 s on a 2-core machine)
CALL_TIMEOUT = 60
#: mkdocs-material's primary colour (indigo), the header's
INDIGO = (64, 81, 181)

# One worker runs these tests, one after the other: one Chromium at a time, one build of the site.
pytestmark = pytest.mark.xdist_group("chromium")


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser"):  # Debian's package installs `chromium`
        if found := shutil.which(name):
            return found
    pytest.skip("chromium is not installed (scripts/dev-setup.sh installs it: apt-get install chromium)")


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves the built site, never from the browser's cache (each page's requests are all seen here);
    remembers (path, status) of every request instead of logging it."""

    requests: list = []

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_request(self, code="-", size="-"):
        self.requests.append((self.path.split("?")[0], int(code)))

    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(base URL, the requests it answered) of the site built once and served on an ephemeral port."""
    out = build_site(tmp_path_factory.mktemp("site"))
    handler = type("Handler", (_Handler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", handler.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Runs headless Chromium with its own throwaway profile: browser(*flags, url) -> stdout."""
    binary = chromium_binary()
    profile = tmp_path_factory.mktemp("chromium-profile")

    def run(*args: str) -> str:
        cmd = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CALL_TIMEOUT)
        assert r.returncode == 0, f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-2000:]}"
        return r.stdout

    return run


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("screenshots")


def png_facts(path: Path):
    """(width, height), [(count, colour)] of every colour, and the colours of a few points of the header."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow (matplotlib needs it: the test extra installs it)")
    with Image.open(path) as im:
        rgb = im.convert("RGB")
        header = [rgb.getpixel((x, y)) for y in (4, 40) for x in (300, 640, 900)]
        return rgb.size, rgb.getcolors(rgb.width * rgb.height), header


def text_of(dom: str) -> str:
    """The page's text: tags dropped (highlighting splits a command into spans), entities read, spaces joined."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", body)).split())


@pytest.mark.parametrize("name", list(PAGES))
def test_screenshot_is_a_page_not_a_blank(name, browser, site, shots):
    base, requests = site
    png = shots / f"{name}.png"
    del requests[:]
    browser("--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={png}", base + PAGES[name])
    print(f"\nscreenshot of {base + PAGES[name]}: {png}")
    assert png.is_file() and png.stat().st_size > 0, f"{name}: Chromium wrote no screenshot"
    size, colours, header = png_facts(png)
    assert size == (WIDTH, HEIGHT)
    most, background = max(colours)
    drawn = 1 - most / (WIDTH * HEIGHT)
    # a page of text and code covers 15-30 % of the window; an error page or a blank one well under 1 %
    assert drawn >= 0.08, f"{name}: {drawn:.1%} of the screenshot differs from its background {background}"
    assert len(colours) >= 200, f"{name}: {len(colours)} colours: no text rendered"
    # the theme's stylesheet applied: its header is indigo across the top of the window
    assert all(max(abs(a - b) for a, b in zip(p, INDIGO)) <= 24 for p in header), \
        f"{name}: the header is {header}, not mkdocs-material's indigo: its stylesheet did not apply"
    failed = sorted({(path, code) for path, code in requests if code >= 400})
    assert failed == [], f"{name}: requests the site could not answer: {failed}"


def dom_of(name, site, browser) -> str:
    base, requests = site
    del requests[:]
    dom = browser("--dump-dom", base + PAGES[name])
    failed = sorted({(path, code) for path, code in requests if code >= 400})
    assert failed == [], f"{name}: requests the site could not answer: {failed}"
    paths = [path for path, _ in requests]
    assert any(re.fullmatch(r"/assets/stylesheets/main\.[0-9a-f]+\.min\.css", p) for p in paths), paths
    assert any(re.fullmatch(r"/assets/javascripts/bundle\.[0-9a-f]+\.min\.js", p) for p in paths), paths
    # mkdocs-material's layout, and its script ran: it adds a copy button to every code block
    assert 'class="md-header' in dom and 'class="md-content' in dom, f"{name}: not the material layout"
    assert 'title="Copy to clipboard"' in dom, f"{name}: no copy button: mkdocs-material's script did not run"
    return dom


def test_home_page_shows_the_three_commands_and_the_diagram(browser, site):
    dom = dom_of("home", site, browser)
    text = text_of(dom)
    for cmd in ("bootstrap up -i hosts.yaml", "bootstrap check-nccl -i hosts.yaml", "bootstrap serve -i hosts.yaml"):
        assert cmd in text, cmd
    assert re.search(r'<img [^>]*src="img/overview\.svg"', dom), "the diagram's <img>"
    assert "/img/overview.svg" in [path for path, _ in site[1]], "the browser did not fetch the diagram"
    assert 'class="admonition tip"' in dom
    for section in ("Users", "Operators", "Contributors"):  # the navigation's tabs
        assert re.search(rf'class="md-tabs__link"[^>]*>\s*{section}\s*</a>', dom), section


def test_cli_reference_lists_every_option_of_serve(browser, site):
    dom = dom_of("cli", site, browser)
    assert "Sentinel" not in dom and "UNSET" not in dom
    serve = main.commands["serve"]
    options = [o for p in serve.params if isinstance(p, click.Option) and not p.hidden
               for o in (*p.opts, *p.secondary_opts)]
    assert len(options) >= 10
    start = dom.index('id="bootstrap-serve"')
    block = dom[start:dom.index("<h3", start)]
    missing = [o for o in options if not re.search(rf"<code[^>]*>{re.escape(o)}</code>", block)]
    assert missing == [], f"bootstrap serve's options missing from the reference: {missing}"
    # docs/js/extra.js ran: a flag in a table is kept on one line, never shown as "- -json"
    assert '<code class="unbroken">--json</code>' in dom


def test_inventory_page_has_the_native_and_ansible_tabs(browser, site):
    dom = dom_of("inventory", site, browser)
    labels = re.findall(r'<label for="__tabbed_\d+_\d+"[^>]*>(.*?)</label>', dom, re.S)
    assert [text_of(x) for x in labels[:2]] == ["Native", "Ansible"], labels
    text = text_of(dom)
    assert "ansible_host" in text and "all.vars.bootstrap" in text
    assert "hosts: - name: gpu-a" in text  # the native form's code rendered
