"""pytest wiring of the conformance suite: implementation selection, device, methods, hypothesis profiles,
per-backend skip/xfail files, and the method/bits/dtype tags the report table is built from."""
from __future__ import annotations

import os
import pathlib
import re
import sys
import warnings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# MLX runs float32 matmuls as TF32 on CUDA by default (MLX_ENABLE_TF32): the tolerance tier is measured in full
# float32 unless the caller set the variable.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

import pytest
from hypothesis import HealthCheck, settings

from .. import spec
from ..spec import METHODS

from . import adapters, golden_format as golden

if __name__ != "veloxquant.conformance.conftest":   # one copy of the suite's modules, not two
    raise ImportError(f"the conformance suite was imported as {__name__!r}; it must be veloxquant.conformance "
                      "(installed, or in a checkout through veloxquant/conformance: tests/checkout_suite.py "
                      "maps `pytest conformance` there)")

XFAIL_DIR = pathlib.Path(__file__).resolve().parent / "xfail"
PROFILE_ENV = "VELOXQUANT_PROFILE"

_common = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                      HealthCheck.data_too_large, HealthCheck.filter_too_much])
# ci: a few examples per parametrization, derandomized so a verdict is reproducible run to run.
settings.register_profile("ci", max_examples=20, derandomize=True, **_common)
# thorough: >= 10,000 examples per parametrization (so per method), fresh randomness every run.
settings.register_profile("thorough", max_examples=10_000, **_common)
# VELOXQUANT_MAX_EXAMPLES=N caps a profile's examples (profile "<name>-maxN", shown in the header and report).


class UnmatchedXfailWarning(pytest.PytestWarning):
    """An entry of a conformance/xfail/*.toml file matched no collected test."""


def pytest_addoption(parser):
    g = parser.getgroup("veloxquant conformance")
    g.addoption("--impl", default="mlx_ops",
                help="implementation under test: reference | mlx_ops | mlx_kernels | mlx_native | module:factory")
    g.addoption("--device", choices=["cpu", "gpu"], default=None,
                help="MLX default device for MLX adapters (default: mlx's default)")
    g.addoption("--methods", default=None, help=f"comma list out of {','.join(METHODS)} (default: all)")
    g.addoption("--rules-report", default=None, metavar="PATH",
                help="write per spec rule (spec/rules.toml) passed / failed / not exercised as JSON to PATH")


MAX_EXAMPLES_ENV = "VELOXQUANT_MAX_EXAMPLES"


def pytest_configure(config):
    config.addinivalue_line("markers", "method(name): a test of one method's own rule, collected only when --methods "
                                       "selects it")
    if config.getoption("hypothesis_profile", None) is None:
        name = os.environ.get(PROFILE_ENV, "ci")
        settings.load_profile(name)
        cap = os.environ.get(MAX_EXAMPLES_ENV)
        if cap:   # a time-boxed run (e.g. thorough randomness on a GPU session): named so in the report
            capped = f"{name}-max{int(cap)}"
            settings.register_profile(capped, settings.get_profile(name), max_examples=int(cap))
            settings.load_profile(capped)
    config._vq_profile = settings.default  # the loaded profile (recorded in the report)
    impl = _load_impl(config.getoption("impl"), config.getoption("device"))
    config._vq_impl = impl
    ms = config.getoption("methods")
    if ms:
        chosen = tuple(m.strip() for m in ms.split(",") if m.strip())
        bad = [m for m in chosen if m not in METHODS]
        if bad:
            raise pytest.UsageError(f"--methods: unknown {bad}; expected names out of {list(METHODS)}")
        config._vq_methods = chosen
    else:
        config._vq_methods = METHODS


def _load_impl(name: str, device: str | None):
    """The implementation under test, or a one-line usage error: an unknown name, a factory that does not
    import, an implementation or device that cannot run here, or a reference (the oracle) that does not
    import are errors, never a green run of skips."""
    try:
        impl = adapters.load(name)
        impl.set_device(device)
    except (ValueError, TypeError, ImportError, AttributeError) as e:
        msg = str(e) if str(e).startswith("--impl") else f"--impl {name}: {type(e).__name__}: {e}"
        raise pytest.UsageError(msg) from None
    reason = impl.unavailable()
    if reason:
        where = f" --device {device}" if device else ""
        raise pytest.UsageError(f"--impl {impl.name}{where} cannot run here: {reason}")
    from .adapters.reference import ReferenceImpl
    reason = ReferenceImpl().unavailable()
    if reason:
        raise pytest.UsageError(f"the reference (the suite's oracle) cannot run: {reason}")
    return impl


