"""scale.settings: a profile installed in this process is what the processes it starts inherit; back in
real time, nothing of it is left for them."""
from __future__ import annotations

import os

from scale import dilation
from scale import settings as scale_settings


def test_real_time_leaves_no_profile_for_child_processes():
    try:
        _, pacer = scale_settings.install_from(scale_settings.ScaleSettings("polaris-a100", 2.0))
        assert pacer is not None and os.environ["KVTB_SCALE_PROFILE"] == "polaris-a100"
    finally:
        scale_settings.install_from(scale_settings.ScaleSettings())
    assert not [k for k in os.environ if k.startswith("KVTB_SCALE_")]
    assert dilation.current() is None and scale_settings.current_profile() is None
