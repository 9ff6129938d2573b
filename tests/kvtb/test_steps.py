from kvtb import steps
from kvtb.steps import Step


def test_every_step_has_one_name_and_the_paper_numbers():
    assert [int(s) for s in Step] == list(range(1, 9))
    assert set(steps.NAMES) == set(Step)
    assert len(set(steps.NAMES.values())) == 8


def test_name_of_an_unknown_step_says_its_number():
    assert steps.name(6) == steps.NAMES[Step.GET]
    assert steps.name(9) == "step 9"