def selected_methods(config) -> tuple[str, ...]:
    return config._vq_methods


def parametrize_golden(metafunc, argname: str, read, what: str, missing_id: str) -> None:
    """Parametrize `argname` with the cases `read()` yields for the selected methods. An unreadable golden/
    (missing, or a damaged manifest) or no case for the selected methods becomes one case `missing_id` holding
    the reason as a string, which the test fails on: never a skip, so a missing golden/ cannot read as a green
    run."""
    if argname not in metafunc.fixturenames:
        return
    try:
        cases = list(read())
    except (OSError, ValueError, KeyError) as e:
        reason = f"{what} not readable at {golden.ROOT}: {type(e).__name__}: {e}"
        metafunc.parametrize(argname, [pytest.param(reason)], ids=[missing_id])
        return
    methods = set(selected_methods(metafunc.config))
    cases = [c for c in cases if c.method in methods]
    if not cases:
        metafunc.parametrize(argname, [pytest.param(f"no {what} for the selected methods")], ids=[missing_id])
        return
    metafunc.parametrize(argname, cases, ids=[c.id for c in cases])


def device_kind(config) -> str:
    dev = config.getoption("device")
    if dev:
        return dev
    name = config._vq_impl.device_name().lower()
    return "gpu" if "gpu" in name else "cpu"


def pytest_report_header(config):
    impl = config._vq_impl
    return [f"veloxquant conformance: impl={impl.name} device={impl.device_name()} "
            f"methods={','.join(config._vq_methods)} profile={settings._current_profile}"]


# --- skip / xfail files ---------------------------------------------------------------------------------
def _load_lists(config):
    path = XFAIL_DIR / f"{config._vq_impl.name}-{device_kind(config)}.toml"
    if not path.exists():
        return path, []
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries = []
    for kind in ("skip", "xfail"):
        for e in data.get(kind, []):
            if "test" not in e or "reason" not in e:
                raise pytest.UsageError(f"{path}: every [[{kind}]] entry needs 'test' and 'reason'")
            entries.append((kind, e["test"], e["reason"]))
    return path, entries


def _short_id(nodeid: str) -> str:
    return nodeid.split("conformance/", 1)[-1]


