"""tftrain/_compat.py: the installed TensorFlow and Keras are versions its private uses were checked on."""

from tftrain import _compat


def test_the_installed_versions_are_the_checked_ones():
    assert _compat.check_versions() is None, _compat.check_versions()


def test_a_version_outside_them_is_one_line_naming_the_package_and_the_fix():
    line = _compat.check_versions({"tensorflow": "2.21.0", "keras": "3.16.0"})
    assert line == ("keras 3.16.0 is not a version tftrain was checked on (3.15); its use of keras's internals "
                    "(tftrain/_compat.py) may not hold: install keras==3.15.*")
