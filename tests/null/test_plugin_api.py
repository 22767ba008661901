"""The stable plugin API is pinned: tests/golden/plugin_api.txt holds the signature of every
object marked ``@stable`` (NOTE [Stable plugin API] in evtc/plugin/stable.py). A change shows up
here as a diff; rerun with --accept-golden when it is intended, and bump FRAGMENT_VERSION when it
breaks a consumer (docs/plugin.md, "Versioning")."""

import evtc.plugin


def test_stable_api_is_pinned(golden):
    golden("plugin_api.txt", evtc.plugin.signatures())


def test_everything_exported_is_stable():
    api = evtc.plugin.stable_api()
    for name in ("lower", "EpilogueFragment", "Parameter", "Placeholder"):
        obj = getattr(evtc.plugin, name)
        assert getattr(obj, "__evtc_stable__", None) == 1, name
        assert any(o is obj for o, _ in api.values()), name
    assert api["evtc.plugin.fragment.FRAGMENT_VERSION"] == (evtc.plugin.FRAGMENT_VERSION, 1)


def test_signature_text_shows_a_change():
    """The golden text would notice a new argument: the text of a function differs when its
    signature does."""
    text = evtc.plugin.signatures()
    assert "def evtc.plugin.lowering.lower(epilogue: 'Any', *, arch: 'str' = 'sm90', tile: 'Any'" in text
    assert "class evtc.plugin.fragment.EpilogueFragment  # stable since 1" in text
    assert "    def check(self, *, tile: 'Any' = None" in text
    assert "    smem_bytes: int" in text
