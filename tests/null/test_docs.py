"""The documentation cannot drift: generated pages and figures are current, every error anchor
exists, and every error footer in the docs has today's form."""

import importlib.util
import re
from pathlib import Path

import pytest

import evtc
import evtc.errors as errors

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", DOCS / "gen_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_docs_are_current():
    """docs/language.md, the planner's pictures and every gen block in the pages are what evtc
    prints and draws now (run `python docs/gen_docs.py` after changing what they show)."""
    gen = _gen_docs()
    stale = [str(p.relative_to(ROOT)) for p in gen.stale()]
    assert not stale, f"out of date: {stale}; run: python docs/gen_docs.py"


def test_gen_blocks_are_checked():
    """The check would notice a wrong figure."""
    gen = _gen_docs()
    page = '<!-- gen: gemm("bias_relu").plan.epilogue_smem_bytes -->1<!-- /gen -->'
    assert gen.render_page(page) != page
    assert str(evtc.Gemm(gen.E.bias_relu).plan.epilogue_smem_bytes) in gen.render_page(page)


def test_every_error_anchor_has_a_section():
    headings = set(re.findall(r"^## (\S+)$", (DOCS / "errors.md").read_text(), re.M))
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.EvtcError)]
    anchors = {c.anchor for c in classes}
    used = set(re.findall(r'anchor="([\w-]+)"', "".join(p.read_text() for p in (ROOT / "evtc").rglob("*.py"))))
    missing = sorted((anchors | used) - headings)
    assert not missing, missing


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_error_footers_have_todays_form(page):
    text = (DOCS / page).read_text()
    headings = set(re.findall(r"^## (\S+)$", (DOCS / "errors.md").read_text(), re.M))
    for line in text.splitlines():
        m = re.search(r"see docs/errors\.md#([\w-]+)(.*)$", line)
        if m and not line.lstrip().startswith(("every", "Every")):
            anchor, rest = m.groups()
            assert rest == f", or run: evtc errors {anchor}", line
            assert anchor in headings, line
    footer = str(evtc.PlanError("x", anchor="plan")).splitlines()[-1]
    assert footer == "  see docs/errors.md#plan, or run: evtc errors plan"


def test_language_page_lists_every_op():
    from evtc.language import entries

    text = (DOCS / "language.md").read_text()
    for e in entries():
        assert f"`{e.text}`".replace("|", "\\|") in text, e


def _table(markdown: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line starts with ``header``."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split(" | ")])
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_ir_op_table_matches_the_op_table():
    """docs/ir.md's hand-annotated op table names every op once, with its arity and functor."""
    from evtc import ops

    seen = {}
    for op_cell, arity, functor_cell, *_ in _table((DOCS / "ir.md").read_text(), "| op | arity | functor"):
        names = _names(op_cell)
        functors = _names(functor_cell)
        for k, name in enumerate(names):
            assert name not in seen, name
            seen[name] = (int(arity), functors[k] if k < len(functors) else None)
    assert set(seen) == set(ops.OPS), sorted(set(ops.OPS) ^ set(seen))
    for name, (arity, functor) in seen.items():
        op = ops.OPS[name]
        assert arity == op.arity, name
        # a cell lists "evtc::Exp, Log, ...": the namespace is written once
        assert op.functor.endswith(functor), (name, functor, op.functor)


def test_ir_dtype_table_matches_dtypes():
    from evtc import dtypes

    rows = _table((DOCS / "ir.md").read_text(), "| name | bits | CUTLASS | torch")
    assert [_names(r[0])[0] for r in rows] == [d.name for d in dtypes.ALL]
    for r, d in zip(rows, dtypes.ALL):
        assert int(r[1]) == d.bits and _names(r[2]) == [d.cutlass] and _names(r[3]) == [d.torch], r
        assert float(r[4]) == pytest.approx(d.max, rel=5e-3) and int(r[5]) == d.mantissa_bits, r


def _nav_pages() -> list[str]:
    """The pages of mkdocs.yml's nav (read as text: the test extra has no YAML parser, and the
    file's slugify tag needs mkdocs's loader)."""
    text = (ROOT / "mkdocs.yml").read_text()
    block = re.search(r"^nav:\n((?:[ \t]+.*\n)+)", text, re.M)
    assert block, "mkdocs.yml has no nav"
    return re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)\s*$", block.group(1), re.M)


def test_every_docs_page_is_in_the_nav():
    """A page outside the nav is only reachable by a link (mkdocs says so at INFO level, which
    --strict lets through)."""
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), nav
    assert sorted(nav) == pages, {"not in the nav": sorted(set(pages) - set(nav)),
                                  "in the nav, no such page": sorted(set(nav) - set(pages))}


@pytest.mark.parametrize("listing", ["README.md", "docs/index.md"])
def test_every_docs_page_is_listed(listing):
    """The README's list of pages and the site's home page name every page."""
    text = (ROOT / listing).read_text()
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md"
               and f"`{p.name}`" not in text and f"({p.name})" not in text and f"(docs/{p.name})" not in text]
    assert not missing, f"{listing} does not list {missing}"


def test_gpu_suite_chunks_run_every_gpu_test_file():
    """`benchmarks/gpu_suite.sh chunk N/M` runs the whole GPU suite over its chunks
    (docs/testing.md): a new tests/gpu file must join a chunk."""
    text = (ROOT / "benchmarks" / "gpu_suite.sh").read_text()
    chunks = text[text.index("  case $n in"):text.index("  esac", text.index("  case $n in"))]
    run = set(re.findall(r"\$G/(test_\w+\.py)", chunks))
    files = {p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert files <= run, f"in no chunk of benchmarks/gpu_suite.sh: {sorted(files - run)}"
    n = int(re.search(r"^NCHUNKS=(\d+)$", text, re.M).group(1))
    labels = [int(x) for case in re.findall(r"^    ([\d|]+)\) ", chunks, re.M) for x in case.split("|")]
    assert labels == list(range(1, n + 1))
