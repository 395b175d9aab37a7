"""`tftrain.errors.check_int`: the one integer check every argument goes through."""

import pytest

from tftrain.errors import ConfigError, check_int


def test_the_one_integer_check_says_the_bound_and_the_value():
    assert check_int(3, "steps") == 3 and check_int(None, "steps", none_ok=True) is None
    for bad in (0, True, 2.0, "3"):
        with pytest.raises(ValueError, match=f"steps must be an integer >= 1. Received: steps={bad!r}."):
            check_int(bad, "steps")
    with pytest.raises(ConfigError, match=r"port must be an integer in 1\.\.65535 or None\. Received: port=70000\."):
        check_int(70000, "port", maximum=65535, error=ConfigError, none_ok=True)
