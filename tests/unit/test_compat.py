"""tftrain/_compat.py: the installed TensorFlow and Keras are versions its private uses were checked on."""

from tftrain import _compat


def test_the_installed_versions_are_the_checked_ones():
    assert _compat.check_versions() is None, _compat.check_versions()


def test_a_version_outside_them_is_one_line_naming_the_package_and_the_fix():
    line = _compat.check_versions({"tensorflow": "2.21.0", "keras": "3.16.0"})
    assert line == ("keras 3.16.0 is not a version tftrain was checked on (3.15); its use of keras's internals "
                    "(tftrain/_compat.py) may not hold: install keras==3.15.*")


def test_no_other_module_reaches_into_keras_or_tensorflow_internals():
    import re

    from tests.conftest import REPO

    private = re.compile(r"keras\.src|tensorflow\.python|sys\._getframe|\.f_locals|\b(?:model|optimizer|handler)"
                         r"\._(?!_|tftrain)[a-z]")  # (an attribute of tftrain's own on a model is fine)
    found = [f"{path.relative_to(REPO)}:{number}" for path in sorted((REPO / "tftrain").rglob("*.py"))
             if path.name != "_compat.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if private.search(line.split("#")[0]) and not line.lstrip().startswith(("#", "Source:", "`"))]
    assert found == [], found
