"""core/validate: each check names the owner, the field and what is allowed."""

import pytest

from decodelab.core.validate import ConfigError, check_int_list


def test_int_list_takes_any_ints_in_range_not_only_powers_of_two():
    check_int_list("Cfg", "k_values", [1, 3, 6, 1000], 1, 1024)
    check_int_list("Cfg", "k_values", (5,), 1, 1024)


@pytest.mark.parametrize(("values", "match"), [
    ([], r"Cfg\.k_values=\[\]: must be a non-empty list"),
    (4, r"Cfg\.k_values=4: must be a non-empty list"),
    ([1, 0], r"Cfg\.k_values\[\]=0: must be an integer in \[1, 8\]"),
    ([1, 9], r"Cfg\.k_values\[\]=9: must be an integer in \[1, 8\]"),
    ([1, 2.0], r"Cfg\.k_values\[\]=2\.0 \(float\)"),
    ([True], r"Cfg\.k_values\[\]=True \(bool\)"),
])
def test_int_list_names_the_bad_value(values, match):
    with pytest.raises(ConfigError, match=match):
        check_int_list("Cfg", "k_values", values, 1, 8)
