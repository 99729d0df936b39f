"""The horizon schedule: stage boundaries, statelessness (the resume property), parsing, errors."""
import random

import pytest

import schedule
from schedule import fixed, parse, stepwise


def test_fixed_is_constant():
    s = fixed(20)
    assert [s.max_turns(k) for k in (0, 1, 99, 100, 10**6)] == [20] * 5
    assert s(7) == 20  # callable form
    assert s.describe() == "all steps: 20 turns"


def test_stepwise_boundaries():
    s = stepwise([10, 20, 30], 100)
    expected = {0: 10, 1: 10, 99: 10, 100: 20, 101: 20, 199: 20, 200: 30, 299: 30, 300: 30, 10**6: 30}
    assert {k: s.max_turns(k) for k in expected} == expected
    # stage length 1: every step is a new stage until the last budget
    assert [stepwise([6, 13, 20], 1).max_turns(k) for k in range(5)] == [6, 13, 20, 20, 20]
    # equal neighbouring budgets are allowed (non-decreasing)
    assert [stepwise([5, 5, 8], 2).max_turns(k) for k in range(7)] == [5, 5, 5, 5, 8, 8, 8]


def test_describe_one_line_table():
    assert stepwise([10, 20, 30], 100).describe() == "steps 0-99: 10 turns | 100-199: 20 | 200+: 30"
    assert stepwise([8, 12, 15], 80).describe() == "steps 0-79: 8 turns | 80-159: 12 | 160+: 15"
    assert stepwise([7], 50).describe() == "steps 0+: 7 turns"


def test_resume_gives_the_same_budget_in_any_call_order():
    # The original kept a counter restored off by one after resume; here max_turns(k) is a pure function.
    s = stepwise([6, 13, 20], 100)
    steps = list(range(0, 401))
    in_order = [s.max_turns(k) for k in steps]
    shuffled = steps[:]
    random.Random(0).shuffle(shuffled)
    by_shuffle = {k: s.max_turns(k) for k in shuffled}
    assert [by_shuffle[k] for k in steps] == in_order
    # a "resumed" run rebuilds the schedule from its command-line spec and starts at step k
    for k in (99, 100, 150, 200, 250):
        resumed = parse(s.spec())
        assert [resumed.max_turns(j) for j in range(k, 401)] == in_order[k:]


@pytest.mark.parametrize("spec, expected", [
    ("20", fixed(20)),
    (" 20 ", fixed(20)),
    ("10,20,30@100", stepwise([10, 20, 30], 100)),
    ("6,13,20@100", stepwise([6, 13, 20], 100)),
    ("15@80", stepwise([15], 80)),
])
def test_parse(spec, expected):
    assert parse(spec) == expected


@pytest.mark.parametrize("s", [fixed(1), fixed(30), stepwise([10, 20, 30], 100), stepwise([8, 12, 15], 80),
                               stepwise([5, 5], 3)])
def test_parse_round_trip(s):
    assert parse(s.spec()) == s
    assert parse(s.spec()).spec() == s.spec()


FORM_HINT = "e.g. '20' or '10,20,30@100'"


@pytest.mark.parametrize("make, message", [
    (lambda: fixed(0), "turn budget must be a positive integer, got 0"),
    (lambda: fixed(-3), "turn budget must be a positive integer, got -3"),
    (lambda: fixed(2.5), "turn budget must be a positive integer, got 2.5"),
    (lambda: fixed(True), "turn budget must be a positive integer, got True"),
    (lambda: stepwise([10, 0, 30], 100), "each turn budget must be a positive integer, got 0"),
    (lambda: stepwise([20, 10], 100), r"turn budgets must not decrease .* got \[20, 10\]"),
    (lambda: stepwise([10, 20], 0), "stage length must be a positive integer, got 0"),
    (lambda: stepwise([10, 20], -5), "stage length must be a positive integer, got -5"),
    (lambda: stepwise([], 100), "at least one turn budget"),
    (lambda: parse("abc"), "cannot parse horizon schedule 'abc'"),
    (lambda: parse(""), "cannot parse horizon schedule ''"),
    (lambda: parse("10;20@100"), "cannot parse horizon schedule '10;20@100'"),
    (lambda: parse("10,20@"), r"cannot parse horizon schedule '10,20@'"),
    (lambda: parse("10,20,30"), "lists several budgets but no '@STEPS' stage length"),
    (lambda: parse("30,20,10@100"), "must not decrease"),
    (lambda: parse("0"), "must be a positive integer, got 0"),
    (lambda: parse("10,20@0"), "stage length must be a positive integer, got 0"),
])
def test_invalid_schedules_say_what_is_wrong_and_the_form(make, message):
    with pytest.raises(ValueError, match=message) as info:
        make()
    assert FORM_HINT in str(info.value)


def test_negative_step_is_refused():
    with pytest.raises(ValueError, match="step must be >= 0"):
        stepwise([10, 20], 5).max_turns(-1)


def test_schedule_is_immutable():
    s = stepwise([10, 20], 5)
    with pytest.raises(AttributeError):
        s.stage_length = 7  # frozen: nothing can carry state between calls
    assert isinstance(s, schedule.Schedule)
