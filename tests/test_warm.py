"""mgg.apps.warm: the background import runs, restores the switch interval, and can be turned off."""
import sys

from mgg.apps.warm import warm_imports


def test_background_import_restores_the_switch_interval(monkeypatch):
    monkeypatch.delenv("MGG_NO_WARM_IMPORTS", raising=False)
    before = sys.getswitchinterval()
    t = warm_imports(("json", "mgg.version"))
    assert t is not None
    t.join(30)
    assert not t.is_alive() and "mgg.version" in sys.modules
    assert sys.getswitchinterval() == before


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("MGG_NO_WARM_IMPORTS", "1")
    assert warm_imports(("json",)) is None