def _id_matches(sid: str, pattern: str) -> bool:
    """`*` and `?` are wildcards; everything else is literal (test ids are full of `[`, which fnmatch
    would read as a character class)."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, sid, flags=re.DOTALL) is not None


@pytest.hookimpl(tryfirst=True)
def _unselected(config, item) -> bool:
    """Whether a --methods run leaves `item` out: a codebook no selected method reads (spec/formats.toml `tables`:
    a turboquant run has no residual codebook, a kivi run none), a test of one method's own rule (the `method`
    marker) for a method not selected, or a test parametrized by method with no selected method left in it (on a
    run of every method, an empty parameter set stays a visible skip)."""
    selected = selected_methods(config)
    params = getattr(item, "callspec", None) and item.callspec.params
    if params and "codebook" in params:
        return params["codebook"][0] not in {t for m in selected for t in spec.method_info(m)["tables"]}
    mark = item.get_closest_marker("method")
    if mark is not None:
        return mark.args[0] not in selected
    return set(selected) != set(METHODS) and any(
        m.name == "skip" and str(m.kwargs.get("reason", "")).startswith("got empty parameter set")
        for m in item.iter_markers())


def _deselect_unselected(config, items) -> None:
    drop = [it for it in items if _unselected(config, it)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        gone = set(map(id, drop))
        items[:] = [it for it in items if id(it) not in gone]


def pytest_collection_modifyitems(session, config, items):
    _deselect_unselected(config, items)
    path, entries = _load_lists(config)
    used = [False] * len(entries)
    for item in items:
        sid = _short_id(item.nodeid)
        for i, (kind, pattern, reason) in enumerate(entries):
            if _id_matches(sid, pattern):
                used[i] = True
                if kind == "skip":
                    item.add_marker(pytest.mark.skip(reason=f"{path.name}: {reason}"))
                else:
                    item.add_marker(pytest.mark.xfail(reason=f"{path.name}: {reason}", strict=False))
                break
    config._vq_unmatched = [(k, p) for (k, p, _), u in zip(entries, used) if not u]
    if config.getoption("rules_report", None):
        _map_rules(config, items)
    for kind, pattern in config._vq_unmatched:
        warnings.warn(UnmatchedXfailWarning(f"{path.name}: [[{kind}]] entry {pattern!r} matches no collected test"))


# --- per-rule report (spec/rules.toml; conformance/rules.py) ------------------------------------------
def _map_rules(config, items):
    from . import rules
    config._vq_rules = rules.load()
    config._vq_item_rules = {}
    config._vq_outcomes = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = dict(callspec.params) if callspec else {}
        param = params.get("case", params.get("att_case"))
        config._vq_item_rules[item.nodeid] = rules.rules_of_item(item.nodeid, param, config._vq_rules)


def pytest_runtest_logreport(report):
    config = getattr(report, "config", None) or _CONFIG.get("config")
    if config is None or not hasattr(config, "_vq_outcomes"):
        return
    if report.when == "call" or report.outcome != "passed":
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        if report.when != "call" and report.failed:
            outcome = "error"
        config._vq_outcomes.setdefault(report.nodeid, outcome)
        if report.when == "call":
            config._vq_outcomes[report.nodeid] = outcome


_CONFIG: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    _CONFIG["config"] = session.config


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    path = config.getoption("rules_report", None)
    if not path or not hasattr(config, "_vq_rules"):
        return
    import json
    from . import rules
    v = rules.verdicts(config._vq_rules, config._vq_outcomes, config._vq_item_rules)
    counts = {k: sum(r["status"] == k for r in v.values()) for k in ("passed", "failed", "not exercised")}
    with open(path, "w") as f:
        json.dump({"schema": "veloxquant-rules-report/1", "impl": config._vq_impl.name, "summary": counts,
                   "rules": v}, f, indent=1, ensure_ascii=False)
    config._vq_rules_summary = counts


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if getattr(config, "_vq_rules_summary", None):
        c = config._vq_rules_summary
        terminalreporter.write_line(f"spec rules: {c['passed']} passed, {c['failed']} failed, "
                                    f"{c['not exercised']} not exercised (--rules-report)")
    for kind, pattern in getattr(config, "_vq_unmatched", []):
        terminalreporter.write_line(f"WARNING: {kind} entry {pattern!r} matched no collected test", yellow=True)


# --- fixtures -------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def impl(pytestconfig):
    return pytestconfig._vq_impl   # checked in pytest_configure: an impl that cannot run is a usage error


@pytest.fixture(scope="session")
def ref():
    from .adapters.reference import ReferenceImpl
    r = ReferenceImpl()
    reason = r.unavailable()
    if reason:   # never a skip: differential tests without their oracle would pass by not running
        pytest.fail(f"the reference (oracle) is unavailable: {reason}", pytrace=False)
    return r


@pytest.fixture
def other(impl, ref):
    """The implementation compared against the reference; differential tests of the reference itself
    would compare it with itself and could not fail, so they skip."""
    if impl.name == "reference":
        pytest.skip("--impl reference: differential tests compare an implementation with the reference")
    return impl


TAG_KEYS = ("method", "bits", "dtype")


class Tally:
    def __init__(self):
        self.n = 0

    def case(self, k: int = 1):
        self.n += k


@pytest.fixture(autouse=True)
def _tags(request):
    """method/bits/dtype (from the parametrization) and the number of cases run, for the report table."""
    callspec = getattr(request.node, "callspec", None)
    params = dict(callspec.params) if callspec else {}
    for key in TAG_KEYS:
        if key in params:
            request.node.user_properties.append((key, params[key]))
    t = Tally()
    request.node._vq_tally = t
    yield
    request.node.user_properties.append(("cases", t.n or 1))


@pytest.fixture
def tally(request):
    return request.node._vq_tally


@pytest.fixture
def methods_ok(impl, pytestconfig, request):
    """Skip when the method is not claimed by the implementation or not selected (--methods); tags the test
    with it (a test written for one method, not parametrized by it, then reports under that method)."""
    def need(method):
        if not any(k == "method" for k, _ in request.node.user_properties):
            request.node.user_properties.append(("method", method))
        if method not in selected_methods(pytestconfig):
            pytest.skip(f"{method} not selected (--methods {','.join(selected_methods(pytestconfig))})")
        if not impl.supports(method):
            pytest.skip(f"{impl.name} does not support {method}")
    return need
