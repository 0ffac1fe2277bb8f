"""Parallelism shape: parser, validation, volumes; shape-aware placement and its rank map."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.dispatch.shape import PRESETS, Shape, parse_traffic
from bandpilot.errors import PlacementError


def test_parse_text_and_mapping_agree():
    a = Shape.parse("tp=8,pp=4,dp=16,ep=8")
    b = Shape.parse({"tp": 8, "pp": 4, "dp": 16, "ep": 8})
    assert a == b and a.k == 512 and str(a) == "tp=8,pp=4,dp=16,ep=8"
    assert Shape.parse(a.to_dict()) == a


def test_traffic_suffixes_and_volumes():
    s = Shape.parse({"tp": 4, "dp": 2, "traffic": parse_traffic("tp=1GiB,dp=2e9"), "compute_ms": 10})
    vol, cms = s.volumes()
    assert vol == {"tp": 2.0**30, "dp": 2e9} and cms == 10.0  # pp=1, ep=1: no traffic on them
    vol, cms = Shape.parse("tp=8,pp=2,dp=4,model=llama-70b").volumes()
    assert set(vol) == {"tp", "pp", "dp"} and all(v > 0 for v in vol.values()) and cms > 0
    # a bigger TP degree moves fewer gradient bytes per GPU on DP
    assert Shape.parse("tp=8,dp=4").volumes()[0]["dp"] < Shape.parse("tp=2,dp=4").volumes()[0]["dp"]


@pytest.mark.parametrize("bad,msg", [
    ("tp=0,dp=2", "shape.tp must be an integer"),
    ("tp=3,dp=2,ep=4", "must divide tp*dp=6"),
    ("tp=2,xx=1", "unknown key 'xx'"),
    ("tp=2,tp=4", "tp given twice"),
    ("tp", "is not KEY=VALUE"),
    ("", "shape is empty"),
    ("tp=2,model=gpt-9", "not a preset"),
    ("tp=2.5", "positive integer"),
    ({"tp": True}, "shape.tp must be an integer"),
    ({"tp": 2, "traffic": {"zz": 1}}, "unknown axes"),
    ({"tp": 2, "traffic": {"tp": -1}}, "finite number of bytes"),
    ({"tp": 2, "compute_ms": float("nan")}, "compute_ms must be"),
    (7, "must be 'tp=T"),
])
def test_bad_shapes_one_line(bad, msg):
    with pytest.raises(PlacementError) as e:
        Shape.parse(bad)
    assert msg in str(e.value) and "\n" not in str(e.value) and e.value.reason == "invalid_request"


def test_check_k():
    with pytest.raises(PlacementError, match="= 8 GPUs, but k=6"):
        Shape.parse("tp=2,dp=4").check_k(6)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="tpde=,0123456789 .x-_kmgiGB", max_size=40))
def test_parser_fuzz_text(text):
    try:
        s = Shape.parse(text)
    except PlacementError as e:
        assert "\n" not in str(e)
        return
    assert s.k == s.tp * s.pp * s.dp and (s.tp * s.dp) % s.ep == 0
    assert Shape.parse(str(s)) == s


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["tp", "pp", "dp", "ep", "traffic", "compute_ms", "model", "zz"]),
                       st.one_of(st.integers(-3, 70000), st.floats(allow_nan=True), st.none(), st.booleans(),
                                 st.text(max_size=5), st.sampled_from(sorted(PRESETS)),
                                 st.dictionaries(st.sampled_from(["tp", "dp", "q"]), st.floats(-1, 1e12))),
                       max_size=6))
def test_parser_fuzz_mapping(doc):
    try:
        s = Shape.parse(doc)
    except PlacementError as e:
        assert "\n" not in str(e)
        return
    vol, cms = s.volumes()
    assert cms >= 0 and all(v >= 0 for v in vol.values())
