"""The pages say one thing about root (issue 51, point 10): the SSH user needs docker access, and the
fence and the secrets need root, passwordless sudo or sudo with the password given on the hosts
(bootstrap/remote/become.py, issue 63). No page says sudo is never needed."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DENIALS = re.compile(r"(never (asks for|needs|uses|runs) (sudo|root)|no sudo (is )?needed|sudo is not needed|"
                     r"without (sudo|root)(?! or)|does not need (sudo|root)|doesn't need (sudo|root))", re.I)


def test_no_page_says_sudo_is_not_needed():
    said = [f"{p.relative_to(ROOT)}: {m[0]}" for p in PAGES for m in DENIALS.finditer(p.read_text())]
    assert said == [], said


def test_the_code_needs_sudo_where_the_pages_say():
    fence = (ROOT / "bootstrap" / "cluster" / "guard" / "fence.py").read_text()
    secrets = (ROOT / "bootstrap" / "cluster" / "guard" / "secretstore.py").read_text()
    ssh = (ROOT / "bootstrap" / "remote" / "become.py").read_text()
    assert "sudo -n" in fence and "sudo -n" in secrets
    assert "exec sudo -n" in ssh and "sudo -A" in ssh  # run_as_root: sudo -n, or sudo with the password


def test_host_requirements_name_root_or_passwordless_sudo():
    """Each page that lists what the hosts need names docker access and root or passwordless sudo."""
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = " ".join(page.read_text().split())
        assert re.search(r"root or passwordless `?sudo", text), page.name
        assert "allowed to run `docker`" in text, page.name
