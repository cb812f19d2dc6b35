"""The segmenter (class and init args) and the OpenCC conversion are resume-fixed settings."""

from __future__ import annotations

import pytest

from mlm_adapt.training.resume import resume_conflicts

SPEC = {"class_path": "my.Segmenter", "init_args": {"max_chars": 3}}


@pytest.mark.parametrize(
    ("saved", "current", "conflict"),
    [
        (
            {"segmentation.segmenter": "rjieba"},
            {"segmentation.segmenter": "thulac"},
            "data.segmentation.segmenter: 'rjieba' -> 'thulac'",
        ),
        (
            {"segmentation.segmenter": SPEC},
            {"segmentation.segmenter": {**SPEC, "init_args": {"max_chars": 2}}},
            "max_chars: 3 -> 2",
        ),
        (
            {"segmentation.segmenter": SPEC},
            {"segmentation.segmenter": {**SPEC, "class_path": "my.Other"}},
            "'my.Segmenter' -> 'my.O",
        ),
        (
            {"segmentation.opencc": None},
            {"segmentation.opencc": "t2s"},
            "data.segmentation.opencc: None -> 't2s'",
        ),
        ({"segmentation.hmm": False}, {"segmentation.hmm": True}, "data.segmentation.hmm: False -> True"),
    ],
    ids=["builtin-name", "init-arg", "class-path", "opencc", "hmm"],
)
def test_changed_segmentation_is_a_resume_conflict(saved, current, conflict):
    conflicts = resume_conflicts({"data": saved}, {"data": current})
    assert len(conflicts) == 1 and conflict in conflicts[0]


def test_same_segmentation_and_a_record_without_opencc_resume():
    same = {"data": {"segmentation.segmenter": dict(SPEC)}}
    assert resume_conflicts({"data": {"segmentation.segmenter": SPEC}}, same) == []
    without_opencc = {"data": {"segmentation.segmenter": "rjieba"}}  # what one side lacks is not compared
    current = {"data": {"segmentation.segmenter": "rjieba", "segmentation.opencc": "t2s"}}
    assert resume_conflicts(without_opencc, current) == []
