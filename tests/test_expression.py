"""The expression language of transform/assert: precedence, paths, functions, errors."""

from __future__ import annotations

import pytest

from orch8_py import expression
from orch8_py.expression import ExpressionError, evaluate
from orch8_py.handlers import StepError

SCOPE = {
    "data": {
        "plan": "pro",
        "n": 5,
        "items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 3}],
        "tags": ["x", "y"],
        "nothing": None,
        "weird key": 1,
        "in": "kw-key",
    },
    "config": {"limit": 10, "currency": "EUR"},
    "runtime": {"attempt": 2},
    "outputs": {"step1": {"json": {"x": 42, "list": [1, 2, 3]}, "status": 200}},
}


def ev(text):
    return evaluate(text, SCOPE)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("10 - 4 - 3", 3),  # left associative
        ("2 * 3 % 4", 2),
        ("7 / 2", 3.5),
        ("-2 * -3", 6),
        ("- (1 + 2)", -3),
        ("1 + 2 == 3", True),
        ("1 < 2 and 2 < 1 or true", True),  # and binds tighter than or
        ("not 1 == 2", True),  # not binds looser than comparison
        ("not true or true", True),
        ("true || false && false", True),
        ("!false", True),
        ("'a' + \"b\"", "ab"),
        ("[1, 2] + [3]", [1, 2, 3]),
        ("[]", []),
        ("null", None),
        ("1.5e2", 150.0),
        ("{total: data.n * 2, 'k': [1]}", {"total": 10, "k": [1]}),
    ],
)
def test_operators_and_precedence(text, expected):
    assert ev(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("data.plan", "pro"),
        ("data.items[1].qty", 3),
        ("data.items[-1].sku", "b"),
        ('data["weird key"]', 1),
        ("data.in", "kw-key"),
        ("outputs.step1.json.x", 42),
        ("outputs['step1'].json.list[data.n - 4]", 2),
        ("config.limit", 10),
        ("runtime.attempt", 2),
        ("data.nothing", None),
        ("{{ data.plan }}", "pro"),
    ],
)
def test_paths(text, expected):
    assert ev(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("len(data.items)", 2),
        ("len('abc')", 3),
        ("len(outputs.step1)", 2),
        ("upper(data.plan)", "PRO"),
        ("lower('ÀB')", "àb"),
        ("str(12)", "12"),
        ("str(true)", "true"),
        ("str(null)", "null"),
        ("str([1, 'a'])", '[1,"a"]'),
        ("int('42')", 42),
        ("int(3.9)", 3),
        ("int('2.5')", 2),
        ("float('1.25')", 1.25),
        ("float(2)", 2.0),
        ("round(2.5)", 3),
        ("round(-2.5)", -3),
        ("round(1.005, 2)", 1.01),
        ("min(3, 1, 2)", 1),
        ("max([4, 9, 2])", 9),
        ("max('a', 'c')", "c"),
        ("sum([data.items[0].qty, data.items[1].qty])", 5),
        ("sum([])", 0),
        ("contains(data.tags, 'y')", True),
        ("contains('hello', 'ell')", True),
        ("contains(outputs.step1, 'json')", True),
        ("contains([{'a': 1}], {'a': 1})", True),
        ("'x' in data.tags", True),
        ("'z' not in data.tags", True),
        ("coalesce(data.nothing, data.missing, config.currency)", "EUR"),
        ("coalesce(data.missing.deeper, 0)", 0),
        ("coalesce(null)", None),
    ],
)
def test_functions(text, expected):
    assert ev(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true == 1", False),  # booleans are not numbers
        ("1 == 1.0", True),
        ("[1, {'a': 'b'}] == [1, {'a': 'b'}]", True),
        ("null == false", False),
        ("'a' < 'b'", True),
        ("data.plan != 'free'", True),
    ],
)
def test_equality_is_json_equality(text, expected):
    assert ev(text) is expected


def test_truthiness():
    for falsy in (None, False, 0, 0.0, "", [], {}):
        assert expression.truthy(falsy) is False
    for true in (True, 1, -1, "0", [0], {"a": None}):
        assert expression.truthy(true) is True


