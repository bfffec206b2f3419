"""The documentation site builds in strict mode (a warning or a broken link fails), and what the
README and the site point at exists: the README's relative links and their anchors, every public
name of ``fedjax_dp`` in the API reference, every notebook among the tutorials. A slow test opens
the built site in headless Chromium, as a reader would."""

import functools
import http.server
import importlib.util
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SITE_PACKAGES = ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter")


def _missing(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is None
  except ModuleNotFoundError:
    return True


def _build_site(site: pathlib.Path) -> pathlib.Path:
  """Builds the site into ``site`` with ``mkdocs build --strict`` (skips when the documentation
  tools are not installed; fails on any warning) and returns ``site``."""
  missing = [name for name in SITE_PACKAGES if _missing(name)]
  if missing:
    pytest.skip(f"the documentation tools are not installed ({', '.join(missing)}): "
                "pip install -e '.[docs]'")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), NO_MKDOCS_2_WARNING="1")
  proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                         str(site)], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return site


def test_mkdocs_build_strict(tmp_path):
  site = _build_site(tmp_path / "site")
  for page in ("index.html", "reference/api/index.html", "reference/cli/index.html",
               "tutorials/byzantine/index.html", "papers/zhu2022/index.html"):
    assert (site / page).stat().st_size > 0, page
  cli = (site / "reference/cli/index.html").read_text()
  assert "--target-epsilon" in cli and "--mechanism" in cli  # run's and audit's help
  assert "dp-rsa-f" in (site / "reference/algorithms/index.html").read_text()


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading (as the site's toc slugify writes it)."""
  text = re.sub(r"[`*]", "", heading.strip()).lower()
  return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set:
  text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
  return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def _relative_links(path: pathlib.Path) -> list:
  text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
  links = re.findall(r"\]\(([^)\s]+)\)", text)
  return [l for l in links if not re.match(r"[a-z]+:", l) and not l.startswith("#")]


def test_readme_links_point_at_files_and_headings_that_exist():
  links = _relative_links(README)
  assert any(l.startswith("docs/") for l in links)
  for link in links:
    path, _, anchor = link.partition("#")
    target = ROOT / path
    assert target.exists(), f"README links to {link}, which does not exist"
    if anchor:
      assert anchor in _anchors(target), f"README links to {link}: no such heading"


def test_readme_links_every_page_of_the_site():
  """Every page in the site's navigation is one link away from the README."""
  nav = re.findall(r"^\s*- (?:[^:\n]+: )?([\w./-]+\.(?:md|ipynb))$",
                   (ROOT / "mkdocs.yml").read_text(), re.M)
  linked = {l.partition("#")[0] for l in _relative_links(README)}
  pages = {f"docs/{p}" for p in nav if p.endswith(".md") and not p.startswith("benchmarks/")}
  assert pages - linked <= {"docs/index.md", "docs/papers/index.md"}, pages - linked


def test_api_reference_documents_every_public_name():
  import fedjax_dp  # pylint: disable=import-outside-toplevel
  api = (ROOT / "docs" / "reference" / "api.md").read_text()
  directives = set(re.findall(r"^::: ([\w.]+)$", api, re.M))
  for name, (module, attribute) in fedjax_dp._EXPORTS.items():  # pylint: disable=protected-access
    target = module if attribute is None else f"{module}.{attribute}"
    assert target in directives, f"fedjax_dp.{name} ({target}) is not in the API reference"
  assert "__version__" in api and set(fedjax_dp.__all__) == {"__version__", *fedjax_dp._EXPORTS}


def test_every_notebook_is_a_tutorial():
  nav = (ROOT / "mkdocs.yml").read_text()
  for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
    page = ROOT / "docs" / "tutorials" / notebook.name
    assert page.resolve() == notebook.resolve(), f"{page} should link to {notebook}"
    assert f"tutorials/{notebook.name}" in nav, f"{notebook.name} is not in the site's navigation"


# The pages a reader opens first: the home page, a tutorial (a notebook rendered with its
# committed outputs) and the Python API reference (mkdocstrings).
READER_PAGES = {"home": "", "tutorial": "tutorials/privacy_utility/", "api": "reference/api/"}
CHROMIUM_NAMES = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")


def _chromium() -> str:
  """The Chromium to drive: ``$FEDJAX_DP_CHROMIUM``, else the first of :data:`CHROMIUM_NAMES`
  on the ``PATH``; skips when there is none or when Playwright is not installed."""
  if _missing("playwright"):
    pytest.skip("Playwright is not installed: pip install -e '.[docs]'")
  named = os.environ.get("FEDJAX_DP_CHROMIUM")
  found = shutil.which(named) if named else next(
      filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
  if not found:
    pytest.skip(f"no Chromium found ({named or ', '.join(CHROMIUM_NAMES)} on the PATH): "
                "apt-get install chromium, or set FEDJAX_DP_CHROMIUM to its executable")
  return found


class _QuietHandler(http.server.SimpleHTTPRequestHandler):

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args


@pytest.mark.slow
def test_site_opens_in_a_browser_without_errors(tmp_path):
  """The home page, a tutorial and the API reference load in headless Chromium, served over
  http as a reader's browser gets them, with no console error, no uncaught exception and no
  failed request (a status of 400 or more, or a network failure). Screenshots of each page go to
  ``$FEDJAX_DP_SCREENSHOTS`` (default: the test's temporary folder), to look at."""
  chromium = _chromium()
  site = _build_site(tmp_path / "site")
  shots = pathlib.Path(os.environ.get("FEDJAX_DP_SCREENSHOTS") or tmp_path / "screenshots")
  shots.mkdir(parents=True, exist_ok=True)
  from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
  server = http.server.ThreadingHTTPServer(
      ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
  threading.Thread(target=server.serve_forever, daemon=True).start()
  base = f"http://127.0.0.1:{server.server_address[1]}/"
  problems = []
  try:
    with sync_playwright() as playwright:
      browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
      page = browser.new_page(viewport={"width": 1280, "height": 900})
      page.on("console", lambda msg: msg.type == "error" and problems.append(
          f"console error: {msg.text} ({msg.location.get('url')})"))
      page.on("pageerror", lambda error: problems.append(f"uncaught exception: {error}"))
      page.on("requestfailed", lambda request: problems.append(
          f"request failed: {request.url} ({request.failure})"))
      page.on("response", lambda response: response.status >= 400 and problems.append(
          f"HTTP {response.status}: {response.url}"))
      for name, path in READER_PAGES.items():
        response = page.goto(base + path, wait_until="networkidle")
        assert response is not None and response.ok, f"{path}: {response and response.status}"
        assert page.locator("article").count() > 0, f"{path}: no article on the page"
        page.screenshot(path=str(shots / f"{name}.png"))
      browser.close()
  finally:
    server.shutdown()
    server.server_close()
  print(f"screenshots in {shots}")
  assert not problems, "\n".join(problems)


def test_every_exported_callable_states_its_arguments():
  """A function or class that ``fedjax_dp`` exports and that takes arguments has an ``Args:``
  (or, for a record type, ``Attributes:``) section in its docstring as it reads at run time."""
  import fedjax_dp  # pylint: disable=import-outside-toplevel
  missing = []
  for name in fedjax_dp.__all__:
    obj = getattr(fedjax_dp, name)
    if inspect.ismodule(obj) or not callable(obj):
      continue
    params = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
    if params and not re.search(r"^(Args|Attributes):", inspect.getdoc(obj) or "", re.M):
      missing.append(name)
  assert not missing, f"exported without an Args or Attributes section: {missing}"
