"""The segmenter (class and init args) and the OpenCC conversion are resume-fixed settings."""

from __future__ import annotations

import pytest

from mlm_adapt.training.resume import resume_conflicts

SPEC = {"class_path": "my.Segmenter", "init_args": {"max_chars": 3}}


@pytest.mark.parametrize(
    ("saved", "current", "conflict"),
    [
        ({"segmenter": "rjieba"}, {"segmenter": "thulac"}, "data.segmenter: 'rjieba' -> 'thulac'"),
        ({"segmenter": SPEC}, {"segmenter": {**SPEC, "init_args": {"max_chars": 2}}}, "max_chars: 3 -> 2"),
        ({"segmenter": SPEC}, {"segmenter": {**SPEC, "class_path": "my.Other"}}, "'my.Segmenter' -> 'my.O"),
        ({"opencc": None}, {"opencc": "t2s"}, "data.opencc: None -> 't2s'"),
        ({"hmm": False}, {"hmm": True}, "data.hmm: False -> True"),
    ],
    ids=["builtin-name", "init-arg", "class-path", "opencc", "hmm"],
)
def test_changed_segmentation_is_a_resume_conflict(saved, current, conflict):
    conflicts = resume_conflicts({"data": saved}, {"data": current})
    assert len(conflicts) == 1 and conflict in conflicts[0]


def test_same_segmentation_and_old_checkpoints_without_it_resume():
    assert resume_conflicts({"data": {"segmenter": SPEC}}, {"data": {"segmenter": dict(SPEC)}}) == []
    old_checkpoint = {"data": {"segmenter": "rjieba"}}  # written before data.opencc existed
    assert resume_conflicts(old_checkpoint, {"data": {"segmenter": "rjieba", "opencc": "t2s"}}) == []