def test_compiled_expression_is_reusable():
    compiled = expression.compile("data.n * 2")
    assert compiled.evaluate({"data": {"n": 2}}) == 4
    assert compiled.evaluate({"data": {"n": 21}}) == 42


def error(text, scope=SCOPE) -> ExpressionError:
    with pytest.raises(ExpressionError) as info:
        evaluate(text, scope)
    err = info.value
    assert isinstance(err, StepError)
    assert err.retryable is False
    assert err.code == "expression_error"
    return err


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("1 +", 3, "unexpected end of expression"),
        ("(1 + 2", 6, "expected ')'"),
        ("1 2", 2, "unexpected '2'"),
        ("'abc", 0, "unterminated string"),
        ("a == 1", 0, "unknown name 'a'"),
        ("data.a = 1", 7, "'=='"),
        ("1 < 2 < 3", 6, "cannot be chained"),
        ("data..x", 5, "expected a name after '.'"),
        ("1 # 2", 2, "unexpected character '#'"),
        ("plan == 'pro'", 0, "unknown name 'plan'"),
        ("nosuch(1)", 0, "unknown function 'nosuch'"),
        ("[1, 2", 5, "expected ',' or ']'"),
        ("{'a': 1, 'a': 2}", 9, "duplicate key"),
        ("", 0, "empty expression"),
    ],
)
def test_syntax_errors_name_the_position(text, position, fragment):
    err = error(text)
    assert err.position == position
    assert fragment in str(err)
    assert repr(text) in str(err) or text == ""
    assert f"at position {position}" in str(err)


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("data.missing", 5, "data has no key 'missing'"),
        ("data.items[5].sku", 10, "has no index 5"),
        ("data.plan.x", 10, "data.plan is a string, it has no key 'x'"),
        ("data.n[0]", 6, "data.n is number, it has no [0]"),
        ("outputs.nostep.json", 8, "outputs has no key 'nostep'"),
        ("data.n + 'a'", 7, "cannot add number and string"),
        ("data.n / 0", 7, "division by zero"),
        ("'a' < 1", 4, "cannot compare"),
        ("len(5)", 0, "len() of a number"),
        ("min([])", 0, "empty list"),
        ("int('abc')", 0, "not a number"),
        ("upper(1)", 0, "upper() of a number"),
        ("round(1, 2, 3)", 0, "takes 1 to 2 argument(s)"),
        ("data.items['a']", 10, "index it with an integer"),
        ("-data.plan", 0, "expected a number"),
    ],
)
def test_evaluation_errors_name_the_path_and_position(text, position, fragment):
    err = error(text)
    assert err.position == position
    assert fragment in str(err)


def test_unknown_root_in_scope():
    err = error("outputs.a", {"data": {}})
    assert "unknown root 'outputs'" in str(err)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "data.__class__",
        "data.__class__.__mro__",
        "data['__class__']",  # a plain key lookup, which simply does not exist
        "''.join(data.tags)",
        "'a'.__class__",
        "(data).plan",
        "len.__self__",
        "lambda: 1",
        "eval('1')",
        "exec('1')",
        "getattr(data, 'x')",
        "[x for x in data.tags]",
        "data.plan; data.n",
        "open('/etc/passwd')",
        "1 if true else 2",
    ],
)
def test_python_escapes_are_refused(text):
    err = error(text)
    assert err.retryable is False


def test_limits():
    assert evaluate("(" * 50 + "1" + ")" * 50, {}) == 1
    err = error("(" * 51 + "1" + ")" * 51, {})
    assert "nesting deeper than 50" in str(err)
    err = error("not " * 60 + "true", {})
    assert "nesting" in str(err)
    err = error("1" + " + 1" * 600, {})
    assert "over the limit of 2000" in str(err)
    # a long flat chain within the length limit evaluates without deep recursion
    assert evaluate("1" + "+1" * 900, {}) == 901
    err = error("99999999999999999999" + " * 99999999999999999999" * 80, {})
    assert "too large" in str(err)
    err = error("1e999", {})
    assert "out of range" in str(err)


def test_big_strings_are_bounded():
    big = "x" * (600 * 1024)
    err = error("data.s + data.s", {"data": {"s": big}})
    assert "longer than" in str(err)
